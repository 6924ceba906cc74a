package server_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/errdefs"
)

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

func TestExecResults(t *testing.T) {
	c := newClient(t)
	tests := []struct {
		name       string
		req        agent.ExecRequest
		wantOut    []string
		wantErrOut []string
		wantCode   int
	}{
		{
			name:       "shell stdout stderr and exit code",
			req:        agent.ExecRequest{Cmd: []string{"echo hello; echo oops >&2; exit 3"}, Shell: true},
			wantOut:    []string{"hello"},
			wantErrOut: []string{"oops"},
			wantCode:   3,
		},
		{
			name:    "argv looked up in PATH, last line without newline",
			req:     agent.ExecRequest{Cmd: []string{"printf", "a\\n\\nb"}},
			wantOut: []string{"a", "", "b"},
		},
		{
			name:    "default environment plus overrides",
			req:     agent.ExecRequest{Cmd: []string{`echo "$FOO|$HOME|$USER|$LOGNAME|$LANG|$TERM|$PATH"`}, Shell: true, Env: map[string]string{"FOO": "bar baz"}},
			wantOut: []string{"bar baz|/root|root|root|C.UTF-8|xterm|" + defaultPath},
		},
		{
			name:    "env overrides a default",
			req:     agent.ExecRequest{Cmd: []string{`echo "$LANG"`}, Shell: true, Env: map[string]string{"LANG": "en_US.UTF-8"}},
			wantOut: []string{"en_US.UTF-8"},
		},
		{
			name:    "workdir",
			req:     agent.ExecRequest{Cmd: []string{"pwd"}, Workdir: "/usr/bin/../lib"},
			wantOut: []string{"/usr/lib"},
		},
		{
			name:    "root defaults to its home",
			req:     agent.ExecRequest{Cmd: []string{"pwd"}},
			wantOut: []string{"/root"},
		},
		{
			name:    "other user, home missing so workdir is /",
			req:     agent.ExecRequest{Cmd: []string{"id -u; id -g; pwd; echo $USER $HOME"}, Shell: true, User: "nobody"},
			wantOut: []string{"65534", "65534", "/", "nobody /nonexistent"},
		},
		{
			name:     "death by signal is 128+signo",
			req:      agent.ExecRequest{Cmd: []string{"kill -TERM $$"}, Shell: true},
			wantCode: 128 + int(syscall.SIGTERM),
		},
		{
			name:     "failing argv command",
			req:      agent.ExecRequest{Cmd: []string{"false"}},
			wantCode: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := runExec(t, c, tt.req)
			if res.pid <= 0 {
				t.Errorf("no pid event first: %+v", res.events)
			}
			if res.exitCode != tt.wantCode {
				t.Errorf("exit code = %d, want %d (error %q, stderr %q)", res.exitCode, tt.wantCode, res.errMsg, res.stderr)
			}
			if !slices.Equal(res.stdout, tt.wantOut) {
				t.Errorf("stdout = %q, want %q", res.stdout, tt.wantOut)
			}
			if !slices.Equal(res.stderr, tt.wantErrOut) {
				t.Errorf("stderr = %q, want %q", res.stderr, tt.wantErrOut)
			}
		})
	}
}

func TestExecEventOrder(t *testing.T) {
	c := newClient(t)
	res := runExec(t, c, agent.ExecRequest{Cmd: []string{"echo x"}, Shell: true})
	if n := len(res.events); n != 3 {
		t.Fatalf("got %d events, want pid, line, exit: %+v", n, res.events)
	}
	if res.events[0].Pid == nil || res.events[2].ExitCode == nil {
		t.Errorf("events = %+v, want pid first and exitCode last", res.events)
	}
}

func TestExecStartFailures(t *testing.T) {
	c := newClient(t)
	dir := testDir(t)
	notExec := filepath.Join(dir, "data.txt")
	if err := os.WriteFile(notExec, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		cmd      []string
		wantCode int
	}{
		{"unknown binary in PATH", []string{"no-such-binary-lizard"}, 127},
		{"missing absolute path", []string{filepath.Join(dir, "missing")}, 127},
		{"file without execute bit", []string{notExec}, 126},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := runExec(t, c, agent.ExecRequest{Cmd: tt.cmd})
			if res.exitCode != tt.wantCode || res.errMsg == "" {
				t.Errorf("exit %d error %q, want %d with an error", res.exitCode, res.errMsg, tt.wantCode)
			}
			if res.pid != 0 {
				t.Errorf("got pid %d for a command that never started", res.pid)
			}
		})
	}
}

func TestExecPathFromRequestEnv(t *testing.T) {
	c := newClient(t)
	dir := testDir(t)
	script := filepath.Join(dir, "hello-lizard")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho from-script\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	res := runExec(t, c, agent.ExecRequest{Cmd: []string{"hello-lizard"}, Env: map[string]string{"PATH": dir + ":/bin"}})
	if res.exitCode != 0 || res.out() != "from-script" {
		t.Fatalf("exit %d stdout %q error %q", res.exitCode, res.stdout, res.errMsg)
	}
}

func TestExecInvalidRequests(t *testing.T) {
	c := newClient(t)
	tests := []struct {
		name    string
		req     agent.ExecRequest
		wantMsg string
	}{
		{"empty cmd", agent.ExecRequest{}, "cmd"},
		{"shell with two elements", agent.ExecRequest{Cmd: []string{"echo", "x"}, Shell: true}, "exactly one"},
		{"unknown user", agent.ExecRequest{Cmd: []string{"true"}, User: "no-such-user-lizard"}, "no-such-user-lizard"},
		{"missing workdir", agent.ExecRequest{Cmd: []string{"true"}, Workdir: "/no/such/dir"}, "/no/such/dir"},
		{"relative workdir", agent.ExecRequest{Cmd: []string{"true"}, Workdir: "tmp"}, "not absolute"},
		{"workdir is a file", agent.ExecRequest{Cmd: []string{"true"}, Workdir: "/etc/passwd"}, "not a directory"},
		{"bad env name", agent.ExecRequest{Cmd: []string{"true"}, Env: map[string]string{"A=B": "x"}}, "A=B"},
		{"negative timeout", agent.ExecRequest{Cmd: []string{"true"}, TimeoutMs: -1}, "timeoutMs"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tryExec(testContext(t), c, tt.req)
			wantClass(t, err, errdefs.ErrInvalid)
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("error %q does not mention %q", err, tt.wantMsg)
			}
		})
	}
}

func TestExecDoesNotLeakAgentToken(t *testing.T) {
	c := newClient(t)
	t.Setenv(agent.EnvToken, "super-secret")
	res := runExec(t, c, agent.ExecRequest{Cmd: []string{"env"}})
	for _, l := range res.stdout {
		if strings.Contains(l, agent.EnvToken) || strings.Contains(l, "super-secret") {
			t.Fatalf("child environment holds the token: %q", l)
		}
	}
}

func TestExecLongLines(t *testing.T) {
	c := newClient(t)
	const n = 150_000
	res := runExec(t, c, agent.ExecRequest{
		Cmd:   []string{"head -c 150000 /dev/zero | tr '\\0' a; echo; head -c 150000 /dev/zero | tr '\\0' b >&2"},
		Shell: true,
	})
	if res.exitCode != 0 {
		t.Fatalf("exit %d", res.exitCode)
	}
	if len(res.stdout) != 1 || res.stdout[0] != strings.Repeat("a", n) {
		t.Errorf("stdout: got %d lines, first of length %d; want one line of %d", len(res.stdout), lenFirst(res.stdout), n)
	}
	if len(res.stderr) != 1 || res.stderr[0] != strings.Repeat("b", n) {
		t.Errorf("stderr: got %d lines, first of length %d; want one line of %d", len(res.stderr), lenFirst(res.stderr), n)
	}
}

func lenFirst(lines []string) int {
	if len(lines) == 0 {
		return -1
	}
	return len(lines[0])
}

func TestExecManyLines(t *testing.T) {
	c := newClient(t)
	res := runExec(t, c, agent.ExecRequest{Cmd: []string{"seq", "1", "20000"}})
	if len(res.stdout) != 20000 || res.stdout[19999] != "20000" {
		t.Fatalf("got %d lines", len(res.stdout))
	}
}

// A background child keeps the output pipes open; the stream must still end
// once the main process has exited, and the child must keep running.
func TestExecBackgroundChildDoesNotHoldStream(t *testing.T) {
	c := newClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := tryExec(ctx, c, agent.ExecRequest{Cmd: []string{"sleep 100 & echo $!"}, Shell: true})
	if err != nil {
		t.Fatalf("stream did not end after the main process exited: %v", err)
	}
	if res.exitCode != 0 || len(res.stdout) != 1 {
		t.Fatalf("exit %d stdout %q", res.exitCode, res.stdout)
	}
	bg, err := strconv.Atoi(res.stdout[0])
	if err != nil {
		t.Fatal(err)
	}
	killAtEnd(t, bg)
	if gone(bg) {
		t.Fatalf("background child %d was killed when the command ended", bg)
	}
}

// Output of a background child after the stream has ended must not kill it
// (SIGPIPE): the agent keeps draining the pipe.
func TestExecBackgroundChildMayWriteLater(t *testing.T) {
	c := newClient(t)
	res := runExec(t, c, agent.ExecRequest{
		Cmd:   []string{"(sleep 0.5; i=0; while [ $i -lt 2000 ]; do echo late; i=$((i+1)); done; sleep 100) & echo $!"},
		Shell: true,
	})
	bg, err := strconv.Atoi(res.out())
	if err != nil {
		t.Fatalf("stdout %q: %v", res.stdout, err)
	}
	killAtEnd(t, -res.pid) // the subshell and its sleep are in the command's group
	time.Sleep(1500 * time.Millisecond)
	if gone(bg) {
		t.Fatalf("background child %d died after writing to its stdout", bg)
	}
}

func TestExecTimeoutKillsTree(t *testing.T) {
	c := newClient(t)
	script := "sleep 100 & echo $!; setsid sleep 100 & echo $!; sh -c 'sleep 100' & echo $!; sleep 100"
	res := runExec(t, c, agent.ExecRequest{Cmd: []string{script}, Shell: true, TimeoutMs: 500})
	if res.exitCode != 124 || res.errMsg != "timeout" {
		t.Fatalf("exit %d error %q, want 124 timeout", res.exitCode, res.errMsg)
	}
	if len(res.stdout) != 3 {
		t.Fatalf("stdout %q, want three pids", res.stdout)
	}
	for _, s := range res.stdout {
		pid, err := strconv.Atoi(s)
		if err != nil {
			t.Fatal(err)
		}
		killAtEnd(t, pid)
		waitGone(t, pid)
	}
	waitGone(t, res.pid)
}

func TestExecTimeoutNotHitByFastCommand(t *testing.T) {
	c := newClient(t)
	res := runExec(t, c, agent.ExecRequest{Cmd: []string{"echo", "quick"}, TimeoutMs: 10_000})
	if res.exitCode != 0 || res.errMsg != "" || res.out() != "quick" {
		t.Fatalf("exit %d error %q stdout %q", res.exitCode, res.errMsg, res.stdout)
	}
}

// Dropping the stream (client gone) must leave the command running and in
// the process table.
func TestExecSurvivesClientDisconnect(t *testing.T) {
	c := newClient(t)
	ctx := testContext(t)
	errStop := errors.New("stop reading")
	pid := 0
	err := c.Exec(ctx, agent.ExecRequest{Cmd: []string{"sleep", "100"}, Tag: "detached"}, func(ev agent.Event) error {
		if ev.Pid != nil {
			pid = *ev.Pid
			return errStop
		}
		return nil
	})
	if !errors.Is(err, errStop) {
		t.Fatalf("Exec = %v, want the callback's error", err)
	}
	killAtEnd(t, pid)
	time.Sleep(300 * time.Millisecond)
	if gone(pid) {
		t.Fatalf("command %d died when its client went away", pid)
	}
	if p := findProcess(t, c, pid); p == nil || p.Tag != "detached" {
		t.Fatalf("process %d not in the table after disconnect: %+v", pid, p)
	}
	if err := c.Signal(ctx, pid, "SIGKILL"); err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid)
	waitNotListed(t, c, pid)
}

func findProcess(t *testing.T, c *agent.Client, pid int) *agent.Process {
	t.Helper()
	ps, err := c.Processes(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	for i := range ps {
		if ps[i].Pid == pid {
			return &ps[i]
		}
	}
	return nil
}

func waitNotListed(t *testing.T, c *agent.Client, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for findProcess(t, c, pid) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("process %d still listed after it ended", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A client that reads slowly must still get every line a command wrote
// before it exited, however long the pipe sits full.
func TestExecSlowClientLosesNothing(t *testing.T) {
	c := newClient(t)
	lines := 0
	paused := false
	err := c.Exec(testContext(t), agent.ExecRequest{Cmd: []string{"seq", "1", "200000"}}, func(ev agent.Event) error {
		if ev.Line == nil {
			return nil
		}
		lines++
		if !paused {
			paused = true
			time.Sleep(3 * time.Second) // longer than the agent's drain limits
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if lines != 200000 {
		t.Fatalf("got %d lines, want 200000", lines)
	}
}
