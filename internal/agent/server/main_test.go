package server_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/agent/server"
)

const testToken = "test-token"

// TestMain also serves as the __fileop child: the server re-executes
// /proc/self/exe, which in tests is this test binary.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == server.FileOpCommand {
		os.Exit(server.FileOpMain(os.Args[2:]))
	}
	go clearPyenvLocks()
	os.Exit(m.Run())
}

// clearPyenvLocks removes, while the tests run, a pyenv rehash lock older
// than 5 s. On hosts where root's shell profile runs `pyenv rehash` (it
// sources pyenv's init), the tests' login shells run it too; one the tests
// kill mid-rehash leaves the lock behind, and every later login shell of
// root waits 60 s on it (the tests see no output and time out). A rehash
// holds it for well under a second; the shells waiting on a stale one are
// rehashes too, so its age is what tells.
func clearPyenvLocks() {
	root := os.Getenv("PYENV_ROOT")
	if root == "" {
		root = "/root/.pyenv"
	}
	lock := filepath.Join(root, "shims", ".pyenv-shim")
	for range time.Tick(time.Second) {
		if fi, err := os.Stat(lock); err == nil && time.Since(fi.ModTime()) > 5*time.Second {
			os.Remove(lock)
		}
	}
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: agent server tests need root (they run commands and file operations as other users)")
	}
}

// newTestServer runs a server on loopback; background goroutines may log
// after the test ends, so the log goes to stderr, not t.Log.
func newTestServer(t *testing.T) *httptest.Server {
	t.Helper()
	requireRoot(t)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	srv, err := server.New(server.Config{Token: testToken, Logger: log})
	if err != nil {
		t.Fatalf("server.New: %v", err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	return ts
}

func newClient(t *testing.T) *agent.Client {
	t.Helper()
	ts := newTestServer(t)
	return agent.NewClient(ts.URL, testToken, ts.Client())
}

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// execResult collects one exec stream.
type execResult struct {
	pid      int
	stdout   []string
	stderr   []string
	exitCode int
	errMsg   string
	events   []agent.Event
}

func (r execResult) out() string { return strings.Join(r.stdout, "\n") }

func runExec(t *testing.T, c *agent.Client, req agent.ExecRequest) execResult {
	t.Helper()
	res, err := tryExec(testContext(t), c, req)
	if err != nil {
		t.Fatalf("Exec(%q): %v", req.Cmd, err)
	}
	return res
}

func tryExec(ctx context.Context, c *agent.Client, req agent.ExecRequest) (execResult, error) {
	res := execResult{exitCode: -1}
	err := c.Exec(ctx, req, func(ev agent.Event) error {
		res.events = append(res.events, ev)
		switch {
		case ev.Pid != nil:
			res.pid = *ev.Pid
		case ev.Line != nil && ev.Stream == "stdout":
			res.stdout = append(res.stdout, *ev.Line)
		case ev.Line != nil && ev.Stream == "stderr":
			res.stderr = append(res.stderr, *ev.Line)
		case ev.ExitCode != nil:
			res.exitCode = *ev.ExitCode
			res.errMsg = ev.Error
		}
		return nil
	})
	return res, err
}

// gone says whether pid no longer runs (absent, or a zombie).
func gone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] == 'Z'
	}
	return false
}

func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !gone(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("process %d still runs", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// killAtEnd makes sure a background process (or, for -pgid, a process
// group) a test started dies with it.
func killAtEnd(t *testing.T, pid int) {
	t.Cleanup(func() {
		if pid > 1 || pid < -1 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
}

// testDir is a fresh directory that every user may traverse.
func testDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "lizard-agent-test-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// wantClass fails unless err wraps class.
func wantClass(t *testing.T, err, class error) {
	t.Helper()
	if !errors.Is(err, class) {
		t.Fatalf("error = %v, want one wrapping %v", err, class)
	}
}
