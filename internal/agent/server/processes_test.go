package server_test

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/errdefs"
)

// startBackground runs req in the background and returns the main pid, the
// first stdout line, and a channel with the final result.
func startBackground(t *testing.T, c *agent.Client, req agent.ExecRequest) (int, string, <-chan execResult) {
	t.Helper()
	type first struct {
		pid  int
		line string
	}
	firstc := make(chan first, 1)
	done := make(chan execResult, 1)
	go func() {
		var once sync.Once
		res := execResult{exitCode: -1}
		err := c.Exec(testContext(t), req, func(ev agent.Event) error {
			switch {
			case ev.Pid != nil:
				res.pid = *ev.Pid
			case ev.Line != nil && ev.Stream == "stdout":
				res.stdout = append(res.stdout, *ev.Line)
				once.Do(func() { firstc <- first{res.pid, *ev.Line} })
			case ev.ExitCode != nil:
				res.exitCode = *ev.ExitCode
				res.errMsg = ev.Error
			}
			return nil
		})
		if err != nil {
			res.errMsg = err.Error()
		}
		once.Do(func() { firstc <- first{res.pid, ""} })
		done <- res
	}()
	select {
	case f := <-firstc:
		if f.pid > 0 {
			killAtEnd(t, f.pid)
		}
		return f.pid, f.line, done
	case <-time.After(30 * time.Second):
		t.Fatal("command printed nothing")
	}
	return 0, "", nil
}

func waitResult(t *testing.T, done <-chan execResult) execResult {
	t.Helper()
	select {
	case res := <-done:
		return res
	case <-time.After(30 * time.Second):
		t.Fatal("exec stream did not end")
	}
	return execResult{}
}

func TestProcessTable(t *testing.T) {
	c := newClient(t)
	script := "echo started; sleep 100"
	pid, _, done := startBackground(t, c, agent.ExecRequest{Cmd: []string{script}, Shell: true, Tag: "web", Workdir: "/tmp"})
	p := findProcess(t, c, pid)
	if p == nil {
		t.Fatalf("pid %d not listed", pid)
	}
	want := agent.Process{Pid: pid, Cmd: []string{"/bin/sh", "-c", script}, Command: script, Cwd: "/tmp", Tag: "web"}
	if p.Pid != want.Pid || strings.Join(p.Cmd, "\x00") != strings.Join(want.Cmd, "\x00") ||
		p.Command != want.Command || p.Cwd != want.Cwd || p.Tag != want.Tag {
		t.Errorf("process = %+v, want %+v", *p, want)
	}
	started, err := time.Parse(time.RFC3339, p.StartedAt)
	if err != nil || time.Since(started) > time.Minute || !strings.HasSuffix(p.StartedAt, "Z") {
		t.Errorf("startedAt %q is not a recent RFC 3339 UTC time (%v)", p.StartedAt, err)
	}

	argvPid, _, argvDone := startBackground(t, c, agent.ExecRequest{Cmd: []string{"sh", "-c", "echo go; exec sleep 100"}})
	if p := findProcess(t, c, argvPid); p == nil || p.Command != "sh -c echo go; exec sleep 100" || p.Cwd != "/root" {
		t.Errorf("argv process = %+v", p)
	}

	for _, pid := range []int{pid, argvPid} {
		if err := c.Signal(testContext(t), pid, "SIGKILL"); err != nil {
			t.Fatal(err)
		}
	}
	waitResult(t, done)
	waitResult(t, argvDone)
	waitNotListed(t, c, pid)
	waitNotListed(t, c, argvPid)
}

func TestProcessesEmptyIsJSONArray(t *testing.T) {
	ts := newTestServer(t)
	req, _ := http.NewRequest(http.MethodGet, ts.URL+"/processes", nil)
	req.Header.Set(agent.TokenHeader, testToken)
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || strings.TrimSpace(string(b)) != "[]" {
		t.Fatalf("GET /processes = %d %q, want 200 []", resp.StatusCode, b)
	}
}

func TestSignalTree(t *testing.T) {
	tests := []struct {
		signal   string
		wantCode int
	}{
		{"SIGTERM", 128 + int(syscall.SIGTERM)},
		{"SIGKILL", 128 + int(syscall.SIGKILL)},
		// Not SIGINT: sh makes its background jobs ignore it.
		{"SIGHUP", 128 + int(syscall.SIGHUP)},
	}
	for _, tt := range tests {
		t.Run(tt.signal, func(t *testing.T) {
			c := newClient(t)
			// The child leaves the process group; only the tree walk finds it.
			script := "setsid sleep 100 & echo $!; sleep 100 & wait"
			pid, line, done := startBackground(t, c, agent.ExecRequest{Cmd: []string{script}, Shell: true})
			child, err := strconv.Atoi(line)
			if err != nil {
				t.Fatalf("first line %q: %v", line, err)
			}
			killAtEnd(t, child)
			if err := c.Signal(testContext(t), pid, tt.signal); err != nil {
				t.Fatalf("Signal: %v", err)
			}
			res := waitResult(t, done)
			if res.exitCode != tt.wantCode {
				t.Errorf("exit code %d, want %d", res.exitCode, tt.wantCode)
			}
			waitGone(t, child)
		})
	}
}

func TestSignalErrors(t *testing.T) {
	c := newClient(t)
	ctx := testContext(t)

	err := c.Signal(ctx, 999_999, "SIGTERM")
	wantClass(t, err, errdefs.ErrNotFound)

	err = c.Signal(ctx, 999_999, "SIGSTOP")
	wantClass(t, err, errdefs.ErrInvalid)
	if !strings.Contains(err.Error(), "SIGTERM") {
		t.Errorf("error %q does not list the allowed signals", err)
	}

	// A process that has ended is not signalled (its pid may be reused).
	res := runExec(t, c, agent.ExecRequest{Cmd: []string{"true"}})
	wantClass(t, c.Signal(ctx, res.pid, "SIGTERM"), errdefs.ErrNotFound)
}
