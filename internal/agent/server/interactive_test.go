package server_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/errdefs"
)

// reader is one attachment to a process's output, collected in the
// background.
type reader struct {
	mu      sync.Mutex
	streams map[string]*bytes.Buffer
	dropped int64
	exit    *int
	errMsg  string
	done    chan error // the Output call's result
}

func attach(ctx context.Context, c *agent.Client, pid int) *reader {
	r := &reader{streams: map[string]*bytes.Buffer{}, done: make(chan error, 1)}
	go func() {
		r.done <- c.Output(ctx, pid, func(o agent.Output) error {
			r.mu.Lock()
			defer r.mu.Unlock()
			switch {
			case o.ExitCode != nil:
				r.exit, r.errMsg = o.ExitCode, o.Error
			case o.Dropped > 0:
				r.dropped += o.Dropped
			default:
				if r.streams[o.Stream] == nil {
					r.streams[o.Stream] = &bytes.Buffer{}
				}
				r.streams[o.Stream].Write(o.Data)
			}
			return nil
		})
	}()
	return r
}

func (r *reader) text(stream string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if b := r.streams[stream]; b != nil {
		return b.String()
	}
	return ""
}

// waitOutput waits until stream holds want (counted from offset from on)
// and returns the offset after it.
func (r *reader) waitOutput(t *testing.T, stream string, from int, want string) int {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		s := r.text(stream)
		if from <= len(s) {
			if i := strings.Index(s[from:], want); i >= 0 {
				return from + i + len(want)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %q in %s output after offset %d; have %q", want, stream, from, s)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// wait waits for the end of the stream and returns the exit code.
func (r *reader) wait(t *testing.T) int {
	t.Helper()
	select {
	case err := <-r.done:
		if err != nil {
			t.Fatalf("Output: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("output stream did not end")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.exit == nil {
		t.Fatal("stream ended without exit code")
	}
	return *r.exit
}

func startProc(t *testing.T, c *agent.Client, req agent.StartRequest) int {
	t.Helper()
	pid, err := c.Start(testContext(t), req)
	if err != nil {
		t.Fatalf("Start(%q): %v", req.Cmd, err)
	}
	killAtEnd(t, -pid)
	return pid
}

func send(t *testing.T, c *agent.Client, pid int, s string) {
	t.Helper()
	if err := c.WriteStdin(testContext(t), pid, []byte(s)); err != nil {
		t.Fatalf("WriteStdin(%q): %v", s, err)
	}
}

// bashPty is an interactive bash on a pty with a known prompt.
func bashPty(cols, rows int) agent.StartRequest {
	return agent.StartRequest{
		ExecRequest: agent.ExecRequest{
			Cmd: []string{"bash", "--noprofile", "--norc", "-i"},
			Env: map[string]string{"PS1": "PROMPT> ", "TERM": "xterm-256color"},
		},
		Pty: &agent.PtySize{Cols: cols, Rows: rows},
	}
}

func TestPtyShell(t *testing.T) {
	c := newClient(t)
	ctx := testContext(t)
	pid := startProc(t, c, bashPty(80, 24))
	r := attach(ctx, c, pid)
	off := r.waitOutput(t, "pty", 0, "PROMPT> ")

	send(t, c, pid, "echo $((6*7)) $TERM; tty\n")
	off = r.waitOutput(t, "pty", off, "42 xterm-256color")
	off = r.waitOutput(t, "pty", off, "/dev/pts/")

	send(t, c, pid, "stty size\n")
	off = r.waitOutput(t, "pty", off, "24 80")

	if err := c.Resize(ctx, pid, 132, 40); err != nil {
		t.Fatalf("Resize: %v", err)
	}
	send(t, c, pid, "stty size\n")
	off = r.waitOutput(t, "pty", off, "40 132")

	// Ctrl-C as a byte: the line discipline interrupts the foreground job
	// and the shell goes on.
	send(t, c, pid, "sleep 100\n")
	off = r.waitOutput(t, "pty", off, "sleep 100")
	time.Sleep(300 * time.Millisecond) // let sleep become the foreground job
	send(t, c, pid, "\x03")
	off = r.waitOutput(t, "pty", off, "PROMPT> ")
	send(t, c, pid, "echo status=$?\n")
	off = r.waitOutput(t, "pty", off, "status=130")

	send(t, c, pid, "exit 3\n")
	if code := r.wait(t); code != 3 {
		t.Fatalf("exit code = %d, want 3; output %q", code, r.text("pty")[off:])
	}
	waitGone(t, pid)
}

func TestPtyBadSize(t *testing.T) {
	c := newClient(t)
	req := bashPty(0, 24)
	_, err := c.Start(testContext(t), req)
	wantClass(t, err, errdefs.ErrInvalid)
}

func TestProcessManyReadersAndLateReader(t *testing.T) {
	c := newClient(t)
	ctx := testContext(t)
	pid := startProc(t, c, agent.StartRequest{
		ExecRequest: agent.ExecRequest{Cmd: []string{`echo one; read x; echo "got $x"; exit 5`}, Shell: true},
		Pty:         &agent.PtySize{Cols: 80, Rows: 24},
	})
	a, b := attach(ctx, c, pid), attach(ctx, c, pid)
	a.waitOutput(t, "pty", 0, "one")
	b.waitOutput(t, "pty", 0, "one")
	send(t, c, pid, "two\n")
	for _, r := range []*reader{a, b} {
		if code := r.wait(t); code != 5 {
			t.Fatalf("exit = %d, want 5", code)
		}
		r.waitOutput(t, "pty", 0, "got two")
	}
	// A reader attaching after the exit still gets the output and status.
	late := attach(ctx, c, pid)
	if code := late.wait(t); code != 5 {
		t.Fatalf("late reader: exit = %d, want 5", code)
	}
	if got, want := late.text("pty"), a.text("pty"); got != want {
		t.Fatalf("late reader got %q, first reader %q", got, want)
	}
	// Input after the exit is refused.
	err := c.WriteStdin(ctx, pid, []byte("x"))
	wantClass(t, err, errdefs.ErrConflict)
}

func TestProcessStdinPipe(t *testing.T) {
	c := newClient(t)
	ctx := testContext(t)
	pid := startProc(t, c, agent.StartRequest{
		ExecRequest: agent.ExecRequest{Cmd: []string{`cat; echo done >&2`}, Shell: true},
		Stdin:       true,
	})
	r := attach(ctx, c, pid)
	send(t, c, pid, "hello\n")
	r.waitOutput(t, "stdout", 0, "hello\n")
	send(t, c, pid, "world")
	if err := c.CloseStdin(ctx, pid); err != nil {
		t.Fatalf("CloseStdin: %v", err)
	}
	if code := r.wait(t); code != 0 {
		t.Fatalf("exit = %d, want 0", code)
	}
	if got := r.text("stdout"); got != "hello\nworld" {
		t.Fatalf("stdout = %q", got)
	}
	if got := r.text("stderr"); got != "done\n" {
		t.Fatalf("stderr = %q", got)
	}
	ps, err := c.Processes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if p.Pid == pid {
			t.Fatalf("exited process %d still listed", pid)
		}
	}
}

func TestProcessInputErrors(t *testing.T) {
	c := newClient(t)
	ctx := testContext(t)
	pid := startProc(t, c, agent.StartRequest{ExecRequest: agent.ExecRequest{Cmd: []string{"sleep", "100"}}})

	tests := []struct {
		name string
		call func() error
		want error
	}{
		{"write without stdin", func() error { return c.WriteStdin(ctx, pid, []byte("x")) }, errdefs.ErrConflict},
		{"resize without pty", func() error { return c.Resize(ctx, pid, 80, 24) }, errdefs.ErrInvalid},
		{"unknown pid output", func() error { return c.Output(ctx, 999999, func(agent.Output) error { return nil }) }, errdefs.ErrNotFound},
		{"unknown pid stdin", func() error { return c.WriteStdin(ctx, 999999, nil) }, errdefs.ErrNotFound},
		{"unknown pid resize", func() error { return c.Resize(ctx, 999999, 80, 24) }, errdefs.ErrNotFound},
		{"bad pid", func() error { return c.CloseStdin(ctx, -4) }, errdefs.ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { wantClass(t, tt.call(), tt.want) })
	}

	ps, err := c.Processes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, p := range ps {
		found = found || p.Pid == pid
	}
	if !found {
		t.Fatalf("process %d not in %+v", pid, ps)
	}
}

// A reader that goes away does not end the process; a signal does.
func TestProcessOutlivesReader(t *testing.T) {
	c := newClient(t)
	ctx := testContext(t)
	pid := startProc(t, c, bashPty(80, 24))
	rctx, cancel := context.WithCancel(ctx)
	r := attach(rctx, c, pid)
	r.waitOutput(t, "pty", 0, "PROMPT> ")
	cancel()
	if err := <-r.done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Output after cancel: %v, want context.Canceled", err)
	}
	again := attach(ctx, c, pid)
	send(t, c, pid, "echo still here\n")
	again.waitOutput(t, "pty", 0, "still here")
	if err := c.Signal(ctx, pid, "SIGKILL"); err != nil {
		t.Fatalf("Signal: %v", err)
	}
	if code := again.wait(t); code != 137 {
		t.Fatalf("exit = %d, want 137", code)
	}
}

// Output beyond what the agent keeps is reported as dropped, to the byte.
func TestProcessDroppedOutput(t *testing.T) {
	c := newClient(t)
	ctx := testContext(t)
	const total = 3 * agent.MaxKeptOutput
	pid := startProc(t, c, agent.StartRequest{
		ExecRequest: agent.ExecRequest{Cmd: []string{"head", "-c", "3145728", "/dev/zero"}},
	})
	first := attach(ctx, c, pid)
	first.wait(t)
	late := attach(ctx, c, pid)
	late.wait(t)
	got := int64(len(late.text("stdout")))
	if late.dropped == 0 || got+late.dropped != total || got > agent.MaxKeptOutput {
		t.Fatalf("late reader: %d bytes + %d dropped, want some dropped, at most %d kept, %d in all", got, late.dropped, agent.MaxKeptOutput, total)
	}
	if n := int64(len(first.text("stdout"))) + first.dropped; n != total {
		t.Fatalf("first reader: %d bytes + %d dropped, want %d", len(first.text("stdout")), first.dropped, total)
	}
}

func TestProcessTimeout(t *testing.T) {
	c := newClient(t)
	pid := startProc(t, c, agent.StartRequest{
		ExecRequest: agent.ExecRequest{Cmd: []string{"sleep", "100"}, TimeoutMs: 200},
		Pty:         &agent.PtySize{Cols: 80, Rows: 24},
	})
	r := attach(testContext(t), c, pid)
	if code := r.wait(t); code != 124 || r.errMsg != "timeout" {
		t.Fatalf("exit = %d %q, want 124 timeout", code, r.errMsg)
	}
}
