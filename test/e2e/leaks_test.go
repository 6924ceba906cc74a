package e2e

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The harness's leak checks, without runsc: what a sandbox leaves is made
// by hand where a server's sandbox would leave it.

// leftCgroup makes the cgroup a sandbox id of a server with cgroup parent
// parent would leave, in the layout this host has (cgroup v1: a directory
// per controller, here the pids one; v2: one hierarchy). The server's end
// (finish) is what removes it.
func leftCgroup(t *testing.T, parent, id string) string {
	t.Helper()
	dir := filepath.Join(cgroupRoot, "pids", parent, id) // v1
	if _, err := os.Stat(filepath.Join(cgroupRoot, "cgroup.controllers")); err == nil {
		dir = filepath.Join(cgroupRoot, parent, id) // v2
	}
	if _, err := os.Stat(filepath.Dir(filepath.Dir(dir))); err != nil {
		t.Skipf("no cgroup hierarchy at %s: %v", filepath.Dir(filepath.Dir(dir)), err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// removeCgroup removes a cgroup leftCgroup made, and its parent, if they
// are still there.
func removeCgroup(dir string) {
	os.Remove(dir)
	os.Remove(filepath.Dir(dir))
}

// leftNetns makes the network namespace sandbox id of a server with
// namespace prefix prefix would leave.
func leftNetns(t *testing.T, prefix, id string) string {
	t.Helper()
	name := prefix + "-" + id
	run(t, "ip", "netns", "add", name)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	return name
}

// report records what finish tells a test.
type report struct{ errors, logs []string }

func (r *report) Errorf(format string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}
func (r *report) Logf(format string, args ...any) {
	r.logs = append(r.logs, fmt.Sprintf(format, args...))
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes cgroups and network namespaces")
	}
}

// TestLeaksAreEachServersOwn: two servers' names on the host differ (a
// third on the first one's data dir, its restart, has the first one's);
// a cgroup and a network namespace left by a sandbox of the first are in
// the first one's leak check and in no other's. At the end of its test
// (finish) they fail it, or are only logged when it failed already, and
// are removed either way.
func TestLeaksAreEachServersOwn(t *testing.T) {
	needRoot(t)
	a := newTestServer(t, nil, t.TempDir(), "")
	b := newTestServer(t, nil, t.TempDir(), "")
	if again := newTestServer(t, nil, a.dataDir, ""); again.names != a.names {
		t.Fatalf("a restart over %s has other names: %s, then %s", a.dataDir, a.names, again.names)
	}
	na, nb := a.names, b.names
	for _, n := range [][2]string{{na.cgroupParent, nb.cgroupParent}, {na.bridge, nb.bridge}, {na.buildBridge, nb.buildBridge}, {na.bridge, nb.buildBridge}} {
		if n[0] == n[1] {
			t.Errorf("two servers share the name %s: %s; %s", n[0], na, nb)
		}
	}
	for _, p := range [][2]netip.Prefix{{na.subnet, nb.subnet}, {na.buildSubnet, nb.buildSubnet}, {na.subnet, nb.buildSubnet}, {na.subnet, na.buildSubnet}} {
		if p[0].Overlaps(p[1]) {
			t.Errorf("subnets %s and %s overlap: %s; %s", p[0], p[1], na, nb)
		}
	}
	for _, name := range []string{na.bridge, na.buildBridge, nb.bridge, nb.buildBridge} {
		if len(name) > 15 {
			t.Errorf("bridge name %q is longer than an interface's 15 bytes", name)
		}
	}

	leave := func() (cgroup, netns string) {
		cgroup = leftCgroup(t, a.cgroupParent(), "leaktest")
		t.Cleanup(func() { removeCgroup(cgroup) })
		return cgroup, leftNetns(t, a.cgroupParent(), "leaktest")
	}
	cg, ns := leave()
	la := a.leaks()
	for _, want := range []string{"cgroup " + cg, "netns " + ns, "mount /run/netns/" + ns} {
		if !slices.Contains(la, want) {
			t.Errorf("%s is not in its server's leak check: %v", want, la)
		}
	}
	if lb := b.leaks(); len(lb) != 0 {
		t.Errorf("the other server's leak check counts the first one's leftovers: %v", lb)
	}

	var rb report
	b.finish(&rb, false)
	if len(rb.errors) != 0 {
		t.Errorf("the end of the other server's test: %v", rb.errors)
	}
	var ra report
	a.finish(&ra, false)
	if len(ra.errors) != 1 || !strings.Contains(ra.errors[0], "left behind") || !strings.Contains(ra.errors[0], cg) || !strings.Contains(ra.errors[0], ns) {
		t.Errorf("the end of the first server's test, which left %s and %s: errors %q", cg, ns, ra.errors)
	}
	gone(t, cg, ns)

	// The test failed: what is left is removed and logged.
	cg, ns = leave()
	var failed report
	a.finish(&failed, true)
	if len(failed.errors) != 0 || len(failed.logs) != 1 || !strings.Contains(failed.logs[0], cg) {
		t.Errorf("the end of a failed test that left %s: errors %q, logs %q", cg, failed.errors, failed.logs)
	}
	gone(t, cg, ns)
}

// gone fails the test if the cgroup directory or network namespace is
// still there.
func gone(t *testing.T, cgroup, netns string) {
	t.Helper()
	if _, err := os.Stat(cgroup); !os.IsNotExist(err) {
		t.Errorf("cgroup %s still there: %v", cgroup, err)
	}
	if _, err := os.Stat("/run/netns/" + netns); !os.IsNotExist(err) {
		t.Errorf("network namespace %s still there: %v", netns, err)
	}
}

// TestLeaksFailTheirTest: in a run of the tests, one whose server's
// sandbox leaves a cgroup fails, the cgroup is gone before the next test
// starts, and the next passes (TestLeakHelper*, run in a test binary of
// their own).
func TestLeaksFailTheirTest(t *testing.T) {
	needRoot(t)
	record := filepath.Join(t.TempDir(), "left")
	cmd := exec.Command(os.Args[0], "-test.run", "^(TestLeakHelperLeaves|TestLeakHelperNext)$", "-test.v", "-test.count=1")
	// Its times are not the run's (LIZARD_E2E_TIMES empty: not noted).
	cmd.Env = append(os.Environ(), "LIZARD_E2E_LEAK_HELPER="+record, "LIZARD_E2E_TIMES=")
	out, err := cmd.CombinedOutput()
	t.Logf("the run:\n%s", out)
	b, rerr := os.ReadFile(record)
	if rerr != nil {
		t.Fatalf("the leaving test did not run: %v", rerr)
	}
	cg := string(b)
	t.Cleanup(func() { removeCgroup(cg) })
	if err == nil {
		t.Fatal("the run passed: a test that left a cgroup did not fail")
	}
	for _, want := range []string{"--- FAIL: TestLeakHelperLeaves", "left behind", cg, "--- PASS: TestLeakHelperNext"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the run's output lacks %q", want)
		}
	}
	if strings.Count(string(out), "--- FAIL") != 1 {
		t.Errorf("want one test failed")
	}
	if _, err := os.Stat(cg); !os.IsNotExist(err) {
		t.Errorf("cgroup %s still there after the run: %v", cg, err)
	}
}

// TestLeakHelperLeaves is a test whose server's sandbox leaves its cgroup
// (TestLeaksFailTheirTest runs it); it records the cgroup's path.
func TestLeakHelperLeaves(t *testing.T) {
	record := os.Getenv("LIZARD_E2E_LEAK_HELPER")
	if record == "" {
		t.Skip("run by TestLeaksFailTheirTest")
	}
	s := newTestServer(t, nil, t.TempDir(), "")
	cg := leftCgroup(t, s.cgroupParent(), "leaktest")
	if err := os.WriteFile(record, []byte(cg), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestLeakHelperNext is the test after TestLeakHelperLeaves: the cgroup
// that one left is gone, and its own server's check is clean.
func TestLeakHelperNext(t *testing.T) {
	record := os.Getenv("LIZARD_E2E_LEAK_HELPER")
	if record == "" {
		t.Skip("run by TestLeaksFailTheirTest")
	}
	b, err := os.ReadFile(record)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(string(b)); !os.IsNotExist(err) {
		t.Errorf("the cgroup the test before left is still there: %v", err)
	}
	s := newTestServer(t, nil, t.TempDir(), "")
	if l := s.leaks(); len(l) != 0 {
		t.Errorf("left behind: %v", l)
	}
}
