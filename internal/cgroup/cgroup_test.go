package cgroup

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

func write(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRead(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  Usage
	}{
		{"v1", map[string]string{
			"cpuacct/lizard/x/cpuacct.usage":        "2500000000\n",
			"memory/lizard/x/memory.usage_in_bytes": "104857600\n",
			"memory/lizard/x/memory.limit_in_bytes": "1073741824\n",
		}, Usage{CPUNanos: 2_500_000_000, MemoryBytes: 100 << 20, MemoryLimit: 1 << 30}},
		{"v1 without limit", map[string]string{
			"cpuacct/lizard/x/cpuacct.usage":        "7\n",
			"memory/lizard/x/memory.usage_in_bytes": "4096\n",
			"memory/lizard/x/memory.limit_in_bytes": "9223372036854771712\n",
		}, Usage{CPUNanos: 7, MemoryBytes: 4096}},
		{"v2", map[string]string{
			"cgroup.controllers":      "cpuset cpu io memory pids\n",
			"lizard/x/cpu.stat":       "usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n",
			"lizard/x/memory.current": "52428800\n",
			"lizard/x/memory.max":     "2147483648\n",
		}, Usage{CPUNanos: 1_500_000_000, MemoryBytes: 50 << 20, MemoryLimit: 2 << 30}},
		{"v2 without limit", map[string]string{
			"cgroup.controllers":      "cpu memory\n",
			"lizard/x/cpu.stat":       "user_usec 1\nusage_usec 3\n",
			"lizard/x/memory.current": "8192\n",
			"lizard/x/memory.max":     "max\n",
		}, Usage{CPUNanos: 3000, MemoryBytes: 8192}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			write(t, root, tc.files)
			got, err := Read(root, "/lizard/x")
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("Read = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestReadMemoryParts(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
	}{
		{"v1", map[string]string{"memory/lizard/x/memory.stat": "cache 3145728\nrss 15728640\nshmem 3000000\n"}},
		{"v2", map[string]string{
			"cgroup.controllers":   "cpu memory\n",
			"lizard/x/memory.stat": "anon 15728640\nfile 3145728\nshmem 3000000\n",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			write(t, root, tc.files)
			got, err := ReadMemoryParts(root, "/lizard/x")
			if want := (MemoryParts{Anon: 15 << 20, File: 3 << 20}); err != nil || got != want {
				t.Fatalf("ReadMemoryParts: %+v %v, want %+v", got, err, want)
			}
			if _, err := ReadMemoryParts(root, "/lizard/gone"); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("of a missing cgroup: %v, want fs.ErrNotExist", err)
			}
		})
	}
}

func TestReadMissing(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
	}{
		{"v1", map[string]string{"cpuacct/cpuacct.usage": "1\n"}},
		{"v2", map[string]string{"cgroup.controllers": "cpu\n"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			write(t, root, tc.files)
			if _, err := Read(root, "/lizard/gone"); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("Read of a missing cgroup: %v, want fs.ErrNotExist", err)
			}
		})
	}
}

func TestReadMalformed(t *testing.T) {
	root := t.TempDir()
	write(t, root, map[string]string{
		"cgroup.controllers":      "cpu\n",
		"lizard/x/cpu.stat":       "user_usec 1\n",
		"lizard/x/memory.current": "1\n",
		"lizard/x/memory.max":     "max\n",
	})
	if _, err := Read(root, "/lizard/x"); err == nil {
		t.Fatal("cpu.stat without usage_usec: no error")
	}
}

func TestProcs(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
	}{
		{"v1", map[string]string{"memory/lizard/x/cgroup.procs": "12\n345\n"}},
		{"v2", map[string]string{"cgroup.controllers": "cpu\n", "lizard/x/cgroup.procs": "12\n345\n"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			write(t, root, tc.files)
			pids, err := Procs(root, "/lizard/x")
			if err != nil {
				t.Fatal(err)
			}
			if len(pids) != 2 || pids[0] != 12 || pids[1] != 345 {
				t.Fatalf("Procs = %v, want [12 345]", pids)
			}
		})
	}
}
