package runtimetest

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/network"
	"github.com/lizard-build/lizard/internal/runtime"
)

// RunnerEnv is what the Runner suite needs besides the backend.
type RunnerEnv struct {
	// Rootfs is a template root filesystem holding /bin/sh, id, hostname
	// and sleep, and a user of uid 1000; each test runs in a copy.
	Rootfs string
	// Network is the network the commands run on.
	Network *network.Manager
	// Leaks: see Env.
	Leaks func(id string) []string
	// Exec runs the suite's own commands (copies) and waits for them:
	// the test's reaper's Run where one reaps the process's children; nil
	// runs them plainly.
	Exec func(*exec.Cmd) error
}

// RunRunner runs the suite of runtime.Runner against rn.
func RunRunner(t *testing.T, rn runtime.Runner, env RunnerEnv) {
	t.Run("WritesInPlace", func(t *testing.T) { testRunWrites(t, rn, env) })
	t.Run("ExitStatus", func(t *testing.T) { testRunExit(t, rn, env) })
	t.Run("NoSuchProgram", func(t *testing.T) { testRunMissing(t, rn, env) })
	t.Run("Cancel", func(t *testing.T) { testRunCancel(t, rn, env) })
	t.Run("CancelEarly", func(t *testing.T) { testRunCancelEarly(t, rn, env) })
}

// runEnv copies env.Rootfs for one test and opens its output file.
func runEnv(t *testing.T, env RunnerEnv) (runtime.RunSpec, string) {
	t.Helper()
	dir := t.TempDir()
	rootfs := filepath.Join(dir, "rootfs")
	cp := exec.Command("cp", "-a", "--reflink=auto", env.Rootfs, rootfs)
	var out strings.Builder
	cp.Stdout, cp.Stderr = &out, &out
	run := env.Exec
	if run == nil {
		run = (*exec.Cmd).Run
	}
	if err := run(cp); err != nil {
		t.Fatalf("copy rootfs: %v: %s", err, out.String())
	}
	outPath := filepath.Join(dir, "output.log")
	f, err := os.OpenFile(outPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return runtime.RunSpec{
		ID: NewID(), Rootfs: rootfs, Hostname: "build", Cwd: "/", Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		Resources: runtime.Resources{MemoryMB: 1024, Pids: 1024}, Network: env.Network, Output: f,
	}, outPath
}

func noLeaks(t *testing.T, env RunnerEnv, id string) {
	t.Helper()
	if l := env.Leaks(id); len(l) > 0 {
		t.Errorf("run %s left behind: %q", id, l)
	}
}

func testRunWrites(t *testing.T, rn runtime.Runner, env RunnerEnv) {
	spec, outPath := runEnv(t, env)
	tmp := filepath.Join(spec.Rootfs, "tmp")
	spec.Mounts = []runtime.Mount{{Source: tmp, Destination: "/tmp"}}
	spec.UID, spec.GID, spec.Cwd = 1000, 1000, "/tmp"
	spec.Env = append(spec.Env, "GREETING=hi")
	spec.Args = []string{"/bin/sh", "-c", `echo "$GREETING $(id -u) $(hostname) $(pwd)" > /tmp/made.txt; echo out; echo err >&2`}
	code, err := rn.Run(context.Background(), spec)
	if err != nil || code != 0 {
		t.Fatalf("Run = %d, %v", code, err)
	}
	if b, err := os.ReadFile(filepath.Join(tmp, "made.txt")); err != nil || string(b) != "hi 1000 build /tmp\n" {
		t.Errorf("the command wrote %q, %v; want its env, user, hostname and cwd", b, err)
	}
	if b, err := os.ReadFile(outPath); err != nil || !strings.Contains(string(b), "out\n") || !strings.Contains(string(b), "err\n") {
		t.Errorf("output %q, %v; want stdout and stderr", b, err)
	}
	noLeaks(t, env, spec.ID)
}

func testRunExit(t *testing.T, rn runtime.Runner, env RunnerEnv) {
	spec, _ := runEnv(t, env)
	spec.Args = []string{"/bin/sh", "-c", "exit 3"}
	if code, err := rn.Run(context.Background(), spec); err != nil || code != 3 {
		t.Errorf("Run of exit 3 = %d, %v", code, err)
	}
	noLeaks(t, env, spec.ID)
}

// testRunCancelEarly cancels runs at moments of their start (before the
// container exists, while it is being made, as the command starts): each
// returns the context's error and leaves nothing behind, whatever the
// container had become (a build cancelled as a step begins).
func testRunCancelEarly(t *testing.T, rn runtime.Runner, env RunnerEnv) {
	for _, after := range []time.Duration{0, 5 * time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond,
		100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond} {
		spec, _ := runEnv(t, env)
		spec.Args = []string{"/bin/sh", "-c", "exec sleep 600"}
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(after, cancel)
		if _, err := rn.Run(ctx, spec); !errors.Is(err, context.Canceled) {
			t.Errorf("Run cancelled after %v = %v; want context.Canceled", after, err)
		}
		cancel()
		if l := env.Leaks(spec.ID); len(l) > 0 {
			t.Errorf("run %s cancelled after %v left behind: %q", spec.ID, after, l)
		}
	}
}

func testRunMissing(t *testing.T, rn runtime.Runner, env RunnerEnv) {
	spec, _ := runEnv(t, env)
	spec.Args = []string{"/no/such/program"}
	if _, err := rn.Run(context.Background(), spec); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("Run of a missing program = %v; want ErrInvalid", err)
	}
	noLeaks(t, env, spec.ID)
}

func testRunCancel(t *testing.T, rn runtime.Runner, env RunnerEnv) {
	spec, outPath := runEnv(t, env)
	spec.Args = []string{"/bin/sh", "-c", "echo started; exec sleep 600"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		// Cancel once the command runs.
		for ctx.Err() == nil {
			if b, _ := os.ReadFile(outPath); strings.Contains(string(b), "started") {
				cancel()
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	if _, err := rn.Run(ctx, spec); !errors.Is(err, context.Canceled) {
		t.Errorf("Run cancelled = %v; want context.Canceled", err)
	}
	noLeaks(t, env, spec.ID)
}
