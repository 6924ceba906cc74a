package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestLeaksSeeCgroups: a sandbox cgroup left on the host is reported by the
// leak check in the layout this host has (cgroup v1: a directory per
// controller; v2: one hierarchy), so tests that end with waitNoLeaks fail on
// a leftover. (gvisor.TestCgroupDirs covers both layouts on a fake tree.)
func TestLeaksSeeCgroups(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes a cgroup")
	}
	parent := filepath.Join(cgroupRoot, "pids", "lizard") // v1
	layout := "v1"
	if _, err := os.Stat(filepath.Join(cgroupRoot, "cgroup.controllers")); err == nil {
		parent, layout = filepath.Join(cgroupRoot, "lizard"), "v2"
	}
	if _, err := os.Stat(filepath.Dir(parent)); err != nil {
		t.Skipf("no cgroup hierarchy at %s: %v", filepath.Dir(parent), err)
	}
	if _, err := os.Stat(parent); os.IsNotExist(err) {
		if err := os.Mkdir(parent, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(parent) })
	}
	cg := filepath.Join(parent, fmt.Sprintf("lztest-leak-%d", os.Getpid()))
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(cg) })

	s := &server{t: t, dataDir: t.TempDir()}
	if l := s.leaks(); !slices.Contains(l, "cgroup "+cg) {
		t.Fatalf("cgroup %s left (%s layout) is not reported: %v", cg, layout, l)
	}
	if err := os.Remove(cg); err != nil {
		t.Fatal(err)
	}
	if l := s.leaks(); slices.Contains(l, "cgroup "+cg) {
		t.Fatalf("removed cgroup still reported: %v", l)
	}
}
