//go:build linux

package template

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// fakeBuild makes a finished build directory of name, as a build leaves it
// just before install: rootfs (with /version holding version) and
// template.json.
func fakeBuild(t *testing.T, r *Registry, name, version string) string {
	t.Helper()
	if err := os.MkdirAll(r.Dir(), 0o755); err != nil {
		t.Fatal(err)
	}
	tmp, err := os.MkdirTemp(r.Dir(), ".build-"+name+"-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(tmp, rootfsDir), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tmp, rootfsDir, "version"), []byte(version), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := writeMetadata(tmp, metadata{Name: name, Version: version}); err != nil {
		t.Fatal(err)
	}
	return tmp
}

// installFake installs a fake build of name and returns the template Get
// then gives.
func installFake(t *testing.T, r *Registry, name, version string) Template {
	t.Helper()
	if err := r.install(name, fakeBuild(t, r, name, version), newReporter(nil, name)); err != nil {
		t.Fatalf("install %s %s: %v", name, version, err)
	}
	got, err := r.Get(name)
	if err != nil || got.Version != version {
		t.Fatalf("after installing %s: Get(%s) = %+v, %v", version, name, got, err)
	}
	return got
}

// assertVersion checks that rootfs still exists and is version's.
func assertVersion(t *testing.T, rootfs, version string) {
	t.Helper()
	if b, err := os.ReadFile(filepath.Join(rootfs, "version")); err != nil || string(b) != version {
		t.Errorf("%s: version %q, %v; want %q", rootfs, b, err, version)
	}
}

func assertGone(t *testing.T, path string) {
	t.Helper()
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s still there (%v)", path, err)
	}
}

func TestInstallKeepsVersions(t *testing.T) {
	r := NewRegistry(t.TempDir())
	v1 := installFake(t, r, "web", "v1")
	v2 := installFake(t, r, "web", "v2")

	realDir, err := filepath.EvalSymlinks(r.Dir())
	if err != nil {
		t.Fatal(err)
	}
	for _, tp := range []Template{v1, v2} {
		if !strings.HasPrefix(tp.Rootfs, filepath.Join(realDir, versionsDir, "web@")) || filepath.Base(tp.Rootfs) != rootfsDir {
			t.Errorf("Rootfs %q is not a version's rootfs under %s", tp.Rootfs, filepath.Join(realDir, versionsDir))
		}
		if p, err := filepath.EvalSymlinks(tp.Rootfs); err != nil || p != tp.Rootfs {
			t.Errorf("Rootfs %q has symlinks (%q, %v)", tp.Rootfs, p, err)
		}
	}
	if v1.Rootfs == v2.Rootfs {
		t.Fatalf("two builds share %s", v1.Rootfs)
	}
	// The old version is still whole: sandboxes using it keep working.
	assertVersion(t, v1.Rootfs, "v1")
	assertVersion(t, v2.Rootfs, "v2")
	// The name is a relative link to the current version.
	target, err := os.Readlink(filepath.Join(r.Dir(), "web"))
	if err != nil || target != filepath.Join(versionsDir, filepath.Base(filepath.Dir(v2.Rootfs))) {
		t.Errorf("web -> %q, %v; want .v/<v2>", target, err)
	}
	if left := entries(t, r.Dir()); !reflect.DeepEqual(left, []string{".v", "web"}) {
		t.Errorf("registry entries %v, want [.v web]", left)
	}
	// A version directory reads as the template it is.
	if got, err := readTemplate("web", filepath.Dir(v1.Rootfs)); err != nil || !reflect.DeepEqual(got, v1) {
		t.Errorf("readTemplate(v1) = %+v, %v; want %+v", got, err, v1)
	}
}

func TestGetDanglingLink(t *testing.T) {
	r := NewRegistry(t.TempDir())
	if err := os.Symlink(filepath.Join(versionsDir, "web@gone"), filepath.Join(r.Dir(), "web")); err != nil {
		t.Fatal(err)
	}
	_, err := r.Get("web")
	assertNotFound(t, err)
	if list, err := r.List(); err != nil || len(list) != 0 {
		t.Errorf("List = %v, %v; want empty", list, err)
	}
}

func TestListIncludesVersioned(t *testing.T) {
	r := NewRegistry(t.TempDir())
	installFake(t, r, "web", "v1")
	installFake(t, r, "web", "v2")
	fakeTemplate(t, r.Dir(), "legacy", metadata{Version: "old"})
	installFake(t, r, "api", "a1")
	// Leftovers a crash may leave, and the lock files: none is a template.
	fakeBuild(t, r, "web", "half")
	if err := os.Symlink(filepath.Join(versionsDir, "web@x"), filepath.Join(r.Dir(), ".link-web-1")); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(r.Dir(), ".lock-web"), nil, 0o644)
	os.MkdirAll(filepath.Join(r.Dir(), ".layers"), 0o700)

	list, err := r.List()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, tp := range list {
		got = append(got, tp.Name+"="+tp.Version)
	}
	if want := []string{"api=a1", "legacy=old", "web=v2"}; !reflect.DeepEqual(got, want) {
		t.Errorf("List = %v, want %v", got, want)
	}
}

func TestLegacyDirMigrates(t *testing.T) {
	r := NewRegistry(t.TempDir())
	fakeTemplate(t, r.Dir(), "web", metadata{Version: "old"})
	os.WriteFile(filepath.Join(r.Dir(), "web", rootfsDir, "version"), []byte("old"), 0o644)
	old, err := r.Get("web")
	if err != nil || old.Version != "old" || old.Rootfs != filepath.Join(r.Dir(), "web", rootfsDir) {
		t.Fatalf("Get of the older layout = %+v, %v", old, err)
	}

	cur := installFake(t, r, "web", "v2")
	assertVersion(t, cur.Rootfs, "v2")
	fi, err := os.Lstat(filepath.Join(r.Dir(), "web"))
	if err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("web is not a link after the build: %v, %v", fi, err)
	}
	legacy, _ := filepath.Glob(filepath.Join(r.Dir(), versionsDir, "web@legacy-*"))
	if len(legacy) != 1 {
		t.Fatalf("legacy versions: %v, want one", legacy)
	}
	assertVersion(t, filepath.Join(legacy[0], rootfsDir), "old")

	// The moved directory is a version like the others.
	removed, err := r.Prune(func(string) bool { return false })
	if err != nil || !reflect.DeepEqual(removed, legacy) {
		t.Errorf("Prune = %v, %v; want %v", removed, err, legacy)
	}
	if got, err := r.Get("web"); err != nil || got.Version != "v2" {
		t.Errorf("after Prune: Get = %+v, %v", got, err)
	}
}

func TestPrune(t *testing.T) {
	r := NewRegistry(t.TempDir())
	if removed, err := r.Prune(func(string) bool { return false }); err != nil || len(removed) != 0 {
		t.Errorf("Prune of an empty registry = %v, %v", removed, err)
	}
	v1 := installFake(t, r, "web", "v1")
	v2 := installFake(t, r, "web", "v2")
	v3 := installFake(t, r, "web", "v3")
	gone := installFake(t, r, "gone", "g1")
	if err := os.Remove(filepath.Join(r.Dir(), "gone")); err != nil {
		t.Fatal(err)
	}
	// Not versions: left alone.
	stray := filepath.Join(r.Dir(), versionsDir, "README")
	os.WriteFile(stray, []byte("x"), 0o644)

	var asked []string
	removed, err := r.Prune(func(rootfs string) bool {
		asked = append(asked, rootfs)
		return rootfs == v1.Rootfs
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(asked)
	if want := sorted(v1.Rootfs, v2.Rootfs, gone.Rootfs); !reflect.DeepEqual(asked, want) {
		t.Errorf("inUse asked about %v, want %v (never the current version)", asked, want)
	}
	want := []string{versionDirOf(r, gone), versionDirOf(r, v2)}
	if !reflect.DeepEqual(removed, want) {
		t.Errorf("removed %v, want %v", removed, want)
	}
	assertVersion(t, v1.Rootfs, "v1") // in use
	assertVersion(t, v3.Rootfs, "v3") // current
	assertGone(t, v2.Rootfs)
	assertGone(t, gone.Rootfs)
	if _, err := os.Stat(stray); err != nil {
		t.Errorf("Prune removed %s: %v", stray, err)
	}

	// Once nothing uses v1, it goes too; the current version never does.
	removed, err = r.Prune(func(string) bool { return false })
	if err != nil || !reflect.DeepEqual(removed, []string{versionDirOf(r, v1)}) {
		t.Errorf("second Prune = %v, %v", removed, err)
	}
	if got, err := r.Get("web"); err != nil || got.Rootfs != v3.Rootfs {
		t.Errorf("after Prune: Get = %+v, %v", got, err)
	}
	assertVersion(t, v3.Rootfs, "v3")

	if _, err := r.Prune(nil); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("Prune(nil) = %v, want ErrInvalid", err)
	}
}

func TestPruneSkipsNameBeingBuilt(t *testing.T) {
	r := NewRegistry(t.TempDir())
	v1 := installFake(t, r, "web", "v1")
	installFake(t, r, "web", "v2")
	a1 := installFake(t, r, "api", "a1")
	installFake(t, r, "api", "a2")

	lock, err := r.lock(context.Background(), "web", newReporter(nil, "web"))
	if err != nil {
		t.Fatal(err)
	}
	removed, err := r.Prune(func(string) bool { return false })
	if err != nil || !reflect.DeepEqual(removed, []string{versionDirOf(r, a1)}) {
		t.Errorf("Prune while web's build lock is held = %v, %v; want only api's old version", removed, err)
	}
	assertVersion(t, v1.Rootfs, "v1")

	lock.unlock()
	removed, err = r.Prune(func(string) bool { return false })
	if err != nil || !reflect.DeepEqual(removed, []string{versionDirOf(r, v1)}) {
		t.Errorf("Prune after unlock = %v, %v", removed, err)
	}
}

// TestInstallCheckFails: a version the check refuses is removed and the
// current version stays.
func TestInstallCheckFails(t *testing.T) {
	r := NewRegistry(t.TempDir())
	v1 := installFake(t, r, "web", "v1")
	before := entries(t, filepath.Join(r.Dir(), versionsDir))
	boom := errors.New("boom")
	var seen string
	tmp := fakeBuild(t, r, "web", "v2")
	_, err := r.installChecked("web", tmp, newReporter(nil, "web"), func(vdir string) error {
		seen = vdir
		assertVersion(t, filepath.Join(vdir, rootfsDir), "v2")
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("installChecked = %v, want the check's error", err)
	}
	if filepath.Dir(seen) != filepath.Join(r.Dir(), versionsDir) {
		t.Errorf("check saw %q, not a directory in .v", seen)
	}
	assertGone(t, seen)
	assertGone(t, tmp)
	if after := entries(t, filepath.Join(r.Dir(), versionsDir)); !reflect.DeepEqual(after, before) {
		t.Errorf("versions %v after a refused build, want %v", after, before)
	}
	if got, err := r.Get("web"); err != nil || !reflect.DeepEqual(got, v1) {
		t.Errorf("Get = %+v, %v; want v1 %+v", got, err, v1)
	}
}

// versionDirOf returns the version directory of tp as Prune names it.
func versionDirOf(r *Registry, tp Template) string {
	return filepath.Join(r.Dir(), versionsDir, filepath.Base(filepath.Dir(tp.Rootfs)))
}

func sorted(s ...string) []string {
	slices.Sort(s)
	return s
}

func TestMigrate(t *testing.T) {
	r := NewRegistry(t.TempDir())
	fakeTemplate(t, r.Dir(), "web", metadata{Version: "old"})
	os.WriteFile(filepath.Join(r.Dir(), "web", rootfsDir, "version"), []byte("old"), 0o644)
	os.Mkdir(filepath.Join(r.Dir(), "notatemplate"), 0o755)
	installFake(t, r, "api", "v1")

	migrated, err := r.Migrate()
	if err != nil || !reflect.DeepEqual(migrated, []string{"web"}) {
		t.Fatalf("Migrate = %v, %v; want [web]", migrated, err)
	}
	got, err := r.Get("web")
	if err != nil || got.Version != "old" || filepath.Base(filepath.Dir(got.Rootfs))[:len("web@legacy-")] != "web@legacy-" {
		t.Fatalf("after Migrate: Get = %+v, %v", got, err)
	}
	assertVersion(t, got.Rootfs, "old")
	// The recorded path stays that version's after a rebuild.
	installFake(t, r, "web", "v2")
	assertVersion(t, got.Rootfs, "old")
	if again, err := r.Migrate(); err != nil || len(again) != 0 {
		t.Fatalf("second Migrate = %v, %v; want nothing", again, err)
	}
	if _, err := os.Stat(filepath.Join(r.Dir(), "notatemplate")); err != nil {
		t.Fatalf("a directory that is not a template was touched: %v", err)
	}
}
