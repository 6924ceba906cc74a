package server

import (
	"bufio"
	"errors"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/lizard-build/lizard/internal/agent"
)

const (
	// drainGrace is how long output may pause, once the main process has
	// exited, before the stream ends. Whatever the main process wrote is
	// already in the pipe; only background children (`sleep 100 &`) that
	// inherited the pipe can still write, and they must not hold the stream.
	drainGrace = 100 * time.Millisecond
	// drainMax caps the drain after exit even if background children keep
	// writing without pause.
	drainMax = 2 * time.Second
	// maxLine splits longer lines into several events so that one endless
	// line cannot exhaust memory.
	maxLine = 1 << 20
	// readBuffer is the line reader's buffer; longer lines are assembled.
	readBuffer = 64 << 10
)

// job is one running exec: its output pumps and its exit.
type job struct {
	pid    int
	status <-chan syscall.WaitStatus
	stdout *os.File
	stderr *os.File
	events chan agent.Event
	bg     *bgLog // where output written after the stream ended goes

	pumps    sync.WaitGroup // done when both pumps stop emitting
	exitedAt atomic.Int64   // unix ns of the main process's exit; 0 while running
	timedOut atomic.Bool
}

func newJob(pid int, status <-chan syscall.WaitStatus, stdout, stderr *os.File, bg *bgLog) *job {
	return &job{
		bg:     bg,
		pid:    pid,
		status: status,
		stdout: stdout,
		stderr: stderr,
		events: make(chan agent.Event, eventBuffer),
	}
}

func (j *job) startPumps() {
	j.pumps.Add(2)
	go j.pump(j.stdout, "stdout")
	go j.pump(j.stderr, "stderr")
}

// finish is called with the main process's wait status: it lets the pumps
// drain, then sends the exit event and closes the stream.
func (j *job) finish(ws syscall.WaitStatus) agent.Event {
	j.exitedAt.Store(time.Now().UnixNano())
	// Wake reads that began before the exit; from now on each read waits at
	// most drainGrace. Errors mean the pump already closed its pipe at EOF.
	d := time.Now().Add(drainGrace)
	_ = j.stdout.SetReadDeadline(d)
	_ = j.stderr.SetReadDeadline(d)
	j.pumps.Wait()

	code := exitCode(ws)
	ev := agent.Event{ExitCode: &code}
	if j.timedOut.Load() {
		code = 124
		ev.Error = "timeout"
	}
	j.events <- ev
	close(j.events)
	return ev
}

// pump turns one pipe into line events until EOF or, after the main
// process exited, until the pipe stays idle for drainGrace. Then the pipe is
// still held by background children: it keeps reading until EOF, so they
// never die of SIGPIPE, and keeps what they write in the background log.
func (j *job) pump(f *os.File, stream string) {
	defer f.Close()
	dr := &drainReader{f: f, exitedAt: &j.exitedAt}
	br := bufio.NewReaderSize(dr, readBuffer)
	err := splitLines(br, func(line string, partial bool) {
		j.send(dr, agent.Event{Stream: stream, Line: &line, Partial: partial})
	})
	j.pumps.Done()
	if errors.Is(err, os.ErrDeadlineExceeded) {
		_ = f.SetReadDeadline(time.Time{})
		if j.bg == nil {
			_, _ = io.Copy(io.Discard, f)
			return
		}
		_ = splitLines(bufio.NewReaderSize(f, readBuffer), func(line string, _ bool) {
			j.bg.add(j.pid, stream, line)
		})
	}
}

// drainReader reads one pipe. After the main process's exit every read gets
// a deadline drainGrace away, so a read that times out proves the pipe was
// idle that long; the deadline is set per read because the pump may have
// been blocked on a slow client in between, while the pipe still held data.
// Reading ends at the latest drainMax after the exit, not counting time spent
// waiting for the client, so that a background child writing without pause
// cannot hold the stream forever.
type drainReader struct {
	f        *os.File
	exitedAt *atomic.Int64 // unix ns of the main process's exit; 0 while running
	paused   time.Duration // time after the exit spent waiting for the client
}

func (d *drainReader) Read(p []byte) (int, error) {
	if exited := d.exitedAt.Load(); exited != 0 {
		now := time.Now()
		hard := time.Unix(0, exited).Add(drainMax + d.paused)
		if !now.Before(hard) {
			return 0, os.ErrDeadlineExceeded
		}
		dl := now.Add(drainGrace)
		if dl.After(hard) {
			dl = hard
		}
		_ = d.f.SetReadDeadline(dl)
	}
	return d.f.Read(p)
}

// send hands an event to the stream, accounting in d for backpressure.
func (j *job) send(d *drainReader, ev agent.Event) {
	select {
	case j.events <- ev:
		return
	default:
	}
	start := time.Now()
	exited := j.exitedAt.Load() != 0
	j.events <- ev
	if exited {
		d.paused += time.Since(start)
	}
}

// splitLines calls emit for every line read from r, without its newline; a
// last line without newline is emitted as is, lines longer than maxLine in
// pieces, both marked partial. It returns the error that ended reading
// (io.EOF at a clean end).
func splitLines(r *bufio.Reader, emit func(line string, partial bool)) error {
	var pending []byte
	for {
		chunk, err := r.ReadSlice('\n')
		switch {
		case err == nil:
			chunk = chunk[:len(chunk)-1]
			if len(pending) == 0 {
				emit(string(chunk), false)
				continue
			}
			emit(string(append(pending, chunk...)), false)
			pending = pending[:0]
		case errors.Is(err, bufio.ErrBufferFull):
			pending = append(pending, chunk...)
			if len(pending) >= maxLine {
				emit(string(pending), true)
				pending = pending[:0]
			}
		default:
			pending = append(pending, chunk...)
			if len(pending) > 0 {
				emit(string(pending), true)
			}
			return err
		}
	}
}
