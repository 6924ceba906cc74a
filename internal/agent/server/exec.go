package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/lizard-build/lizard/internal/agent"
)

const (
	// defaultPath is PATH when the request does not set one.
	defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	// maxExecBody bounds an ExecRequest (scripts can be long).
	maxExecBody = 8 << 20
	// eventBuffer is how many output events may queue ahead of the client.
	eventBuffer = 256
)

// execSpec is a validated ExecRequest, ready to start.
type execSpec struct {
	path    string   // executable to run
	argv    []string // its argv, as recorded in the process table
	command string   // the command line as the user wrote it
	env     []string
	dir     string
	acct    *account
	timeout time.Duration
	tag     string
}

// startError is a command that could not be started; it is reported in the
// stream as the exit code a shell would give (127 not found, 126 not
// executable), not as an HTTP error.
type startError struct {
	code int
	msg  string
}

func (e *startError) Error() string { return e.msg }

func (s *Server) exec(w http.ResponseWriter, r *http.Request) error {
	var req agent.ExecRequest
	if err := decodeJSON(w, r, maxExecBody, &req); err != nil {
		return err
	}
	spec, err := prepareExec(req, s.accts, s.trustEnv)
	var se *startError
	if errors.As(err, &se) {
		writeStartFailure(w, se)
		return nil
	}
	if err != nil {
		return err
	}
	j, err := s.startJob(spec)
	if errors.As(err, &se) {
		writeStartFailure(w, se)
		return nil
	}
	if err != nil {
		return err
	}
	go s.supervise(j, spec.timeout)
	streamEvents(w, j)
	return nil
}

// prepareExec validates req and resolves user, environment, working
// directory and executable.
func prepareExec(req agent.ExecRequest, accts accounts, base map[string]string) (*execSpec, error) {
	if err := validateCmd(req); err != nil {
		return nil, err
	}
	if req.TimeoutMs < 0 {
		return nil, errInvalid("timeoutMs %d is negative", req.TimeoutMs)
	}
	acct, err := accts.lookupAccount(req.User)
	if err != nil {
		return nil, err
	}
	env, pathVar, err := buildEnv(acct, base, req.Env)
	if err != nil {
		return nil, err
	}
	dir, err := workdir(req.Workdir, acct)
	if err != nil {
		return nil, err
	}
	spec := &execSpec{
		env:     env,
		dir:     dir,
		acct:    acct,
		timeout: time.Duration(req.TimeoutMs) * time.Millisecond,
		tag:     req.Tag,
	}
	if req.Shell {
		spec.path = "/bin/sh"
		spec.argv = []string{"/bin/sh", "-c", req.Cmd[0]}
		spec.command = req.Cmd[0]
		return spec, nil
	}
	if spec.path, err = lookPath(req.Cmd[0], pathVar, dir); err != nil {
		return nil, err
	}
	spec.argv = req.Cmd
	spec.command = strings.Join(req.Cmd, " ")
	return spec, nil
}

func validateCmd(req agent.ExecRequest) error {
	if len(req.Cmd) == 0 {
		return errInvalid("cmd is empty")
	}
	if req.Shell && len(req.Cmd) != 1 {
		return errInvalid("with shell, cmd must have exactly one element (the script), got %d", len(req.Cmd))
	}
	if req.Cmd[0] == "" {
		return errInvalid("cmd[0] is empty")
	}
	for i, a := range req.Cmd {
		if strings.IndexByte(a, 0) >= 0 {
			return errInvalid("cmd[%d] contains a NUL byte", i)
		}
	}
	return nil
}

// buildEnv returns the child's environment: the user's defaults and base
// (the egress CA's variables) overridden by extra. The agent's own
// environment (and with it its token) is never inherited. It also returns
// the PATH that lookPath must search.
func buildEnv(acct *account, base, extra map[string]string) ([]string, string, error) {
	env := map[string]string{
		"PATH":    defaultPath,
		"HOME":    acct.home,
		"USER":    acct.name,
		"LOGNAME": acct.name,
		"SHELL":   acct.shell,
		"LANG":    "C.UTF-8",
		"TERM":    "xterm",
	}
	if acct.tmp != "" {
		env["TMPDIR"] = acct.tmp
	}
	for k, v := range base {
		env[k] = v
	}
	for k, v := range extra {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return nil, "", errInvalid("env name %q is not valid (empty, or holds '=' or NUL)", k)
		}
		if strings.IndexByte(v, 0) >= 0 {
			return nil, "", errInvalid("env %s: value contains a NUL byte", k)
		}
		env[k] = v
	}
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = k + "=" + env[k]
	}
	return out, env["PATH"], nil
}

// workdir resolves the working directory: dir when given (it must exist),
// else the user's home when it exists, else /.
func workdir(dir string, acct *account) (string, error) {
	if dir == "" {
		if fi, err := os.Stat(acct.home); err == nil && fi.IsDir() && filepath.IsAbs(acct.home) {
			return acct.home, nil
		}
		return "/", nil
	}
	if !filepath.IsAbs(dir) {
		return "", errInvalid("workdir %q is not absolute", dir)
	}
	dir = filepath.Clean(dir)
	fi, err := os.Stat(dir)
	switch {
	case err != nil && os.IsNotExist(err):
		return "", errInvalid("workdir %q does not exist", dir)
	case err != nil:
		return "", errInvalid("workdir %q: %v", dir, err)
	case !fi.IsDir():
		return "", errInvalid("workdir %q is not a directory", dir)
	}
	return dir, nil
}

// lookPath finds name in pathVar like a shell does. Names with a slash are
// used as given (relative to dir, as the child chdirs first). Relative PATH
// entries are taken relative to dir.
func lookPath(name, pathVar, dir string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	var denied string
	for _, d := range filepath.SplitList(pathVar) {
		if d == "" {
			d = "."
		}
		if !filepath.IsAbs(d) {
			d = filepath.Join(dir, d)
		}
		p := filepath.Join(d, name)
		fi, err := os.Stat(p)
		if err != nil || fi.IsDir() {
			continue
		}
		if fi.Mode()&0o111 == 0 {
			if denied == "" {
				denied = p
			}
			continue
		}
		return p, nil
	}
	if denied != "" {
		return "", &startError{126, fmt.Sprintf("%s: permission denied (not executable)", denied)}
	}
	return "", &startError{127, fmt.Sprintf("%s: command not found in PATH %s", name, pathVar)}
}

// startJob starts the command with stdin on /dev/null and stdout and stderr
// on pipes, registers it with the reaper and the process table.
func (s *Server) startJob(spec *execSpec) (*job, error) {
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", os.DevNull, err)
	}
	defer devnull.Close()
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("creating stdout pipe: %w", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, fmt.Errorf("creating stderr pipe: %w", err)
	}
	attr := &os.ProcAttr{
		Dir:   spec.dir,
		Env:   spec.env,
		Files: []*os.File{devnull, outW, errW},
		// Its own process group lets signals and the timeout reach the
		// command's background children too.
		Sys: &syscall.SysProcAttr{Setpgid: true, Credential: spec.acct.credential()},
	}
	pid, status, err := s.reaper.startProcess(spec.path, spec.argv, attr)
	// The parent's write ends must go, or the pipes never reach EOF.
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		return nil, startFailure(err, spec)
	}
	s.procs.add(agent.Process{
		Pid:       pid,
		Cmd:       spec.argv,
		Command:   spec.command,
		Cwd:       spec.dir,
		Tag:       spec.tag,
		StartedAt: time.Now().UTC().Format(time.RFC3339),
	})
	s.log.Info("exec started", "pid", pid, "user", spec.acct.name, "tag", spec.tag)
	return newJob(pid, status, outR, errR, s.bg), nil
}

// startFailure classifies an exec failure like a shell: 127 when the file
// is missing, 126 when it cannot be run. The failing step (chdir or exec)
// is not known, so the message names user and workdir too.
func startFailure(err error, spec *execSpec) *startError {
	msg := fmt.Sprintf("%v (as user %s in %s)", err, spec.acct.name, spec.dir)
	if errors.Is(err, syscall.ENOENT) {
		return &startError{127, msg}
	}
	return &startError{126, msg}
}

// supervise waits for the command, enforces its timeout, and ends the event
// stream once the output is drained.
func (s *Server) supervise(j *job, timeout time.Duration) {
	j.startPumps()
	defer s.killAfter(j.pid, timeout, &j.timedOut)()
	ws := <-j.status
	s.procs.remove(j.pid)
	ev := j.finish(ws)
	s.log.Info("exec ended", "pid", j.pid, "exitCode", *ev.ExitCode, "error", ev.Error)
}

// killAfter kills pid's process tree once timeout has passed, if it still
// runs, and sets timedOut then; 0 means never. Call the returned stop once
// the process has exited.
func (s *Server) killAfter(pid int, timeout time.Duration, timedOut *atomic.Bool) (stop func()) {
	if timeout <= 0 {
		return func() {}
	}
	t := time.AfterFunc(timeout, func() {
		s.reaper.ifAlive(pid, func() {
			// Set before the reaper can dispatch the status, so the
			// supervisor sees it.
			timedOut.Store(true)
			killTree(pid)
		})
	})
	return func() { t.Stop() }
}

func writeStartFailure(w http.ResponseWriter, se *startError) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	code := se.code
	_ = json.NewEncoder(w).Encode(agent.Event{ExitCode: &code, Error: se.msg})
}

// streamEvents writes the job's events as NDJSON, flushing whenever it has
// caught up. Once the client is gone it keeps consuming (and dropping)
// events: the command runs on and its pipes must keep draining.
func streamEvents(w http.ResponseWriter, j *job) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	ew := &eventWriter{enc: json.NewEncoder(w), rc: http.NewResponseController(w)}
	ew.enc.SetEscapeHTML(false)
	pid := j.pid
	ew.write(agent.Event{Pid: &pid}, true)
	for ev := range j.events {
		ew.write(ev, len(j.events) == 0)
	}
}

type eventWriter struct {
	enc    *json.Encoder
	rc     *http.ResponseController
	broken bool
}

func (e *eventWriter) write(ev agent.Event, flush bool) {
	if e.broken {
		return
	}
	if err := e.enc.Encode(ev); err != nil {
		e.broken = true
		return
	}
	if flush && e.rc.Flush() != nil {
		e.broken = true
	}
}
