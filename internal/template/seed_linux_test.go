package template

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestDebootstrapSeed: with SeedMaxAge, the first build's debootstrap is
// kept and the next builds of the same suite and packages copy it (links
// and modes intact) instead of running debootstrap; a seed older than
// SeedMaxAge is dropped and debootstrap runs again; a failed debootstrap
// leaves no seed; without SeedMaxAge every build runs it.
func TestDebootstrapSeed(t *testing.T) {
	dir := t.TempDir()
	count := filepath.Join(dir, "runs")
	fail := filepath.Join(dir, "fail")
	deb := filepath.Join(dir, "debootstrap")
	// The target is the second-to-last argument (runDebootstrap).
	script := `#!/bin/sh
echo run >> ` + count + `
[ -e ` + fail + ` ] && { echo "E: no mirror"; exit 1; }
eval target=\${$(($# - 1))}
mkdir -p "$target/etc" "$target/usr/bin"
echo bookworm > "$target/etc/issue"
ln -s issue "$target/etc/link"
printf '#!/bin/sh\n' > "$target/usr/bin/tool"
chmod 4755 "$target/usr/bin/tool"
`
	if err := os.WriteFile(deb, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	reg := NewRegistry(filepath.Join(dir, "templates"))
	reg.SeedMaxAge = time.Hour
	lock, err := os.CreateTemp(dir, "lock")
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	rec := builtins["base"]
	runs := func() int {
		b, _ := os.ReadFile(count)
		return strings.Count(string(b), "run")
	}
	build := func(r *Registry) (string, error) {
		t.Helper()
		rootfs := filepath.Join(t.TempDir(), "rootfs")
		if err := os.Mkdir(rootfs, 0o755); err != nil {
			t.Fatal(err)
		}
		return rootfs, r.debootstrap(context.Background(), deb, rec, rootfs, "http://mirror.invalid/debian", lock, newReporter(nil, "test"), noSecondStage)
	}
	check := func(rootfs string) {
		t.Helper()
		if b, err := os.ReadFile(filepath.Join(rootfs, "etc", "issue")); err != nil || string(b) != "bookworm\n" {
			t.Fatalf("etc/issue: %q, %v", b, err)
		}
		if l, err := os.Readlink(filepath.Join(rootfs, "etc", "link")); err != nil || l != "issue" {
			t.Fatalf("etc/link: %q, %v", l, err)
		}
		if st, err := os.Stat(filepath.Join(rootfs, "usr", "bin", "tool")); err != nil || st.Mode()&os.ModeSetuid == 0 {
			t.Fatalf("usr/bin/tool: %v, %v", st, err)
		}
	}

	first, err := build(reg)
	if err != nil {
		t.Fatal(err)
	}
	check(first)
	second, err := build(reg)
	if err != nil {
		t.Fatal(err)
	}
	check(second)
	if n := runs(); n != 1 {
		t.Fatalf("debootstrap ran %d times for two builds, want 1", n)
	}
	// Another mirror is another seed.
	other := filepath.Join(t.TempDir(), "rootfs")
	os.Mkdir(other, 0o755)
	if err := reg.debootstrap(context.Background(), deb, rec, other, "http://other.invalid/debian", lock, newReporter(nil, "test"), noSecondStage); err != nil {
		t.Fatal(err)
	}
	if n := runs(); n != 2 {
		t.Fatalf("debootstrap ran %d times after a build from another mirror, want 2", n)
	}

	// An old seed is not used, and is dropped.
	seed := filepath.Join(reg.Dir(), seedsDir, seedKey(rec, "http://mirror.invalid/debian"))
	old := time.Now().Add(-2 * time.Hour)
	if err := os.Chtimes(filepath.Join(seed, seedStamp), old, old); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(fail, nil, 0o644)
	if _, err := build(reg); err == nil || !strings.Contains(err.Error(), "no mirror") {
		t.Fatalf("build with a failing debootstrap and an old seed: %v", err)
	}
	if n := runs(); n != 3 {
		t.Fatalf("debootstrap ran %d times, want 3 (the old seed is not used)", n)
	}
	if _, err := os.Stat(seed); !os.IsNotExist(err) {
		t.Fatalf("the old seed is still there (%v)", err)
	}
	os.Remove(fail)
	third, err := build(reg)
	if err != nil {
		t.Fatal(err)
	}
	check(third)
	if _, err := os.Stat(filepath.Join(seed, seedStamp)); err != nil {
		t.Fatalf("no new seed: %v", err)
	}
	left, _ := filepath.Glob(filepath.Join(reg.Dir(), seedsDir, "*.tmp-*"))
	if len(left) != 0 {
		t.Fatalf("unfinished seed copies left: %v", left)
	}

	// Without SeedMaxAge nothing is reused.
	plain := NewRegistry(reg.Dir())
	before := runs()
	if _, err := build(plain); err != nil {
		t.Fatal(err)
	}
	if runs() != before+1 {
		t.Fatal("a registry without SeedMaxAge did not run debootstrap")
	}
}

// noSecondStage stands in for debootstrap's second stage, which a real
// build runs in a container.
func noSecondStage(context.Context) error { return nil }
