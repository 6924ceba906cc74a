package network

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestEnsureMountPoint: once the directory is a mount point of its own, a
// later `ip netns add` of another program (which binds the directory over
// itself when it is no mount point) leaves the namespaces bound in it
// reachable by their paths; a directory that holds bound namespaces
// already is left as it is.
func TestEnsureMountPoint(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts")
	}
	src := filepath.Join(t.TempDir(), "src")
	if err := os.WriteFile(src, []byte("ns"), 0o644); err != nil {
		t.Fatal(err)
	}
	bind := func(t *testing.T, dir, name string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount(src, p, "none", unix.MS_BIND, ""); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Unmount(p, unix.MNT_DETACH) })
		return p
	}
	// isMountPoint is iproute2's test: it makes the directory shared, and
	// binds it over itself when that fails.
	isMountPoint := func(dir string) bool { return exec.Command("mount", "--make-shared", dir).Run() == nil }
	released := func(t *testing.T, p string) {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil {
			t.Fatalf("unmount %s by its path: %v", p, err)
		}
		if err := os.Remove(p); err != nil {
			t.Fatalf("remove %s: %v", p, err)
		}
	}

	t.Run("fresh", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "netns")
		if err := ensureMountPoint(dir); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
		if err := ensureMountPoint(dir); err != nil {
			t.Fatalf("a second time: %v", err)
		}
		p := bind(t, dir, "sandbox")
		if !isMountPoint(dir) {
			t.Fatal("not a mount point: `ip netns add` would hide the namespace")
		}
		released(t, p)
	})
	t.Run("bound before", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "netns")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		p := bind(t, dir, "older")
		if err := ensureMountPoint(dir); !errors.Is(err, errBoundBefore) {
			t.Fatalf("ensureMountPoint over a bound namespace: %v, want errBoundBefore", err)
		}
		released(t, p)
	})
}
