package template

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// fakeTemplate writes dir/name the way a finished build leaves it.
func fakeTemplate(t *testing.T, dir, name string, m metadata) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, name, rootfsDir, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name, metadataFile), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func assertNotFound(t *testing.T, err error) {
	t.Helper()
	if err == nil {
		t.Fatal("want an error, got nil")
	}
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("error %v does not wrap ErrNotFound", err)
	}
	if c := errdefs.Code(err); c != "template_not_found" {
		t.Errorf("error %v has code %q, want template_not_found", err, c)
	}
}

func TestGetList(t *testing.T) {
	dir := t.TempDir()
	built := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	fakeTemplate(t, dir, "base", metadata{
		Name: "base", Version: "bookworm-20260102T030405Z", SizeBytes: 12345,
		BuiltAt: built, Env: []string{"LANG=C.UTF-8"},
	})
	fakeTemplate(t, dir, "alpha", metadata{Name: "alpha", Version: "v1", BuiltAt: built})
	// An unfinished build: rootfs but no template.json.
	if err := os.MkdirAll(filepath.Join(dir, "half", rootfsDir), 0o755); err != nil {
		t.Fatal(err)
	}
	// A build in progress and a lock file.
	fakeTemplate(t, dir, ".build-base-123", metadata{Name: "base", Version: "new"})
	if err := os.WriteFile(filepath.Join(dir, ".lock-base"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// Metadata without a rootfs.
	if err := os.MkdirAll(filepath.Join(dir, "norootfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "norootfs", metadataFile), []byte(`{"version":"x"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	// A stray file.
	if err := os.WriteFile(filepath.Join(dir, "README"), []byte("hi"), 0o644); err != nil {
		t.Fatal(err)
	}

	r := NewRegistry(dir)
	got, err := r.Get("base")
	if err != nil {
		t.Fatal(err)
	}
	realDir, err := filepath.EvalSymlinks(dir) // Rootfs has no symlinks
	if err != nil {
		t.Fatal(err)
	}
	want := Template{
		Name: "base", Version: "bookworm-20260102T030405Z",
		Rootfs: filepath.Join(realDir, "base", "rootfs"), SizeBytes: 12345,
		BuiltAt: built, Env: []string{"LANG=C.UTF-8"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Get(base) = %+v, want %+v", got, want)
	}
	if !filepath.IsAbs(got.Rootfs) {
		t.Errorf("Rootfs %q is not absolute", got.Rootfs)
	}

	for _, name := range []string{"half", "norootfs", "nope", ".build-base-123", ".lock-base", "README", "", "..", "../base", "base/rootfs", "."} {
		_, err := r.Get(name)
		assertNotFound(t, err)
	}

	list, err := r.List()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tp := range list {
		names = append(names, tp.Name)
	}
	if !reflect.DeepEqual(names, []string{"alpha", "base"}) {
		t.Errorf("List names = %v, want [alpha base]", names)
	}
}

func TestRelativeDirIsMadeAbsolute(t *testing.T) {
	dir := t.TempDir()
	fakeTemplate(t, dir, "base", metadata{Version: "v"})
	t.Chdir(dir)
	r := NewRegistry(".")
	got, err := r.Get("base")
	if err != nil {
		t.Fatal(err)
	}
	if !filepath.IsAbs(got.Rootfs) || !strings.HasSuffix(got.Rootfs, "/base/rootfs") {
		t.Errorf("Rootfs = %q", got.Rootfs)
	}
}

func TestListMissingDir(t *testing.T) {
	r := NewRegistry(filepath.Join(t.TempDir(), "does-not-exist"))
	list, err := r.List()
	if err != nil || len(list) != 0 {
		t.Fatalf("List = %v, %v; want empty, nil", list, err)
	}
	_, err = r.Get("base")
	assertNotFound(t, err)
}

func TestCorruptMetadata(t *testing.T) {
	dir := t.TempDir()
	fakeTemplate(t, dir, "base", metadata{Version: "v"})
	if err := os.WriteFile(filepath.Join(dir, "base", metadataFile), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := NewRegistry(dir)
	if _, err := r.Get("base"); err == nil || errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Get on corrupt metadata = %v, want a non-not-found error", err)
	}
	if list, err := r.List(); err != nil || len(list) != 0 {
		t.Errorf("List = %v, %v; want empty, nil", list, err)
	}
}

func TestBuiltinsAndUnknownBuild(t *testing.T) {
	r := NewRegistry(t.TempDir())
	if got := r.Builtins(); !reflect.DeepEqual(got, []string{"base", "claude", "code-interpreter-v1", "codex", "desktop", "interpreter", "node", "python"}) {
		t.Errorf("Builtins = %v", got)
	}
	_, err := r.Build(context.Background(), "nope", nil)
	assertNotFound(t, err)
	_, err = r.EnsureBuilt(context.Background(), "nope", nil)
	assertNotFound(t, err)
	_, err = r.Build(context.Background(), "../base", nil)
	assertNotFound(t, err)
}

func TestEnsureBuiltUsesExisting(t *testing.T) {
	dir := t.TempDir()
	fakeTemplate(t, dir, "base", metadata{Version: "bookworm-1"})
	r := NewRegistry(dir)
	r.Debootstrap = "/nonexistent/debootstrap" // a build would fail
	got, err := r.EnsureBuilt(context.Background(), "base", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.Version != "bookworm-1" {
		t.Errorf("Version = %q", got.Version)
	}
}

func TestWriteMetadataRoundTrip(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, rootfsDir), 0o755); err != nil {
		t.Fatal(err)
	}
	at := time.Now().UTC().Truncate(time.Second)
	versions := map[string]string{"python": "3.11.2", "debian": "12.12"}
	if err := writeMetadata(dir, metadata{Name: "x", Version: "v", SizeBytes: 7, BuiltAt: at, Env: []string{"A=b"}, Versions: versions}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, metadataFile+".tmp")); !os.IsNotExist(err) {
		t.Errorf("temporary metadata file left behind: %v", err)
	}
	// Read it back through a registry whose template is dir.
	r := NewRegistry(filepath.Dir(dir))
	got, err := r.Get(filepath.Base(dir))
	if err != nil {
		t.Fatal(err)
	}
	if got.Version != "v" || got.SizeBytes != 7 || !got.BuiltAt.Equal(at) || !reflect.DeepEqual(got.Env, []string{"A=b"}) ||
		!reflect.DeepEqual(got.Versions, versions) {
		t.Errorf("round trip: %+v", got)
	}
}

// TestRecipeChanged: a built-in whose current version was built from
// another package list or at another revision than its recipe's is stale
// (EnsureBuilt builds it again); the same list and revision, a version
// that recorded no list, and a template with no recipe are not.
func TestRecipeChanged(t *testing.T) {
	dir := t.TempDir()
	revision := 0
	put := func(name string, pkgs []string) {
		t.Helper()
		vdir := filepath.Join(dir, ".v", name+"@sha256-00")
		if err := os.MkdirAll(vdir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := writeMetadata(vdir, metadata{Name: name, Version: "v1", Packages: pkgs, Revision: revision}); err != nil {
			t.Fatal(err)
		}
		os.Remove(filepath.Join(dir, name))
		if err := os.Symlink(filepath.Join(".v", name+"@sha256-00"), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	r := NewRegistry(dir)
	put("base", builtins["base"].allPackages())
	if r.recipeChanged("base") {
		t.Fatal("base built from its recipe's packages is taken as stale")
	}
	put("base", basePackages) // built before base gained git and sudo
	if !r.recipeChanged("base") {
		t.Fatal("base built from an older package list is taken as current")
	}
	put("base", nil)
	if r.recipeChanged("base") {
		t.Fatal("a version that recorded no packages is taken as stale")
	}
	put("mine", []string{"x"})
	if r.recipeChanged("mine") {
		t.Fatal("a template with no recipe is taken as stale")
	}
	// desktop's lizard-desktop changed (x11vnc -threads) with the same
	// packages: a version built before, at revision 0, is stale.
	put("desktop", builtins["desktop"].allPackages())
	if !r.recipeChanged("desktop") {
		t.Fatal("desktop built at revision 0 is taken as current")
	}
	revision = desktopRevision
	put("desktop", builtins["desktop"].allPackages())
	if r.recipeChanged("desktop") {
		t.Fatalf("desktop built at its recipe's revision %d is taken as stale", desktopRevision)
	}
}
