// Package reaper makes the server a child subreaper and reaps the processes
// that get reparented to it (runsc's sandbox and gofer processes outlive the
// runsc command that started them), without stealing the exit status of the
// commands the server itself waits for. Runtime backends run their helper
// commands through Reaper.Run.
package reaper

import (
	"context"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Reaper reaps orphaned children. The zero value is not usable; use Start.
type Reaper struct {
	mu      sync.Mutex
	waiting map[int]bool // children whose status belongs to a Run caller
}

// Start marks this process a child subreaper and reaps adopted children until
// ctx is done.
func Start(ctx context.Context) (*Reaper, error) {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return nil, err
	}
	r := &Reaper{waiting: map[int]bool{}}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGCHLD)
	go func() {
		defer signal.Stop(sigs)
		// The ticker catches children whose SIGCHLD coalesced with another.
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-sigs:
			case <-t.C:
			}
			r.reap()
		}
	}()
	return r, nil
}

// Run starts cmd and waits for it, keeping the reaper off its status.
func (r *Reaper) Run(cmd *exec.Cmd) error {
	if err := r.StartCmd(cmd); err != nil {
		return err
	}
	return r.Wait(cmd)
}

// StartCmd starts cmd; the caller must call Wait.
func (r *Reaper) StartCmd(cmd *exec.Cmd) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := cmd.Start(); err != nil {
		return err
	}
	r.waiting[cmd.Process.Pid] = true
	return nil
}

// Wait waits for a command started with StartCmd.
func (r *Reaper) Wait(cmd *exec.Cmd) error {
	err := cmd.Wait()
	r.mu.Lock()
	delete(r.waiting, cmd.Process.Pid)
	r.mu.Unlock()
	return err
}

// reap collects every zombie child that no Run caller waits for. It finds
// them in /proc rather than with wait4(-1), which could take a status that
// exec.Cmd.Wait is about to ask for.
func (r *Reaper) reap() {
	r.mu.Lock()
	defer r.mu.Unlock()
	self := os.Getpid()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || r.waiting[pid] {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// Fields after the command name, which may hold spaces and parens.
		rest := string(b[strings.LastIndexByte(string(b), ')')+2:])
		f := strings.Fields(rest)
		if len(f) < 2 || f[0] != "Z" || f[1] != strconv.Itoa(self) {
			continue
		}
		var ws unix.WaitStatus
		unix.Wait4(pid, &ws, unix.WNOHANG, nil)
	}
}
