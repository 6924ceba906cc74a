package server

import (
	"os"
	"strconv"
	"strings"
	"syscall"
)

// maxFreezeRounds bounds the stop-and-rescan loop of killTree; each round
// only has to catch children forked during the previous scan.
const maxFreezeRounds = 20

// procInfo is the part of /proc/PID/stat that links processes into trees.
type procInfo struct {
	pid, ppid, pgrp int
}

// readProcs lists the processes visible in /proc. Processes that vanish while
// it reads are skipped.
func readProcs() []procInfo {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	procs := make([]procInfo, 0, len(ents))
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		if p, ok := parseStat(string(b)); ok {
			procs = append(procs, p)
		}
	}
	return procs
}

// parseStat parses "pid (comm) state ppid pgrp ...". comm may itself hold
// spaces and parentheses, so the fields are counted from the last ')'.
func parseStat(s string) (procInfo, bool) {
	open := strings.IndexByte(s, '(')
	end := strings.LastIndexByte(s, ')')
	if open < 1 || end < open {
		return procInfo{}, false
	}
	f := strings.Fields(s[end+1:])
	if len(f) < 3 {
		return procInfo{}, false
	}
	pid, err1 := strconv.Atoi(strings.TrimSpace(s[:open]))
	ppid, err2 := strconv.Atoi(f[1])
	pgrp, err3 := strconv.Atoi(f[2])
	if err1 != nil || err2 != nil || err3 != nil {
		return procInfo{}, false
	}
	return procInfo{pid: pid, ppid: ppid, pgrp: pgrp}, true
}

// tree returns root, the members of root's process group (root leads it:
// exec children are started with Setpgid), the given extra seeds, and every
// descendant of all of them. Following ppid links catches children that left
// the group with setsid; the group catches orphans already reparented to the
// agent. The agent and PID 1 are never included.
func tree(root int, seeds map[int]bool) []int {
	procs := readProcs()
	children := make(map[int][]int, len(procs))
	in := map[int]bool{root: true}
	queue := []int{root}
	for s := range seeds {
		if !in[s] {
			in[s] = true
			queue = append(queue, s)
		}
	}
	for _, p := range procs {
		children[p.ppid] = append(children[p.ppid], p.pid)
		if p.pgrp == root && !in[p.pid] {
			in[p.pid] = true
			queue = append(queue, p.pid)
		}
	}
	for i := 0; i < len(queue); i++ {
		for _, c := range children[queue[i]] {
			if !in[c] {
				in[c] = true
				queue = append(queue, c)
			}
		}
	}
	self := os.Getpid()
	out := queue[:0]
	for _, pid := range queue {
		if pid > 1 && pid != self {
			out = append(out, pid)
		}
	}
	return out
}

// signalTree sends sig to the process tree of root. SIGKILL goes through
// killTree so that no process escapes by forking during the walk.
func signalTree(root int, sig syscall.Signal) {
	if sig == syscall.SIGKILL {
		killTree(root)
		return
	}
	for _, pid := range tree(root, nil) {
		_ = syscall.Kill(pid, sig)
	}
}

// killTree freezes the tree of root with SIGSTOP, rescanning until no new
// process appears (a stopped process cannot fork, and stopped parents keep
// their children linked), then SIGKILLs every frozen process and the group.
func killTree(root int) {
	frozen := map[int]bool{}
	for range maxFreezeRounds {
		grew := false
		for _, pid := range tree(root, frozen) {
			if !frozen[pid] {
				_ = syscall.Kill(pid, syscall.SIGSTOP)
				frozen[pid] = true
				grew = true
			}
		}
		if !grew {
			break
		}
	}
	_ = syscall.Kill(-root, syscall.SIGKILL)
	for pid := range frozen {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}
