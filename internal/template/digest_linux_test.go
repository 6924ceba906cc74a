//go:build linux

package template

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// digestTree makes a small rootfs with a file of every kind a manifest
// records (but devices, which need root).
func digestTree(t *testing.T, root string) {
	t.Helper()
	for _, d := range []string{"etc", "usr/bin", "tmp"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(filepath.Join(root, "tmp"), os.ModeSticky|0o777)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(root, "etc", "hostname"), []byte("box\n"), 0o644))
	must(os.WriteFile(filepath.Join(root, "usr/bin", "tool"), []byte("#!/bin/sh\necho hi\n"), 0o755))
	must(os.Link(filepath.Join(root, "usr/bin", "tool"), filepath.Join(root, "usr/bin", "tool2")))
	must(os.Symlink("usr/bin", filepath.Join(root, "bin")))
	must(os.WriteFile(filepath.Join(root, "name with\nnewline"), nil, 0o600))
}

func TestManifestDeterministic(t *testing.T) {
	a, b := filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b")
	digestTree(t, a)
	digestTree(t, b)
	// Times are not content.
	old := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	os.Chtimes(filepath.Join(b, "etc", "hostname"), old, old)
	ma, err := manifestOf(a)
	if err != nil {
		t.Fatal(err)
	}
	mb, err := manifestOf(b)
	if err != nil {
		t.Fatal(err)
	}
	if string(ma) != string(mb) {
		t.Fatalf("two trees of the same bits differ:\n%s\n---\n%s", ma, mb)
	}
	for _, want := range []string{
		manifestHeader + "\n",
		`d 1777 `,
		`l 0000 ` + "", // links carry no mode
		`"usr/bin"`,
		`"name with\nnewline"`,
	} {
		if !strings.Contains(string(ma), want) {
			t.Errorf("manifest lacks %q:\n%s", want, ma)
		}
	}
	// The hard link is listed with the same hash as its other name.
	var sums []string
	for _, l := range strings.Split(string(ma), "\n") {
		if strings.HasSuffix(l, `"usr/bin/tool"`) || strings.HasSuffix(l, `"usr/bin/tool2"`) {
			sums = append(sums, strings.Fields(l)[4])
		}
	}
	if len(sums) != 2 || sums[0] != sums[1] {
		t.Errorf("hard links hashed %v", sums)
	}
}

// TestManifestSeesChanges: every kind of change to a tree changes its
// manifest.
func TestManifestSeesChanges(t *testing.T) {
	changes := map[string]func(root string) error{
		"content": func(r string) error { return os.WriteFile(filepath.Join(r, "etc", "hostname"), []byte("bax\n"), 0o644) },
		"mode":    func(r string) error { return os.Chmod(filepath.Join(r, "usr/bin", "tool"), 0o700) },
		"link target": func(r string) error {
			os.Remove(filepath.Join(r, "bin"))
			return os.Symlink("/usr/bin", filepath.Join(r, "bin"))
		},
		"new file": func(r string) error { return os.WriteFile(filepath.Join(r, "etc", "new"), nil, 0o644) },
		"removed":  func(r string) error { return os.Remove(filepath.Join(r, "usr/bin", "tool2")) },
		"owner":    func(r string) error { return os.Lchown(filepath.Join(r, "etc", "hostname"), 1000, 1000) },
	}
	base := filepath.Join(t.TempDir(), "base")
	digestTree(t, base)
	want, err := manifestOf(base)
	if err != nil {
		t.Fatal(err)
	}
	for name, change := range changes {
		t.Run(name, func(t *testing.T) {
			if name == "owner" && os.Geteuid() != 0 {
				t.Skip("chown needs root")
			}
			root := filepath.Join(t.TempDir(), "r")
			digestTree(t, root)
			if err := change(root); err != nil {
				t.Fatal(err)
			}
			got, err := manifestOf(root)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) == string(want) {
				t.Errorf("manifest unchanged after a change of %s", name)
			}
		})
	}
}

func TestDigestCoversConfig(t *testing.T) {
	man := []byte(manifestHeader + "\n")
	a := digestOf(man, metadata{Name: "a", Version: "1", BuiltAt: time.Now(), Env: []string{"A=1"}})
	b := digestOf(man, metadata{Name: "b", Version: "2", Env: []string{"A=1"}})
	if a != b {
		t.Errorf("name, version label and build time changed the digest: %s %s", a, b)
	}
	if !validDigest(a) {
		t.Errorf("digest %q is not sha256:<64 hex>", a)
	}
	for _, m := range []metadata{
		{Env: []string{"A=2"}}, {Env: []string{"A=1"}, User: "user"}, {Env: []string{"A=1"}, Workdir: "/w"},
		{Env: []string{"A=1"}, Cmd: []string{"x"}}, {Env: []string{"A=1"}, ReadyCommand: []string{"true"}},
	} {
		if digestOf(man, m) == a {
			t.Errorf("config %+v gives the digest of another", m)
		}
	}
	if digestOf(append(man, "d 0755 0 0 - - \".\"\n"...), metadata{Env: []string{"A=1"}}) == a {
		t.Error("another manifest gives the same digest")
	}
}

// TestInstallByDigest: a version's directory is named by its digest, holds
// its manifest, and verifies; a build of the same bits switches to that
// version rather than adding one; a copy verifies; a changed copy does not.
func TestInstallByDigest(t *testing.T) {
	r := NewRegistry(t.TempDir())
	v1 := installFake(t, r, "web", "v1")
	vdir := filepath.Dir(v1.Rootfs)
	if !validDigest(v1.Digest) || filepath.Base(vdir) != "web@"+dirDigest(v1.Digest) {
		t.Fatalf("version %s has digest %q", vdir, v1.Digest)
	}
	if _, err := os.Stat(filepath.Join(vdir, manifestFile)); err != nil {
		t.Fatal(err)
	}
	v, err := VerifyVersion(vdir)
	if err != nil || v != (Version{Name: "web", Digest: v1.Digest, Dir: vdir}) {
		t.Fatalf("VerifyVersion = %+v, %v", v, err)
	}
	if got, err := r.ByDigest("web", v1.Digest); err != nil || got != v {
		t.Fatalf("ByDigest = %+v, %v", got, err)
	}
	if _, err := r.ByDigest("web", "sha256:"+strings.Repeat("0", 64)); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("ByDigest of an unknown digest: %v", err)
	}
	if _, err := r.ByDigest("web", "sha256:../../x"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("ByDigest of a bad digest: %v", err)
	}

	v2 := installFake(t, r, "web", "v2")
	// The same bits as v1 again: v1's version is current once more, and
	// no third version appears.
	tmp := fakeBuild(t, r, "web", "v1")
	if err := r.install("web", tmp, newReporter(nil, "web")); err != nil {
		t.Fatal(err)
	}
	assertGone(t, tmp)
	if got, err := r.Get("web"); err != nil || got.Rootfs != v1.Rootfs || got.Digest != v1.Digest {
		t.Fatalf("after a rebuild of v1's bits Get = %+v, %v; want v1 %+v", got, err, v1)
	}
	vs, err := r.Versions()
	if err != nil || len(vs) != 2 {
		t.Fatalf("Versions = %+v, %v; want v1 and v2", vs, err)
	}
	// A check that refuses a version held already leaves it be.
	tmp = fakeBuild(t, r, "web", "v2")
	boom := errors.New("boom")
	if _, err := r.installChecked("web", tmp, newReporter(nil, "web"), func(string) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("installChecked = %v", err)
	}
	assertVersion(t, v2.Rootfs, "v2")

	// A copy on another node verifies; a changed copy does not.
	other := filepath.Join(t.TempDir(), filepath.Base(vdir))
	if out, err := exec.Command("cp", "-a", vdir, other).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	if _, err := VerifyVersion(other); err != nil {
		t.Fatalf("a copy does not verify: %v", err)
	}
	if err := os.WriteFile(filepath.Join(other, rootfsDir, "version"), []byte("v9"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := VerifyVersion(other); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), `"version"`) {
		t.Fatalf("VerifyVersion of a changed copy = %v; want ErrInvalid naming the file", err)
	}
	renamed := filepath.Join(t.TempDir(), "web@sha256-"+strings.Repeat("1", 64))
	os.Rename(other, renamed)
	if _, err := VerifyVersion(renamed); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("VerifyVersion of a misnamed copy = %v; want ErrInvalid", err)
	}
}

// TestVersionsKeepsOldNames: versions made before digests are listed
// without one and keep being read where they are.
func TestVersionsKeepsOldNames(t *testing.T) {
	r := NewRegistry(t.TempDir())
	old := filepath.Join(r.Dir(), versionsDir, "web@20260101T000000Z-1")
	fakeTemplate(t, filepath.Dir(old), filepath.Base(old), metadata{Name: "web", Version: "old"})
	if err := os.Symlink(filepath.Join(versionsDir, filepath.Base(old)), filepath.Join(r.Dir(), "web")); err != nil {
		t.Fatal(err)
	}
	got, err := r.Get("web")
	if err != nil || got.Digest != "" || got.Rootfs != filepath.Join(old, rootfsDir) {
		t.Fatalf("Get = %+v, %v", got, err)
	}
	vs, err := r.Versions()
	if err != nil || len(vs) != 1 || vs[0] != (Version{Name: "web", Dir: old}) {
		t.Fatalf("Versions = %+v, %v", vs, err)
	}
	if _, err := VerifyVersion(old); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("VerifyVersion of a version without digest = %v", err)
	}
	v2 := installFake(t, r, "web", "v2")
	if v2.Digest == "" {
		t.Error("a new build has no digest")
	}
	if _, err := os.Stat(old); err != nil {
		t.Errorf("the old version went: %v", err)
	}
}
