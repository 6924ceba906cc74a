package server

import (
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"
)

// prSetChildSubreaper is PR_SET_CHILD_SUBREAPER of prctl(2).
const prSetChildSubreaper = 36

// reapBackstop is how often the reaper polls even without SIGCHLD: a missed
// signal must not leave an exec stream waiting forever.
const reapBackstop = time.Second

// reaper is the one place that waits for children. The agent is PID 1, so
// every orphan of the sandbox becomes its child and must be reaped; waiting
// with wait4(-1) anywhere else (exec.Cmd.Wait, os.Process.Wait) would race
// with it and lose exit statuses. Starters register the pids they care about
// and receive their wait status on a channel.
type reaper struct {
	// mu is held across starting a process and registering its pid, and
	// across each wait4 and dispatch. So a tracked pid is always registered
	// before the reaper can see it exit, and a registered pid has not been
	// reaped (its number cannot have been reused) while mu is held.
	mu      sync.Mutex
	waiters map[int]chan syscall.WaitStatus
}

var (
	reaperOnce sync.Once
	theReaper  *reaper
	reaperErr  error
)

// sharedReaper returns the process's reaper, starting it on first use: two
// reapers in one process would steal each other's children.
func sharedReaper() (*reaper, error) {
	reaperOnce.Do(func() { theReaper, reaperErr = startReaper() })
	return theReaper, reaperErr
}

func startReaper() (*reaper, error) {
	if os.Getpid() != 1 {
		// Outside a sandbox (tests on the host) orphans would go to the real
		// init; as a subreaper they come to us, as they do for PID 1.
		if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); errno != 0 {
			return nil, fmt.Errorf("prctl(PR_SET_CHILD_SUBREAPER): %w", errno)
		}
	}
	defaultSignalsForChildren()
	r := &reaper{waiters: make(map[int]chan syscall.WaitStatus)}
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, syscall.SIGCHLD)
	go r.loop(sigc)
	return r, nil
}

// defaultSignalsForChildren makes every child start with SIGHUP and SIGINT
// at their default dispositions, however the agent was started. A signal
// ignored by the agent's parent (nohup ignores SIGHUP, a shell ignores
// SIGINT in its background jobs) stays ignored across exec, and Go keeps an
// inherited SIG_IGN of these two as it is (it installs its own handler for
// every other signal); the commands would then ignore kill -HUP. A handled
// signal is reset to the default in a forked child, so the agent handles
// them itself, into a channel nobody reads: it goes on ignoring them, and
// its children do not. A signal the agent does not ignore is left alone.
func defaultSignalsForChildren() {
	var ignored []os.Signal
	for _, sig := range []os.Signal{syscall.SIGHUP, syscall.SIGINT} {
		if signal.Ignored(sig) {
			ignored = append(ignored, sig)
		}
	}
	if len(ignored) > 0 {
		signal.Notify(make(chan os.Signal, 1), ignored...)
	}
}

func (r *reaper) loop(sigc <-chan os.Signal) {
	tick := time.NewTicker(reapBackstop)
	defer tick.Stop()
	for {
		r.reapAll()
		select {
		case <-sigc:
		case <-tick.C:
		}
	}
}

// reapAll collects every exited child and hands tracked statuses to their
// waiters; untracked ones (orphans) are dropped.
func (r *reaper) reapAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		if c, ok := r.waiters[pid]; ok {
			delete(r.waiters, pid)
			c <- ws // buffered: never blocks
		}
	}
}

// start runs startFn, which must start exactly one child and return its pid,
// and registers that pid. The returned channel receives its wait status.
func (r *reaper) start(startFn func() (int, error)) (int, <-chan syscall.WaitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := startFn()
	if err != nil {
		return 0, nil, err
	}
	c := make(chan syscall.WaitStatus, 1)
	r.waiters[pid] = c
	return pid, c, nil
}

// ifAlive runs fn while pid is a registered, not yet reaped child, and says
// whether it did. fn must be short: it blocks reaping.
func (r *reaper) ifAlive(pid int, fn func()) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.waiters[pid]; !ok {
		return false
	}
	fn()
	return true
}

// startProcess starts a child with os.StartProcess under the reaper and
// releases Go's handle on it: waiting is the reaper's job alone.
func (r *reaper) startProcess(path string, argv []string, attr *os.ProcAttr) (int, <-chan syscall.WaitStatus, error) {
	return r.start(func() (int, error) {
		p, err := os.StartProcess(path, argv, attr)
		if err != nil {
			return 0, err
		}
		pid := p.Pid
		// Release only drops the handle (a pidfd on new kernels); it does
		// not wait.
		_ = p.Release()
		return pid, nil
	})
}

// exitCode turns a wait status into a shell-style exit code.
func exitCode(ws syscall.WaitStatus) int {
	switch {
	case ws.Exited():
		return ws.ExitStatus()
	case ws.Signaled():
		return 128 + int(ws.Signal())
	}
	return 255
}
