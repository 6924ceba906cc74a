// Package cgroup reads what a control group has used: CPU time and memory
// against its limit, under either layout of the kernel's cgroup filesystem
// (v1: one hierarchy per controller, v2: a single unified one). It only
// reads; creating and removing cgroups is the runtime's (runsc's) business.
// Any package may import it; it imports nothing of lizard's.
package cgroup

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Root is where the kernel's cgroup filesystem is mounted.
const Root = "/sys/fs/cgroup"

// Usage is what one cgroup has used.
type Usage struct {
	// CPUNanos is the CPU time its tasks have used since it was made.
	CPUNanos uint64
	// MemoryBytes is the memory charged to it now; MemoryLimit its limit,
	// 0 when it has none.
	MemoryBytes int64
	MemoryLimit int64
}

// Read returns the usage of the cgroup at path (relative to each
// hierarchy, e.g. "/lizard/X") under root, which is Root but for tests.
// The layout is v2 when root holds cgroup.controllers. A cgroup that does
// not exist is an error wrapping fs.ErrNotExist.
func Read(root, path string) (Usage, error) {
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err == nil {
		return readV2(filepath.Join(root, path))
	}
	return readV1(root, path)
}

func readV1(root, path string) (Usage, error) {
	var u Usage
	var err error
	if u.CPUNanos, err = readUint(filepath.Join(root, "cpuacct", path, "cpuacct.usage")); err != nil {
		return Usage{}, err
	}
	mem, err := readUint(filepath.Join(root, "memory", path, "memory.usage_in_bytes"))
	if err != nil {
		return Usage{}, err
	}
	u.MemoryBytes = int64(mem)
	limit, err := readUint(filepath.Join(root, "memory", path, "memory.limit_in_bytes"))
	if err != nil {
		return Usage{}, err
	}
	// v1 writes "no limit" as the largest page-aligned int64.
	if limit < 1<<62 {
		u.MemoryLimit = int64(limit)
	}
	return u, nil
}

func readV2(dir string) (Usage, error) {
	var u Usage
	stat, err := os.ReadFile(filepath.Join(dir, "cpu.stat"))
	if err != nil {
		return Usage{}, err
	}
	usec, ok := statField(stat, "usage_usec")
	if !ok {
		return Usage{}, fmt.Errorf("%s: no usage_usec", filepath.Join(dir, "cpu.stat"))
	}
	u.CPUNanos = usec * 1000
	mem, err := readUint(filepath.Join(dir, "memory.current"))
	if err != nil {
		return Usage{}, err
	}
	u.MemoryBytes = int64(mem)
	b, err := os.ReadFile(filepath.Join(dir, "memory.max"))
	if err != nil {
		return Usage{}, err
	}
	if s := strings.TrimSpace(string(b)); s != "max" {
		limit, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return Usage{}, fmt.Errorf("%s: %w", filepath.Join(dir, "memory.max"), err)
		}
		u.MemoryLimit = limit
	}
	return u, nil
}

// MemoryParts splits the memory charged to a cgroup as its memory.stat
// does: anonymous memory, and page cache (file pages and shared memory,
// such as gVisor's memory file).
type MemoryParts struct {
	Anon, File int64
}

// ReadMemoryParts reads the memory.stat of the cgroup at path under root
// (as Read; v1 names the parts rss and cache, v2 anon and file).
func ReadMemoryParts(root, path string) (MemoryParts, error) {
	file, anonKey, fileKey := filepath.Join(root, path, "memory.stat"), "anon", "file"
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err != nil {
		file, anonKey, fileKey = filepath.Join(root, "memory", path, "memory.stat"), "rss", "cache"
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return MemoryParts{}, err
	}
	anon, ok := statField(b, anonKey)
	fileBytes, ok2 := statField(b, fileKey)
	if !ok || !ok2 {
		return MemoryParts{}, fmt.Errorf("%s: no %s or %s", file, anonKey, fileKey)
	}
	return MemoryParts{Anon: int64(anon), File: int64(fileBytes)}, nil
}

// statField finds "name value" in a flat keyed file such as cpu.stat.
func statField(b []byte, name string) (uint64, bool) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == name {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

func readUint(file string) (uint64, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", file, err)
	}
	return n, nil
}

// Procs returns the processes in the cgroup at path under root (v1: as the
// memory hierarchy lists them).
func Procs(root, path string) ([]int, error) {
	file := filepath.Join(root, path, "cgroup.procs")
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err != nil {
		file = filepath.Join(root, "memory", path, "cgroup.procs")
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}
