// Package stray cleans up after commands that were cut short: it kills the
// processes whose command line names a container (runsc's sandbox and
// gofer processes outlive a runsc command killed half-way), and removes
// cgroup directories whose last processes are still being reaped. The
// gVisor runtime and the template builder use it.
package stray

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// killWait and removeWait bound how long Kill waits for processes to go
// and RemoveDir for a cgroup to empty. A process SIGKILLed on a starved
// host (every core busy) can take seconds to exit: its address space is
// torn down on CPU it does not get. Giving up early leaves its cgroup
// behind for good, since nothing looks for it again.
const (
	killWait   = 15 * time.Second
	removeWait = 30 * time.Second
)

// Kill SIGKILLs every process whose command line contains all of
// fragments, and waits (killWait at most) until none is left. It returns
// the pids it found first.
func Kill(fragments ...string) ([]int, error) {
	var first, pids []int
	deadline := time.Now().Add(killWait)
	for attempt, delay := 0, 10*time.Millisecond; ; attempt, delay = attempt+1, min(2*delay, 250*time.Millisecond) {
		pids = find(fragments)
		if attempt == 0 {
			first = append([]int(nil), pids...)
		}
		if len(pids) == 0 {
			return first, nil
		}
		if time.Now().After(deadline) {
			return first, fmt.Errorf("processes %v do not exit", pids)
		}
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(delay)
	}
}

func find(fragments []string) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || len(b) == 0 {
			continue
		}
		cmd := string(b)
		all := true
		for _, f := range fragments {
			if !strings.Contains(cmd, f) {
				all = false
				break
			}
		}
		if all {
			pids = append(pids, pid)
		}
	}
	return pids
}

// RemoveDir removes a cgroup directory once it is empty: while the kernel
// says it is busy it SIGKILLs whatever its cgroup.procs still lists and
// waits for the last processes to be reaped (removeWait at most). A missing
// directory is not an error.
func RemoveDir(path string) error {
	deadline := time.Now().Add(removeWait)
	for delay := 10 * time.Millisecond; ; delay = min(2*delay, 250*time.Millisecond) {
		err := os.Remove(path)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
			return err
		}
		if b, err := os.ReadFile(path + "/cgroup.procs"); err == nil {
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && pid > 1 && pid != os.Getpid() {
					syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
		time.Sleep(delay)
	}
}
