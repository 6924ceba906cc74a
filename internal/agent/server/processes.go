package server

import (
	"net/http"
	"sort"
	"strings"
	"sync"
	"syscall"

	"github.com/lizard-build/lizard/internal/agent"
)

// maxSignalBody bounds a SignalRequest.
const maxSignalBody = 4 << 10

// allowedSignals are the signals POST /processes/signal accepts.
var allowedSignals = map[string]syscall.Signal{
	"SIGTERM": syscall.SIGTERM,
	"SIGKILL": syscall.SIGKILL,
	"SIGINT":  syscall.SIGINT,
	"SIGHUP":  syscall.SIGHUP,
	"SIGQUIT": syscall.SIGQUIT,
	"SIGUSR1": syscall.SIGUSR1,
	"SIGUSR2": syscall.SIGUSR2,
}

// allowedSignalNames lists allowedSignals for error messages, in the
// protocol's order.
const allowedSignalNames = "SIGTERM, SIGKILL, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2"

// procTable holds the exec-started processes whose main pid is alive and,
// on a server on the host, the process groups they lead, alive or not (for
// Kill; a sandbox's agent has no use for them).
type procTable struct {
	mu      sync.Mutex
	m       map[int]agent.Process
	leaders map[int]bool
}

func newProcTable(onHost bool) *procTable {
	t := &procTable{m: make(map[int]agent.Process)}
	if onHost {
		t.leaders = make(map[int]bool)
	}
	return t
}

func (t *procTable) add(p agent.Process) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.m[p.Pid] = p
	if t.leaders != nil {
		t.leaders[p.Pid] = true
	}
}

func (t *procTable) remove(pid int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.m, pid)
}

func (t *procTable) has(pid int) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.m[pid]
	return ok
}

// list returns the table oldest first; never nil, so it encodes as [].
func (t *procTable) list() []agent.Process {
	t.mu.Lock()
	out := make([]agent.Process, 0, len(t.m))
	for _, p := range t.m {
		out = append(out, p)
	}
	t.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].StartedAt != out[j].StartedAt {
			return out[i].StartedAt < out[j].StartedAt
		}
		return out[i].Pid < out[j].Pid
	})
	return out
}

func (s *Server) listProcesses(w http.ResponseWriter, _ *http.Request) error {
	writeJSON(w, http.StatusOK, s.procs.list())
	return nil
}

func (s *Server) signalProcess(w http.ResponseWriter, r *http.Request) error {
	var req agent.SignalRequest
	if err := decodeJSON(w, r, maxSignalBody, &req); err != nil {
		return err
	}
	sig, ok := allowedSignals[strings.TrimSpace(req.Signal)]
	if !ok {
		return errInvalid("signal %q is not allowed; use one of %s", req.Signal, allowedSignalNames)
	}
	if err := s.signalPID(req.Pid, sig); err != nil {
		return err
	}
	s.log.Info("signalled process tree", "pid", req.Pid, "signal", req.Signal)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// signalPID signals the tree of a process in the table.
func (s *Server) signalPID(pid int, sig syscall.Signal) error {
	if pid <= 0 {
		return errInvalid("pid %d is not a valid process id", pid)
	}
	// Signalling only while the reaper still holds the pid guarantees the
	// number was not reused by another process.
	if !s.procs.has(pid) || !s.reaper.ifAlive(pid, func() { signalTree(pid, sig) }) {
		return errNotFound("process %d is not running (not in the process table)", pid)
	}
	return nil
}

// Kill kills every process the server started and what they started, as
// the end of a sandbox does when the agent is its PID 1. It is for a server
// on the host (see Config.Home), which has no sandbox to end; on others it
// does nothing. A process that
// left its group and its parent (setsid, then orphaned) escapes it. The
// server goes on serving.
func (s *Server) Kill() {
	s.procs.mu.Lock()
	leaders := s.procs.leaders
	if leaders != nil {
		s.procs.leaders = make(map[int]bool)
	}
	s.procs.mu.Unlock()
	// A group id stays allocated while the group has a member and a
	// registered pid is not reaped, so neither number can have been
	// reused; a dead leader of an empty group is skipped.
	live := map[int]bool{}
	for _, p := range readProcs() {
		if leaders[p.pgrp] {
			live[p.pgrp] = true
		}
	}
	for pid := range leaders {
		if live[pid] {
			killTree(pid)
			continue
		}
		s.reaper.ifAlive(pid, func() { killTree(pid) })
	}
}
