package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/creack/pty"

	"github.com/lizard-build/lizard/internal/agent"
)

// ioChunk is the most output one read takes from a pty or pipe.
const ioChunk = 32 << 10

// procIO is the agent's side of an interactive process (POST /processes):
// it owns the pty master or the stdin pipe and the output every reader
// attaches to.
type procIO struct {
	pid int
	out *outputLog
	// configEnv is the envs envd's Start was asked for (E2B's List shows
	// them); nil for the agent's own POST /processes. Set before the
	// process is published, then only read.
	configEnv map[string]string

	// inMu serializes input, so writes arrive whole and in order.
	inMu  sync.Mutex
	pty   *os.File // the master; nil without a pty
	stdin *os.File // the stdin pipe's write end; nil when absent or closed
	ended bool     // the process exited: input is refused

	exitedAt atomic.Int64 // unix ns of the exit; 0 while it runs
	timedOut atomic.Bool
	// status is the wait status, set before the output log's finish (whose
	// lock publishes it to readers that saw the exit).
	status syscall.WaitStatus
}

// ioTable holds the interactive processes, running or exited within
// agent.ExitedKeepSeconds.
type ioTable struct {
	mu sync.Mutex
	m  map[int]*procIO
}

func newIOTable() *ioTable { return &ioTable{m: make(map[int]*procIO)} }

func (t *ioTable) get(pid int) (*procIO, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := t.m[pid]
	if !ok {
		return nil, errNotFound("process %d was not started by POST /processes, or exited more than %d s ago", pid, agent.ExitedKeepSeconds)
	}
	return p, nil
}

func (t *ioTable) put(p *procIO) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.m[p.pid] = p
}

// forget drops p, unless its pid already names a newer process.
func (t *ioTable) forget(p *procIO) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m[p.pid] == p {
		delete(t.m, p.pid)
	}
}

func (s *Server) startProcess(w http.ResponseWriter, r *http.Request) error {
	var req agent.StartRequest
	if err := decodeJSON(w, r, maxExecBody, &req); err != nil {
		return err
	}
	p, err := s.startIO(req, nil)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, agent.StartReply{Pid: p.pid})
	return nil
}

// startIO starts an interactive process and enters it in the tables; the
// agent's own POST /processes and envd's Start share it. configEnv is
// procIO.configEnv.
func (s *Server) startIO(req agent.StartRequest, configEnv map[string]string) (*procIO, error) {
	if p := req.Pty; p != nil && (p.Cols < 1 || p.Cols > 65535 || p.Rows < 1 || p.Rows > 65535) {
		return nil, errInvalid("pty size %dx%d: cols and rows must be 1 to 65535", p.Cols, p.Rows)
	}
	spec, err := prepareExec(req.ExecRequest, s.accts, s.trustEnv)
	var se *startError
	if errors.As(err, &se) {
		// No stream to report an exit code in: the start itself fails.
		return nil, errInvalid("%s", se.msg)
	}
	if err != nil {
		return nil, err
	}
	p, pumps, status, err := s.spawnIO(spec, req)
	if errors.As(err, &se) {
		return nil, errInvalid("%s", se.msg)
	}
	if err != nil {
		return nil, err
	}
	p.configEnv = configEnv
	s.ios.put(p)
	s.procs.add(agent.Process{
		Pid:       p.pid,
		Cmd:       spec.argv,
		Command:   spec.command,
		Cwd:       spec.dir,
		Tag:       spec.tag,
		StartedAt: time.Now().UTC().Format(time.RFC3339),
		Pty:       req.Pty != nil,
		Stdin:     req.Pty == nil && req.Stdin,
	})
	s.log.Info("process started", "pid", p.pid, "user", spec.acct.name, "pty", req.Pty != nil, "stdin", req.Stdin)
	go s.superviseIO(p, pumps, status, spec.timeout)
	return p, nil
}

// spawnIO starts the process on a new pty, or on pipes, and returns it with
// the output sources to pump.
func (s *Server) spawnIO(spec *execSpec, req agent.StartRequest) (*procIO, map[string]*os.File, <-chan syscall.WaitStatus, error) {
	var (
		files   []*os.File // the child's 0, 1, 2
		toClose []*os.File // the child's ends, closed in the parent after the start
		pumps   = map[string]*os.File{}
		p       = &procIO{out: newOutputLog(agent.MaxKeptOutput)}
		sys     = &syscall.SysProcAttr{Credential: spec.acct.credential()}
	)
	fail := func(err error) (*procIO, map[string]*os.File, <-chan syscall.WaitStatus, error) {
		for _, f := range toClose {
			f.Close()
		}
		for _, f := range pumps {
			f.Close()
		}
		if p.stdin != nil {
			p.stdin.Close()
		}
		return nil, nil, nil, err
	}
	if req.Pty != nil {
		master, slave, err := pty.Open()
		if err != nil {
			return fail(fmt.Errorf("opening a pty: %w", err))
		}
		toClose = append(toClose, slave)
		pumps["pty"] = master
		p.pty = master
		if err := pty.Setsize(master, &pty.Winsize{Cols: uint16(req.Pty.Cols), Rows: uint16(req.Pty.Rows)}); err != nil {
			return fail(fmt.Errorf("setting the pty size: %w", err))
		}
		// The user owns their terminal, as after a login.
		if c := sys.Credential; c != nil {
			_ = os.Chown(slave.Name(), int(c.Uid), int(c.Gid))
		}
		files = []*os.File{slave, slave, slave}
		// A session of its own with the pty as controlling terminal:
		// job control works and Ctrl-C reaches the foreground job. The
		// session leader leads its process group too, so signals of the
		// tree find it as they find exec's.
		sys.Setsid, sys.Setctty, sys.Ctty = true, true, 0
	} else {
		in, err := os.Open(os.DevNull)
		if err != nil {
			return fail(fmt.Errorf("opening %s: %w", os.DevNull, err))
		}
		if req.Stdin {
			in.Close()
			var inW *os.File
			if in, inW, err = os.Pipe(); err != nil {
				return fail(fmt.Errorf("creating stdin pipe: %w", err))
			}
			p.stdin = inW
		}
		toClose = append(toClose, in)
		files = append(files, in)
		for _, stream := range []string{"stdout", "stderr"} {
			r, w, err := os.Pipe()
			if err != nil {
				return fail(fmt.Errorf("creating %s pipe: %w", stream, err))
			}
			pumps[stream] = r
			toClose = append(toClose, w)
			files = append(files, w)
		}
		sys.Setpgid = true
	}
	attr := &os.ProcAttr{Dir: spec.dir, Env: spec.env, Files: files, Sys: sys}
	pid, status, err := s.reaper.startProcess(spec.path, spec.argv, attr)
	if err != nil {
		return fail(startFailure(err, spec))
	}
	// The parent's copies of the child's ends must go, or the output never
	// ends.
	for _, f := range toClose {
		f.Close()
	}
	p.pid = pid
	return p, pumps, status, nil
}

// superviseIO pumps the output into the log, enforces the deadline, and
// records the exit once the output is drained.
func (s *Server) superviseIO(p *procIO, pumps map[string]*os.File, status <-chan syscall.WaitStatus, timeout time.Duration) {
	var wg sync.WaitGroup
	for stream, f := range pumps {
		wg.Add(1)
		go p.pump(f, stream, &wg)
	}
	defer s.killAfter(p.pid, timeout, &p.timedOut)()
	ws := <-status
	s.procs.remove(p.pid)
	p.exitedAt.Store(time.Now().UnixNano())
	d := time.Now().Add(drainGrace)
	for _, f := range pumps {
		_ = f.SetReadDeadline(d)
	}
	wg.Wait()

	p.inMu.Lock()
	p.ended = true
	if p.stdin != nil {
		p.stdin.Close()
		p.stdin = nil
	}
	p.inMu.Unlock()

	code, errMsg := exitCode(ws), ""
	if p.timedOut.Load() {
		code, errMsg = 124, "timeout"
	}
	p.status = ws
	p.out.finish(code, errMsg)
	s.log.Info("process ended", "pid", p.pid, "exitCode", code, "error", errMsg)
	time.AfterFunc(agent.ExitedKeepSeconds*time.Second, func() { s.ios.forget(p) })
}

// pump reads one output source into the log until EOF (for a pty: EIO,
// every slave closed) or, after the exit, until it stays idle for
// drainGrace. Background children may still hold it then: it reads on,
// discarding, so that they never block on a full pty or pipe.
func (p *procIO) pump(f *os.File, stream string, wg *sync.WaitGroup) {
	dr := &drainReader{f: f, exitedAt: &p.exitedAt}
	var err error
	for {
		buf := make([]byte, ioChunk)
		var n int
		n, err = dr.Read(buf)
		p.out.append(stream, buf[:n:n])
		if err != nil {
			break
		}
	}
	wg.Done()
	if errors.Is(err, os.ErrDeadlineExceeded) {
		_ = f.SetReadDeadline(time.Time{})
		_, _ = io.Copy(io.Discard, f)
	}
	// Writers hold inMu: a pty master is not closed under a write.
	if stream == "pty" {
		p.inMu.Lock()
		defer p.inMu.Unlock()
	}
	f.Close()
}

// attach streams the process's output as NDJSON agent.Output events: the
// kept output, live output, then the exit. The process never waits for it.
func (s *Server) attachOutput(w http.ResponseWriter, r *http.Request) error {
	p, err := s.ioFor(r)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	rc := http.NewResponseController(w)
	var off int64
	for {
		v := p.out.from(off)
		if v.dropped > 0 {
			if enc.Encode(agent.Output{Dropped: v.dropped}) != nil {
				return nil
			}
		}
		for _, c := range v.chunks {
			if enc.Encode(agent.Output{Stream: c.stream, Data: c.data}) != nil {
				return nil
			}
		}
		off = v.next
		if v.exit != nil {
			code := *v.exit
			_ = enc.Encode(agent.Output{ExitCode: &code, Error: v.errMsg})
			return nil
		}
		if rc.Flush() != nil {
			return nil
		}
		select {
		case <-v.wake:
		case <-r.Context().Done():
			return nil
		}
	}
}

func (s *Server) writeStdin(w http.ResponseWriter, r *http.Request) error {
	p, err := s.ioFor(r)
	if err != nil {
		return err
	}
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, agent.MaxStdinWrite))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return &apiError{http.StatusRequestEntityTooLarge, codeTooLarge, fmt.Sprintf("stdin data is larger than %d bytes; send it in pieces", agent.MaxStdinWrite)}
		}
		return errInvalid("reading stdin data: %v", err)
	}
	if err := p.write(data); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// write sends data to the process's pty or stdin pipe.
func (p *procIO) write(data []byte) error {
	p.inMu.Lock()
	defer p.inMu.Unlock()
	in := p.pty
	if in == nil {
		in = p.stdin
	}
	switch {
	case p.ended:
		return errConflict("process %d has exited", p.pid)
	case in == nil:
		return errConflict("process %d has no stdin (started without stdin, or it was closed)", p.pid)
	}
	if _, err := in.Write(data); err != nil {
		return errConflict("writing to process %d: %v", p.pid, err)
	}
	return nil
}

func (s *Server) closeStdin(w http.ResponseWriter, r *http.Request) error {
	p, err := s.ioFor(r)
	if err != nil {
		return err
	}
	if err := p.closeStdin(); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// closeStdin closes the stdin pipe; closing twice, or after the exit,
// leaves it closed.
func (p *procIO) closeStdin() error {
	p.inMu.Lock()
	defer p.inMu.Unlock()
	switch {
	case p.pty != nil:
		return errInvalid("process %d runs on a pty, which has no stdin to close: send Ctrl-D (0x04)", p.pid)
	case p.stdin != nil:
		p.stdin.Close()
		p.stdin = nil
	}
	return nil
}

func (s *Server) resize(w http.ResponseWriter, r *http.Request) error {
	p, err := s.ioFor(r)
	if err != nil {
		return err
	}
	var req agent.ResizeRequest
	if err := decodeJSON(w, r, 4096, &req); err != nil {
		return err
	}
	if err := p.resize(req.Cols, req.Rows); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// resize sets the pty's window size.
func (p *procIO) resize(cols, rows int) error {
	if cols < 1 || cols > 65535 || rows < 1 || rows > 65535 {
		return errInvalid("size %dx%d: cols and rows must be 1 to 65535", cols, rows)
	}
	p.inMu.Lock()
	defer p.inMu.Unlock()
	switch {
	case p.pty == nil:
		return errInvalid("process %d has no pty to resize", p.pid)
	case p.ended:
		return errConflict("process %d has exited", p.pid)
	}
	if err := pty.Setsize(p.pty, &pty.Winsize{Cols: uint16(cols), Rows: uint16(rows)}); err != nil {
		return errConflict("resizing the pty of process %d: %v", p.pid, err)
	}
	return nil
}

func (s *Server) ioFor(r *http.Request) (*procIO, error) {
	pid, err := strconv.Atoi(r.PathValue("pid"))
	if err != nil || pid <= 0 {
		return nil, errInvalid("pid %q is not a valid process id", r.PathValue("pid"))
	}
	return s.ios.get(pid)
}
