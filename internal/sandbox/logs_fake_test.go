package sandbox

import (
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/sandbox/sandboxtest"
)

// TestFakeLogs: a sandbox's log holds its lifecycle and what its commands
// printed, LogTail gives the last lines, and Logs follows new lines until
// the sandbox goes.
func TestFakeLogs(t *testing.T) {
	env := newFakeEnv(t)
	logDir := t.TempDir()
	s := env.service(t, func(c *Config) { c.LogDir = filepath.Join(logDir, "logs") })
	ctx := context.Background()
	rec := env.create(t, s, CreateRequest{})
	env.run(t, s, rec.ID, "echo first-line; echo second-line")
	lines, err := s.LogTail(ctx, env.Project.ID, rec.ID, 100)
	if err != nil {
		t.Fatal(err)
	}
	var all []string
	for _, l := range lines {
		all = append(all, l.Type+":"+l.Message)
	}
	joined := strings.Join(all, "\n")
	if !strings.Contains(joined, "stdout:first-line") || !strings.Contains(joined, "stdout:second-line") || !strings.Contains(joined, "lifecycle:") {
		t.Fatalf("log tail:\n%s", joined)
	}
	if last, _ := s.LogTail(ctx, env.Project.ID, rec.ID, 1); len(last) != 1 || last[0].Message != lines[len(lines)-1].Message {
		t.Fatalf("tail 1: %+v, want the last line %+v", last, lines[len(lines)-1])
	}
	if _, err := s.LogTail(ctx, "prj_other", rec.ID, 10); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another project's tail: %v, want ErrNotFound", err)
	}

	// Follow: a new command's output arrives, and the stream ends with the
	// sandbox.
	got := make(chan string, 100)
	done := make(chan error, 1)
	go func() {
		done <- s.Logs(ctx, env.Project.ID, rec.ID, 0, func(l LogLine) error {
			got <- l.Message
			return nil
		})
	}()
	time.Sleep(100 * time.Millisecond)
	env.run(t, s, rec.ID, "echo followed-line")
	for seen := false; !seen; {
		select {
		case m := <-got:
			seen = m == "followed-line"
		case <-time.After(10 * time.Second):
			t.Fatal("the followed line never came")
		}
	}
	if err := s.Kill(ctx, env.Project.ID, rec.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Logs did not end with its sandbox")
	}
}

// TestFakeStartProcessAndLoopback: a process started through the service
// streams its output from the agent; a server on the sandbox's loopback
// address is reached through the agent (the fake's loopback is the
// host's).
func TestFakeStartProcessAndLoopback(t *testing.T) {
	env := newFakeEnv(t)
	s := env.service(t, nil)
	ctx := context.Background()
	rec := env.create(t, s, CreateRequest{})
	ag, pid, err := s.StartProcess(ctx, env.Project.ID, rec.ID, agent.StartRequest{ExecRequest: agent.ExecRequest{Cmd: []string{"echo started; exit 3"}, Shell: true}})
	if err != nil || pid <= 0 {
		t.Fatalf("StartProcess: pid %d, %v", pid, err)
	}
	var out strings.Builder
	exit := -1
	if err := ag.Output(ctx, pid, func(o agent.Output) error {
		out.Write(o.Data)
		if o.ExitCode != nil {
			exit = *o.ExitCode
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if out.String() != "started\n" || exit != 3 {
		t.Fatalf("process output %q exit %d, want started and 3", out.String(), exit)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			io.WriteString(c, "from-loopback")
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	if _, err := s.DialLoopback(ctx, rec.ID, agent.Port); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("DialLoopback to the agent's port: %v, want ErrInvalid", err)
	}
	c, err := s.DialLoopback(ctx, rec.ID, port)
	if err != nil {
		t.Fatalf("DialLoopback: %v", err)
	}
	b, _ := io.ReadAll(c)
	c.Close()
	if string(b) != "from-loopback" {
		t.Fatalf("through the loopback dial: %q", b)
	}
	if err := s.Pause(ctx, env.Project.ID, rec.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DialLoopback(ctx, rec.ID, port); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("DialLoopback of a paused sandbox: %v, want ErrUnavailable", err)
	}
}

// TestFakeDestroyLost: DestroyLost destroys what keep rejects, as a kill
// does.
func TestFakeDestroyLost(t *testing.T) {
	env := newFakeEnv(t)
	s := env.service(t, nil)
	ctx := context.Background()
	a := env.create(t, s, CreateRequest{})
	b := env.create(t, s, CreateRequest{})
	lost := s.DestroyLost(ctx, func(id string) bool { return id != b.ID })
	if len(lost) != 1 || lost[0] != b.ID {
		t.Fatalf("DestroyLost: %v, want [%s]", lost, b.ID)
	}
	sandboxtest.Eventually(t, "the lost sandbox to go", env.gone(s, b.ID))
	if _, err := s.Get(env.Project.ID, a.ID); err != nil {
		t.Fatalf("the kept sandbox: %v", err)
	}
}
