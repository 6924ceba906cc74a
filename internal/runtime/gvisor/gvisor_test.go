package gvisor_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lizard-build/lizard/internal/network"
	"github.com/lizard-build/lizard/internal/reaper"
	"github.com/lizard-build/lizard/internal/runtime"
	"github.com/lizard-build/lizard/internal/runtime/gvisor"
	"github.com/lizard-build/lizard/internal/runtime/runtimetest"
	"github.com/lizard-build/lizard/internal/template"
)

// newRuntime builds a gVisor runtime for tests, or skips when this machine
// lacks root, runsc, the agent binary or the base template.
func newRuntime(t *testing.T) (*gvisor.Runtime, runtimetest.Env) {
	t.Helper()
	rt, env, _ := newRuntimeReaper(t)
	return rt, env
}

// newRuntimeReaper is newRuntime, with the reaper that waits for the
// test's runsc processes (what else the test runs goes through it too).
func newRuntimeReaper(t *testing.T) (*gvisor.Runtime, runtimetest.Env, *reaper.Reaper) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces, cgroups and gVisor sandboxes")
	}
	runsc := os.Getenv("LIZARD_RUNSC")
	if runsc == "" {
		p, err := exec.LookPath("runsc")
		if err != nil {
			t.Skip("runsc not installed (make deps builds it)")
		}
		runsc = p
	}
	agentBin := os.Getenv("LIZARD_AGENT")
	if agentBin == "" {
		agentBin = buildAgent(t)
	}
	tdir := os.Getenv("LIZARD_TEMPLATE_DIR")
	if tdir == "" {
		tdir = "/var/cache/lizard/templates"
	}
	tpl, err := template.NewRegistry(tdir).Get("base")
	if err != nil {
		t.Skipf("base template not built (make templates): %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	reap, err := reaper.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	names := namesFor(t)
	// Its commands go through the reaper, which would otherwise wait for
	// them before os/exec does ("waitid: no child processes").
	netm, err := network.New(network.Config{Bridge: names.bridge, Subnet: names.subnet, NetnsPrefix: names.prefix, Run: reap.Run})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netm.Remove() }) // the bridge and its table too: nothing left on the host
	dir := t.TempDir()
	// runsc pins one empty network namespace for its gofers in its root
	// directory (shared by all sandboxes, not a per-sandbox leak); it must
	// be unmounted before the directory can go.
	t.Cleanup(func() {
		for unix.Unmount(filepath.Join(dir, "runsc", "null-netns"), unix.MNT_DETACH) == nil {
		}
	})
	rt, err := gvisor.New(gvisor.Config{
		Runsc: runsc, StateDir: filepath.Join(dir, "sandboxes"), RunscRoot: filepath.Join(dir, "runsc"),
		AgentPath: agentBin, Network: netm, Reaper: reap, CgroupParent: names.prefix,
	})
	if err != nil {
		t.Fatal(err)
	}
	// runsc makes the cgroup parent and nothing removes it (rmdir leaves
	// it while a sandbox is still in it: the leak checks say so then).
	t.Cleanup(func() {
		dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", names.prefix))
		for _, d := range append(dirs, filepath.Join("/sys/fs/cgroup", names.prefix)) {
			os.Remove(d)
		}
	})
	return rt, runtimetest.Env{Rootfs: tpl.Rootfs, Leaks: rt.Leaks}, reap
}

// testNames are what a test's runtime takes on the host: its cgroup
// parent and network namespace prefix, its sandboxes' bridge and subnet
// and those of its Run containers; another test's, a server's on the
// host (lizard, lizard0) or an end-to-end test's are not its, so nothing
// one leaves is ever counted or cleaned up by another.
type testNames struct {
	prefix            string
	bridge, runBridge string
	subnet, runSubnet netip.Prefix
}

var named = struct {
	sync.Mutex
	tests map[string]testNames
}{tests: map[string]testNames{}}

// namesFor returns t's names: lzg and six hex digits of its name's hash
// (within an interface name's 15 bytes), and a /20 of 10.251.0.0/16 and
// of 10.237.0.0/16 of its own among this run's tests.
func namesFor(t *testing.T) testNames {
	named.Lock()
	defer named.Unlock()
	if n, ok := named.tests[t.Name()]; ok {
		return n
	}
	sum := sha256.Sum256([]byte(t.Name()))
	tag := "lzg" + hex.EncodeToString(sum[:])[:6]
	slot := byte(len(named.tests) % 16 * 16)
	n := testNames{prefix: tag, bridge: tag, runBridge: tag + "r",
		subnet:    netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 251, slot, 0}), 20),
		runSubnet: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 237, slot, 0}), 20)}
	named.tests[t.Name()] = n
	return n
}

// buildAgent compiles lizard-agent statically for the sandbox.
func buildAgent(t *testing.T) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "lizard-agent")
	cmd := exec.Command("go", "build", "-o", out, "github.com/lizard-build/lizard/cmd/lizard-agent")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build agent: %v\n%s", err, b)
	}
	return out
}

func TestConformance(t *testing.T) {
	rt, env := newRuntime(t)
	runtimetest.Run(t, rt, env)
}

func TestCheckpointConformance(t *testing.T) {
	rt, env := newRuntime(t)
	runtimetest.RunCheckpointer(t, rt, env)
}

func TestRunnerConformance(t *testing.T) {
	rt, env, reap := newRuntimeReaper(t)
	names := namesFor(t)
	netm, err := network.New(network.Config{Bridge: names.runBridge, Subnet: names.runSubnet, NetnsPrefix: names.prefix, Run: reap.Run})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netm.Remove() })
	runtimetest.RunRunner(t, rt, runtimetest.RunnerEnv{Rootfs: env.Rootfs, Network: netm, Leaks: rt.Leaks, Exec: reap.Run})
}

// TestStateFileFollowsRunsc: the state file Resume looks for before it
// asks runsc about a leftover container is there exactly while runsc knows
// the container (the name is runsc's own format, which a runsc update
// could change).
func TestStateFileFollowsRunsc(t *testing.T) {
	rt, env := newRuntime(t)
	ctx := context.Background()
	id := runtimetest.NewID()
	t.Cleanup(func() { rt.Destroy(ctx, id) })
	spec := runtime.Spec{ID: id, Rootfs: env.Rootfs, AgentToken: "tok-of-sixteen-chars",
		Resources: runtime.Resources{CPUs: 1, MemoryMB: 1024, Pids: 1024, DiskMB: 1024}}
	for _, step := range []struct {
		what string
		do   func() error
		has  bool // a state file after it
	}{
		{"nothing yet", func() error { return nil }, false},
		{"create", func() error { _, err := rt.Create(ctx, spec); return err }, true},
		{"start", func() error { return rt.Start(ctx, id) }, true},
		{"pause (the container deleted)", func() error { return rt.Pause(ctx, id) }, false},
		{"resume", func() error { return rt.Resume(ctx, id) }, true},
		{"destroy", func() error { return rt.Destroy(ctx, id) }, false},
	} {
		if err := step.do(); err != nil {
			t.Fatalf("%s: %v", step.what, err)
		}
		if got := rt.HasStateFile(id); got != step.has {
			t.Fatalf("after %s: state file there %v, want %v", step.what, got, step.has)
		}
	}
}
