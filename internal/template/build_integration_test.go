//go:build linux

package template

import (
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/slowness"
)

// needRealBuild skips a test of a real debootstrap build when this machine
// lacks what one needs: root, debootstrap, runsc and an answering Debian
// mirror. `make test` has them all, so these tests run there. -short skips
// them too (each takes minutes). It returns a registry in dir ("" a
// temporary one) whose recipe steps run with a test runtime.
func needRealBuild(t *testing.T, dir string) (*Registry, *testRuntime) {
	t.Helper()
	if testing.Short() {
		t.Skip("real debootstrap build (minutes); not with -short")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root (debootstrap, gVisor, network namespaces)")
	}
	if _, err := NewRegistry(t.TempDir()).debootstrapPath(); err != nil {
		t.Skip(err)
	}
	mirror, err := HostMirror()
	if err != nil {
		t.Skipf("no Debian mirror in the host's apt sources: %v", err)
	}
	release := mirror + "/dists/" + builtins["base"].Suite + "/Release"
	client := http.Client{Timeout: 10 * time.Second}
	resp, err := client.Head(release)
	if err != nil {
		t.Skipf("the Debian mirror does not answer (%v)", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Skipf("the Debian mirror answers %s for %s", resp.Status, release)
	}
	return recipeRegistry(t, dir)
}

// recipeRegistry returns a registry in dir ("" a temporary one) whose
// built-in builds run their steps with a test runtime (LIZARD_RUNSC, else
// runsc in PATH; skips the test without) on the test's build network.
func recipeRegistry(t *testing.T, dir string) (*Registry, *testRuntime) {
	t.Helper()
	runsc := os.Getenv("LIZARD_RUNSC")
	if runsc == "" {
		var err error
		if runsc, err = exec.LookPath("runsc"); err != nil {
			t.Skip("runsc (gVisor) not installed: built-in recipes' steps run in it")
		}
	}
	if dir == "" {
		dir = t.TempDir()
	}
	rt := newTestRuntime(t, runsc)
	r := NewRegistry(dir)
	r.Runtime, r.BuildNetwork = rt, rt.net
	return r, rt
}

// TestBuildBaseReal runs the real debootstrap build of "base" (about 75 s).
// LIZARD_TEST_TEMPLATE_DIR keeps the registry in that directory instead of a
// temporary one (to look at the result afterwards).
func TestBuildBaseReal(t *testing.T) {
	r, rt := needRealBuild(t, os.Getenv("LIZARD_TEST_TEMPLATE_DIR"))
	ctx, cancel := context.WithTimeout(context.Background(), slowness.Scale(20*time.Minute))
	defer cancel()

	// The first build debootstraps and keeps the tree for the tests after
	// this one (seedshare_linux_test.go); the cancelled rebuild below
	// debootstraps again.
	r.SeedMaxAge = time.Hour
	rec := &recordingRunner{Runner: rt}
	r.Runtime = rec
	start := time.Now()
	tpl, err := r.Build(ctx, "base", testWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("built %+v in %v", tpl, time.Since(start).Round(time.Second))
	rec.check(t, secondStage)
	shareSeeds(t, r)
	r.SeedMaxAge = 0

	if tpl.Name != "base" || !strings.HasPrefix(tpl.Version, "bookworm-") || tpl.SizeBytes < 50<<20 || tpl.BuiltAt.IsZero() {
		t.Errorf("template = %+v", tpl)
	}
	if cur, err := filepath.EvalSymlinks(filepath.Join(r.Dir(), "base", "rootfs")); err != nil || cur != tpl.Rootfs {
		t.Errorf("Rootfs = %q, the current version's is %q (%v)", tpl.Rootfs, cur, err)
	}
	checkBaseRootfs(t, tpl.Rootfs)
	checkClean(t, r)

	got, err := r.Get("base")
	if err != nil || got.Version != tpl.Version {
		t.Errorf("Get = %+v, %v", got, err)
	}
	list, err := r.List()
	if err != nil || len(list) != 1 || list[0].Name != "base" {
		t.Errorf("List = %+v, %v", list, err)
	}

	// EnsureBuilt does not rebuild: the same version, built at the same time.
	got, err = r.EnsureBuilt(ctx, "base", testWriter{t})
	if err != nil || got.Version != tpl.Version || !got.BuiltAt.Equal(tpl.BuiltAt) || got.Rootfs != tpl.Rootfs {
		t.Errorf("EnsureBuilt = %+v, %v; want %+v", got, err, tpl)
	}

	// A rebuild cancelled while debootstrap configures packages (proc and
	// /dev are mounted in the target then) leaves the old build in place
	// and nothing else behind.
	cctx, ccancel := context.WithCancel(ctx)
	defer ccancel()
	w := &cancelAt{t: t, marker: "step 4/5", cancel: ccancel}
	_, err = r.Build(cctx, "base", w)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled build = %v, want context.Canceled", err)
	}
	if !w.seen() {
		t.Error("cancel marker never seen")
	}
	got, err = r.Get("base")
	if err != nil || got.Version != tpl.Version {
		t.Errorf("after cancelled rebuild: Get = %+v, %v; want version %s", got, err, tpl.Version)
	}
	checkClean(t, r)
	checkBaseRootfs(t, got.Rootfs)
	if leaks := buildLeaks(r.Dir(), rt); len(leaks) > 0 {
		t.Errorf("left behind: %q", leaks)
	}
}

func checkBaseRootfs(t *testing.T, rootfs string) {
	t.Helper()
	st, err := os.Stat(filepath.Join(rootfs, "home", "user"))
	if err != nil {
		t.Fatal(err)
	}
	if s := st.Sys().(*syscall.Stat_t); s.Uid != 1000 || s.Gid != 1000 || !st.IsDir() {
		t.Errorf("/home/user: uid %d gid %d dir %v", s.Uid, s.Gid, st.IsDir())
	}
	if st, err := os.Lstat(filepath.Join(rootfs, ".lizard")); err != nil || !st.IsDir() {
		t.Errorf("/.lizard: %v", err)
	} else if ents, _ := os.ReadDir(filepath.Join(rootfs, ".lizard")); len(ents) != 0 {
		t.Errorf("/.lizard not empty: %v", ents)
	}
	for _, p := range []string{"usr/bin/python3", "usr/bin/curl", "usr/bin/ps", "usr/bin/ip", "bin/bash", "etc/ssl/certs/ca-certificates.crt"} {
		if _, err := os.Stat(filepath.Join(rootfs, p)); err != nil {
			t.Errorf("missing %s: %v", p, err)
		}
	}
	passwd, _ := os.ReadFile(filepath.Join(rootfs, "etc", "passwd"))
	if !strings.Contains(string(passwd), "\nuser:x:1000:1000:user:/home/user:/bin/bash\n") {
		t.Errorf("no user in /etc/passwd:\n%s", passwd)
	}
	group, _ := os.ReadFile(filepath.Join(rootfs, "etc", "group"))
	if !strings.Contains(string(group), "\nuser:x:1000:") {
		t.Errorf("no group user in /etc/group:\n%s", group)
	}
	hosts, _ := os.ReadFile(filepath.Join(rootfs, "etc", "hosts"))
	if string(hosts) != hostsFile {
		t.Errorf("/etc/hosts = %q", hosts)
	}
	if _, err := os.Lstat(filepath.Join(rootfs, "etc", "hostname")); !os.IsNotExist(err) {
		t.Errorf("/etc/hostname of the build host kept: %v", err)
	}
	for _, pattern := range []string{"var/cache/apt/archives/*.deb", "var/lib/apt/lists/*"} {
		if m, _ := filepath.Glob(filepath.Join(rootfs, pattern)); len(m) != 0 {
			t.Errorf("%s not cleaned: %d entries", pattern, len(m))
		}
	}
}

// checkClean: no build leftovers in the registry and nothing mounted under it.
func checkClean(t *testing.T, r *Registry) {
	t.Helper()
	ents, err := os.ReadDir(r.Dir())
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".build-") || strings.HasPrefix(e.Name(), ".old-") {
			t.Errorf("leftover %s", e.Name())
		}
	}
	real, _ := filepath.EvalSymlinks(r.Dir())
	if mps, err := mountsUnder(real); err != nil || len(mps) != 0 {
		t.Errorf("mounts under %s: %v %v", real, mps, err)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// cancelAt logs progress and cancels once a line contains marker.
type cancelAt struct {
	t      *testing.T
	marker string
	cancel func()
	mu     sync.Mutex
	hit    bool
}

func (c *cancelAt) Write(p []byte) (int, error) {
	c.t.Log(strings.TrimRight(string(p), "\n"))
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.hit && strings.Contains(string(p), c.marker) {
		c.hit = true
		c.cancel()
	}
	return len(p), nil
}

func (c *cancelAt) seen() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hit
}

// TestBuildFailureCleansUp: a build that fails (here: no mirror listening)
// reports why and leaves nothing behind. It runs debootstrap, so it needs
// root and debootstrap, but no network.
func TestBuildFailureCleansUp(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (debootstrap)")
	}
	r, _ := recipeRegistry(t, "")
	if _, err := r.debootstrapPath(); err != nil {
		t.Skip(err)
	}
	r.Mirror = "http://127.0.0.1:9/debian" // discard port: connection refused
	ctx, cancel := context.WithTimeout(context.Background(), slowness.Scale(2*time.Minute))
	defer cancel()
	var out syncBuffer
	_, err := r.Build(ctx, "base", &out)
	t.Logf("progress:\n%s", out.String())
	if err == nil {
		t.Fatal("build from a dead mirror succeeded")
	}
	t.Logf("error: %v", err)
	if !strings.Contains(err.Error(), "debootstrap") {
		t.Errorf("error does not say what failed: %v", err)
	}
	if _, err := r.Get("base"); err == nil {
		t.Error("a failed build is visible")
	}
	checkClean(t, r)
}

// TestBuildCancelDuringApt: a build cancelled while apt-get installs the
// template's packages in its container leaves nothing behind, nothing mounted,
// and no process running in the build tree (seconds from a shared seed).
func TestBuildCancelDuringApt(t *testing.T) {
	r, rt := needRealBuild(t, "")
	useSharedSeeds(t, r)
	ctx, cancel := context.WithTimeout(context.Background(), slowness.Scale(20*time.Minute))
	defer cancel()
	cctx, ccancel := context.WithCancel(ctx)
	defer ccancel()
	w := &cancelAt{t: t, marker: "installing with apt-get", cancel: func() {
		// Let apt-get get going first.
		time.AfterFunc(3*time.Second, ccancel)
	}}
	_, err := r.Build(cctx, "python312", w)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled build = %v, want context.Canceled", err)
	}
	if !w.seen() {
		t.Error("cancel marker never seen")
	}
	if _, err := r.Get("python"); err == nil {
		t.Error("a cancelled build is visible")
	}
	checkClean(t, r)
	// No process is left with its root in the registry, nor any
	// container of the step.
	procs, _ := filepath.Glob("/proc/[0-9]*/root")
	for _, p := range procs {
		if root, err := os.Readlink(p); err == nil && strings.HasPrefix(root, r.Dir()) {
			t.Errorf("%s is %s", p, root)
		}
	}
	if leaks := buildLeaks(r.Dir(), rt); len(leaks) > 0 {
		t.Errorf("left behind: %q", leaks)
	}
}

// TestBuildAptFailure: a package apt cannot find fails the build with apt's
// reason and leaves nothing behind (seconds from a shared seed).
func TestBuildAptFailure(t *testing.T) {
	r, _ := needRealBuild(t, "")
	useSharedSeeds(t, r)
	builtins["broken"] = debian([]string{"no-such-package-lizard"}, nil)
	defer delete(builtins, "broken")
	ctx, cancel := context.WithTimeout(context.Background(), slowness.Scale(20*time.Minute))
	defer cancel()
	_, err := r.Build(ctx, "broken", testWriter{t})
	if err == nil {
		t.Fatal("build with a missing package succeeded")
	}
	t.Logf("error: %v", err)
	if !strings.Contains(err.Error(), "apt-get install: Unable to locate package no-such-package-lizard") {
		t.Errorf("error does not say why: %v", err)
	}
	if _, err := r.Get("broken"); err == nil {
		t.Error("a failed build is visible")
	}
	checkClean(t, r)
}
