package server_test

import (
	"context"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/lizard-build/lizard/internal/agent"
	pb "github.com/lizard-build/lizard/internal/envd/process"
)

// sighupStage is how TestCommandsStartWithDefaultSignals re-executes
// itself: "ignore" makes SIGHUP ignored and executes the binary again as
// "check", which starts with SIGHUP ignored, as under nohup.
const sighupStage = "LIZARD_TEST_SIGHUP_STAGE"

// TestCommandsStartWithDefaultSignals: an agent started with SIGHUP ignored
// (nohup, a shell's background job) starts its commands with SIGHUP at its
// default, so that kill -HUP ends them however the agent was started.
func TestCommandsStartWithDefaultSignals(t *testing.T) {
	switch os.Getenv(sighupStage) {
	case "ignore":
		signal.Ignore(syscall.SIGHUP)
		var env []string
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, sighupStage+"=") {
				env = append(env, kv)
			}
		}
		err := syscall.Exec("/proc/self/exe", os.Args, append(env, sighupStage+"=check"))
		t.Fatalf("exec: %v", err)
	case "check":
		checkDefaultSignals(t)
		return
	}
	requireRoot(t)
	cmd := exec.Command("/proc/self/exe", "-test.run=^TestCommandsStartWithDefaultSignals$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), sighupStage+"=ignore")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestCommandsStartWithDefaultSignals") {
		t.Fatalf("the run with SIGHUP ignored failed (%v):\n%s", err, out)
	}
}

// sigIgnHUP says whether the SigIgn mask of /proc/<pid>/status text
// (pid's ignored signals) has SIGHUP.
func sigIgnHUP(t *testing.T, status string) bool {
	t.Helper()
	for _, line := range strings.Split(status, "\n") {
		if hex, ok := strings.CutPrefix(line, "SigIgn:"); ok {
			mask, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
			if err != nil {
				t.Fatalf("SigIgn %q: %v", hex, err)
			}
			return mask&(1<<(syscall.SIGHUP-1)) != 0
		}
	}
	t.Fatalf("no SigIgn line in %q", status)
	return false
}

func checkDefaultSignals(t *testing.T) {
	self, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	if !sigIgnHUP(t, string(self)) {
		t.Fatal("the test did not start with SIGHUP ignored")
	}
	e := newEnvd(t)
	ctx := testContext(t)
	const status = "cat /proc/self/status"

	// exec, and a shell's background job.
	for _, cmd := range []string{status, "(" + status + ") & wait"} {
		res := runExec(t, e.agent, agent.ExecRequest{Cmd: []string{cmd}, Shell: true})
		if sigIgnHUP(t, res.out()) {
			t.Errorf("exec %q: SIGHUP is ignored in the command", cmd)
		}
	}
	// kill -HUP ends a command (TestSignalTree's SIGHUP case).
	if res := runExec(t, e.agent, agent.ExecRequest{Cmd: []string{"kill -HUP $$; sleep 5"}, Shell: true}); res.exitCode != 128+int(syscall.SIGHUP) {
		t.Errorf("kill -HUP $$: exit code %d, want %d", res.exitCode, 128+int(syscall.SIGHUP))
	}

	// An interactive process.
	pid, err := e.agent.Start(ctx, agent.StartRequest{ExecRequest: agent.ExecRequest{Cmd: []string{status}, Shell: true}})
	if err != nil {
		t.Fatal(err)
	}
	var out []byte
	if err := e.agent.Output(ctx, pid, func(o agent.Output) error { out = append(out, o.Data...); return nil }); err != nil {
		t.Fatal(err)
	}
	if sigIgnHUP(t, string(out)) {
		t.Errorf("interactive process: SIGHUP is ignored")
	}

	// An envd process.
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	st, err := e.process(e.http).Start(sctx, connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/cat", Args: []string{"/proc/self/status"}}}))
	if err != nil {
		t.Fatal(err)
	}
	var envdOut string
	for st.Receive() {
		envdOut += string(st.Msg().GetEvent().GetData().GetStdout())
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	if sigIgnHUP(t, envdOut) {
		t.Errorf("envd process: SIGHUP is ignored")
	}
}
