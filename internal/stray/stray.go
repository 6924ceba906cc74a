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

// Kill SIGKILLs every process whose command line contains all of
// fragments, and waits (about a second at most) until none is left. It
// returns the pids it found first.
func Kill(fragments ...string) ([]int, error) {
	var first, pids []int
	for attempt := range 50 {
		pids = find(fragments)
		if attempt == 0 {
			first = append([]int(nil), pids...)
		}
		if len(pids) == 0 {
			return first, nil
		}
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return first, fmt.Errorf("processes %v do not exit", pids)
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

// RemoveDir removes an empty directory (a cgroup), waiting a little while
// it is busy because its last processes, just killed, are being reaped. A
// missing directory is not an error.
func RemoveDir(path string) error {
	var err error
	for range 50 {
		err = os.Remove(path)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
	return err
}
