package gvisor_test

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lizard-build/lizard/internal/network"
	"github.com/lizard-build/lizard/internal/reaper"
	"github.com/lizard-build/lizard/internal/runtime/gvisor"
	"github.com/lizard-build/lizard/internal/runtime/runtimetest"
	"github.com/lizard-build/lizard/internal/template"
)

// newRuntime builds a gVisor runtime for tests, or skips when this machine
// lacks root, runsc, the agent binary or the base template.
func newRuntime(t *testing.T) (*gvisor.Runtime, runtimetest.Env) {
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
	netm, err := network.New(network.Config{Bridge: "lizardt0", Subnet: netip.MustParsePrefix("10.251.0.0/16")})
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
		AgentPath: agentBin, Network: netm, Reaper: reap,
	})
	if err != nil {
		t.Fatal(err)
	}
	return rt, runtimetest.Env{Rootfs: tpl.Rootfs, Leaks: rt.Leaks}
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
	rt, env := newRuntime(t)
	netm, err := network.New(network.Config{Bridge: "lizardtr0", Subnet: netip.MustParsePrefix("10.237.0.0/16")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netm.Remove() })
	runtimetest.RunRunner(t, rt, runtimetest.RunnerEnv{Rootfs: env.Rootfs, Network: netm, Leaks: rt.Leaks})
}
