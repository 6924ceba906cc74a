//go:build linux

package template

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/network"
	"github.com/lizard-build/lizard/internal/runtime/gvisor"
	"github.com/lizard-build/lizard/internal/slowness"
)

// realTemplateDir is the built templates' cache, as the e2e tests find it:
// LIZARD_TEMPLATE_DIR (make test sets it), else the default cache.
func realTemplateDir() string {
	if d := os.Getenv("LIZARD_TEMPLATE_DIR"); d != "" {
		return d
	}
	return "/var/cache/lizard/templates"
}

// TestDockerfileBuildReal builds a Dockerfile on the real base template with
// RUN steps in gVisor, rebuilds it after a one-line change (all but the
// last step cached), and checks that a failing RUN reports its exit code
// and output and leaves the template and the host as they were.
func TestDockerfileBuildReal(t *testing.T) {
	r, rt := realBaseRegistry(t)
	dir := r.Dir()
	bctx := t.TempDir()
	os.WriteFile(filepath.Join(bctx, "hello.txt"), []byte("hello\n"), 0o644)

	df := `FROM base
ARG WHO=world
RUN mkdir -p /opt && echo "made for $WHO" > /opt/made.txt
COPY --chown=user:user hello.txt /opt/
ENV GREETING=hi
WORKDIR /opt/work
USER user
RUN whoami > /tmp/who.txt && pwd >> /tmp/who.txt
CMD ["python3", "-m", "http.server", "8000"]
RUN echo v1 > /tmp/last.txt
`
	build := func(df string) (Template, string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), slowness.Scale(5*time.Minute))
		defer cancel()
		var out bytes.Buffer
		tpl, err := r.BuildDockerfile(ctx, "custom", DockerfileOptions{
			Dockerfile: []byte(df), DockerfileName: "Dockerfile", Context: bctx,
			BuildArgs: map[string]string{"WHO": "test"}, Runtime: rt,
			BuildBridge: rt.net.Bridge, BuildSubnet: rt.net.Subnet, NetnsPrefix: rt.net.NetnsPrefix,
		}, &out)
		t.Logf("build output:\n%s", out.String())
		return tpl, out.String(), err
	}

	tpl, out, err := build(df)
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	if strings.Contains(out, "CACHED") {
		t.Errorf("first build reported cached steps")
	}
	rootfs := tpl.Rootfs
	mustRead := func(p, want string) {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(rootfs, p))
		if err != nil || string(b) != want {
			t.Errorf("%s = %q, %v; want %q", p, b, err, want)
		}
	}
	mustRead("opt/made.txt", "made for test\n")
	mustRead("opt/hello.txt", "hello\n")
	mustRead("tmp/who.txt", "user\n/opt/work\n")
	mustRead("tmp/last.txt", "v1\n")
	if fi, err := os.Stat(filepath.Join(rootfs, "opt/hello.txt")); err != nil || fi.Sys().(*syscall.Stat_t).Uid != 1000 || fi.Sys().(*syscall.Stat_t).Gid != 1000 {
		t.Errorf("COPY --chown=user:user: %v %+v", err, fi)
	}
	if fi, err := os.Stat(filepath.Join(rootfs, "tmp/who.txt")); err != nil || fi.Sys().(*syscall.Stat_t).Uid != 1000 {
		t.Errorf("file made by RUN as USER user is not user's: %v", err)
	}
	if v, _ := lookupEnv(tpl.Env, "GREETING"); v != "hi" {
		t.Errorf("Env = %q", tpl.Env)
	}
	if _, ok := lookupEnv(tpl.Env, "WHO"); ok {
		t.Errorf("ARG WHO is in the template's env")
	}
	if tpl.Workdir != "/opt/work" || tpl.User != "user" || !slices.Equal(tpl.StartCommand, []string{"python3", "-m", "http.server", "8000"}) || tpl.From != "base" {
		t.Errorf("template = %+v", tpl)
	}

	// A one-line change at the end: every earlier step is cached.
	tpl2, out, err := build(strings.Replace(df, "echo v1", "echo v2", 1))
	if err != nil {
		t.Fatalf("rebuild: %v", err)
	}
	var cached, ran []string
	for _, l := range strings.Split(out, "\n") {
		if i := strings.Index(l, "] step "); i >= 0 && (strings.Contains(l, " RUN ") || strings.Contains(l, " COPY ")) {
			if strings.HasSuffix(l, " CACHED") {
				cached = append(cached, l[i+2:])
			} else if !strings.Contains(l, " done") {
				ran = append(ran, l[i+2:])
			}
		}
	}
	if len(cached) != 3 || len(ran) != 1 || !strings.Contains(ran[0], "echo v2") {
		t.Errorf("rebuild: cached %q, ran %q; want 3 cached and only the last RUN run", cached, ran)
	}
	mustRead2 := func(p, want string) {
		if b, _ := os.ReadFile(filepath.Join(tpl2.Rootfs, p)); string(b) != want {
			t.Errorf("after rebuild %s = %q, want %q", p, b, want)
		}
	}
	mustRead2("tmp/last.txt", "v2\n")
	mustRead2("opt/made.txt", "made for test\n")
	// The first build is still whole: sandboxes started from it go on.
	if tpl2.Rootfs == rootfs {
		t.Errorf("the rebuild reused the first build's rootfs %s", rootfs)
	}
	mustRead("tmp/last.txt", "v1\n")

	// A failing RUN: its exit code and output in the error, the template
	// untouched, nothing left behind.
	_, out, err = build(strings.Replace(df, "echo v1 > /tmp/last.txt", "echo boom >&2; exit 3", 1))
	if err == nil || !strings.Contains(err.Error(), "exit code 3") || !strings.Contains(err.Error(), "boom") || !strings.Contains(err.Error(), "Dockerfile:10") {
		t.Errorf("failing RUN: err = %v", err)
	}
	if !strings.Contains(out, "RUN failed (exit code 3)") {
		t.Errorf("progress does not report the failure")
	}
	if now, err := r.Get("custom"); err != nil || now.Version != tpl2.Version {
		t.Errorf("after a failed build the template is %+v, %v; want version %s", now, err, tpl2.Version)
	}
	if leaks := buildLeaks(dir, rt); len(leaks) > 0 {
		t.Errorf("left behind: %q", leaks)
	}
}

// realBaseRegistry returns a new registry whose base is the real base
// template, and the runsc binary to build with; it skips the test when
// either is missing or the test is not root.
func realBaseRegistry(t *testing.T) (*Registry, *testRuntime) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("Dockerfile builds need root (gVisor, network namespaces)")
	}
	runsc := os.Getenv("LIZARD_RUNSC")
	if runsc == "" {
		var err error
		if runsc, err = exec.LookPath("runsc"); err != nil {
			t.Skip("runsc (gVisor) not installed")
		}
	}
	realTemplates := realTemplateDir()
	if _, err := os.Stat(filepath.Join(realTemplates, "base", metadataFile)); err != nil {
		t.Skipf("the base template is not built in %s (lizard template build base)", realTemplates)
	}
	dir := t.TempDir()
	// The real base, without copying it: FROM base reads it through the link.
	if err := os.Symlink(filepath.Join(realTemplates, "base"), filepath.Join(dir, "base")); err != nil {
		t.Fatal(err)
	}
	return NewRegistry(dir), newTestRuntime(t, runsc)
}

// testRuntime is the gVisor runtime a test's builds run their steps with,
// as `lizard template build`'s: no sandboxes, state of its own.
type testRuntime struct {
	*gvisor.Runtime
	dir string // its state directory, runsc's root under it
	// net is the build network the test's steps run on and cgroup the
	// steps' cgroup parent (also their namespaces' prefix):
	// LIZARD_TEST_BUILD_BRIDGE, LIZARD_TEST_BUILD_SUBNET and
	// LIZARD_TEST_CGROUP_PARENT, else the default bridge and subnet and a
	// cgroup parent of this test process's own (testNames), so that what a
	// run killed half-way left on the host never counts as this run's
	// leak, and tests beside a server on the host use their own.
	net    BuildNetwork
	cgroup string
}

// testBuildNetwork returns the build network and cgroup parent of a test's
// steps (see testRuntime).
func testBuildNetwork(t *testing.T) (BuildNetwork, string) {
	t.Helper()
	n := BuildNetwork{Bridge: os.Getenv("LIZARD_TEST_BUILD_BRIDGE"), NetnsPrefix: os.Getenv("LIZARD_TEST_CGROUP_PARENT")}
	if s := os.Getenv("LIZARD_TEST_BUILD_SUBNET"); s != "" {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			t.Fatalf("LIZARD_TEST_BUILD_SUBNET: %v", err)
		}
		n.Subnet = p
	}
	n = n.withDefaults()
	if n.NetnsPrefix == "" {
		n.NetnsPrefix = testNames
	}
	return n, n.NetnsPrefix
}

// testNames is this test process's cgroup parent and namespace prefix
// (see testRuntime).
var testNames = func() string {
	var b [3]byte
	rand.Read(b[:])
	return "lzbt" + hex.EncodeToString(b[:])
}()

func newTestRuntime(t *testing.T, runsc string) *testRuntime {
	t.Helper()
	if err := os.MkdirAll("/run/lizard", 0o755); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("/run/lizard", "test-build-")
	if err != nil {
		t.Fatal(err)
	}
	net, cgroup := testBuildNetwork(t)
	rt, err := gvisor.New(gvisor.Config{Runsc: runsc, StateDir: dir, RunscRoot: filepath.Join(dir, "runsc"), CgroupParent: cgroup})
	if err != nil {
		os.RemoveAll(dir)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := rt.RemoveState(); err != nil {
			t.Errorf("remove the runtime's state: %v", err)
		}
		if cgroup == testNames {
			// runsc makes the parent cgroups and nothing else removes
			// them; one that still holds a step's stays (a leak the
			// test reports).
			dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", cgroup))
			for _, d := range append(dirs, filepath.Join("/sys/fs/cgroup", cgroup)) {
				syscall.Rmdir(d)
			}
		}
	})
	return &testRuntime{Runtime: rt, dir: dir, net: net, cgroup: cgroup}
}

// TestDockerfileBeforeSwitch: the hook sees the new version complete at
// its final path while the old one is still current; a hook that fails
// fails the build and leaves the old version current and no new version.
func TestDockerfileBeforeSwitch(t *testing.T) {
	r, rt := realBaseRegistry(t)
	bctx := t.TempDir()
	build := func(n string, hook func(context.Context, Template, io.Writer) error) (Template, error) {
		ctx, cancel := context.WithTimeout(context.Background(), slowness.Scale(5*time.Minute))
		defer cancel()
		os.WriteFile(filepath.Join(bctx, "n.txt"), []byte(n), 0o644)
		var out bytes.Buffer
		tpl, err := r.BuildDockerfile(ctx, "hooked", DockerfileOptions{
			Dockerfile:     []byte("FROM base\nCOPY n.txt /opt/\nCMD [\"sleep\", \"infinity\"]\n"),
			DockerfileName: "Dockerfile", Context: bctx, Runtime: rt, BeforeSwitch: hook,
		}, &out)
		t.Logf("build output:\n%s", out.String())
		return tpl, err
	}
	first, err := build("1", nil)
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	realDir, err := filepath.EvalSymlinks(r.Dir())
	if err != nil {
		t.Fatal(err)
	}
	vroot := filepath.Join(realDir, versionsDir)
	versions := entries(t, vroot)

	// The hook sees the new version in place, the old one still current,
	// the build lock held.
	boom := errors.New("not ready")
	var seen Template
	check := func(_ context.Context, tpl Template, progress io.Writer) error {
		seen = tpl
		if b, err := os.ReadFile(filepath.Join(tpl.Rootfs, "opt/n.txt")); err != nil || string(b) != "2" {
			t.Errorf("hook: new rootfs has n.txt %q, %v", b, err)
		}
		if cur, err := r.Get("hooked"); err != nil || cur.Rootfs != first.Rootfs {
			t.Errorf("hook: current version %+v, %v; want the first still", cur, err)
		}
		if l, ok, err := r.tryLock("hooked"); err != nil {
			t.Errorf("hook: tryLock: %v", err)
		} else if ok {
			l.unlock()
			t.Errorf("hook: the build lock is not held")
		}
		return boom
	}
	if _, err := build("2", check); !errors.Is(err, boom) {
		t.Fatalf("build with a failing hook = %v, want its error", err)
	}
	if filepath.Dir(filepath.Dir(seen.Rootfs)) != vroot || seen.Rootfs == first.Rootfs ||
		!slices.Equal(seen.StartCommand, []string{"sleep", "infinity"}) || seen.Version == "" || seen.Name != "hooked" {
		t.Errorf("hook saw %+v; want a new version under %s", seen, vroot)
	}
	assertGone(t, seen.Rootfs)
	if now := entries(t, vroot); !slices.Equal(now, versions) {
		t.Errorf("versions after a refused build: %v, want %v", now, versions)
	}
	if cur, err := r.Get("hooked"); err != nil || !reflect.DeepEqual(cur, first) {
		t.Errorf("after a refused build Get = %+v, %v; want %+v", cur, err, first)
	}

	// A hook that accepts: the build's template is the version it saw.
	seen = Template{}
	accept := func(_ context.Context, tpl Template, _ io.Writer) error {
		seen = tpl
		return nil
	}
	third, err := build("3", accept)
	if err != nil {
		t.Fatalf("build with an accepting hook: %v", err)
	}
	if !reflect.DeepEqual(third, seen) || filepath.Dir(filepath.Dir(third.Rootfs)) != vroot {
		t.Errorf("built %+v, hook saw %+v", third, seen)
	}
	if cur, err := r.Get("hooked"); err != nil || cur.Rootfs != third.Rootfs {
		t.Errorf("Get = %+v, %v; want the new version", cur, err)
	}
	if b, err := os.ReadFile(filepath.Join(first.Rootfs, "opt/n.txt")); err != nil || string(b) != "1" {
		t.Errorf("first version after the rebuild: %q, %v", b, err)
	}
	if leaks := buildLeaks(r.Dir(), rt); len(leaks) > 0 {
		t.Errorf("left behind: %q", leaks)
	}
}

// buildLeaks lists what builds may leave on the host: in the registry dir,
// of the build network, and of the steps' containers run by rt.
func buildLeaks(dir string, rt *testRuntime) []string {
	var out []string
	for _, pattern := range []string{
		filepath.Join(dir, ".build-*"), filepath.Join(dir, ".old-*"), filepath.Join(dir, ".link-*"), filepath.Join(dir, ".layers", ".tmp-*"),
		"/run/netns/" + rt.net.NetnsPrefix + "-lzb*", "/sys/fs/cgroup/*/" + rt.cgroup + "/lzb*", "/sys/fs/cgroup/" + rt.cgroup + "/lzb*",
		filepath.Join(rt.dir, ".run", "*"),
		"/sys/class/net/" + rt.net.Bridge, "/sys/class/net/lzv*",
	} {
		ms, _ := filepath.Glob(pattern)
		for _, m := range ms {
			if strings.HasPrefix(m, "/sys/class/net/lzv") {
				// Sandboxes of a running server have veths too: only the
				// build bridge's ports are ours.
				if l, err := os.Readlink(filepath.Join(m, "master")); err != nil || filepath.Base(l) != rt.net.Bridge {
					continue
				}
			}
			out = append(out, m)
		}
	}
	if b, err := exec.Command("nft", "list", "tables").Output(); err == nil && bytes.Contains(b, []byte(network.TableName(rt.net.Bridge))) {
		out = append(out, "nftables table "+network.TableName(rt.net.Bridge))
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && bytes.Contains(b, []byte(rt.dir)) {
			out = append(out, "process "+e.Name())
		}
	}
	return out
}
