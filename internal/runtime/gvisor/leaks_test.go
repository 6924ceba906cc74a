package gvisor

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
)

// TestCgroupDirs: a sandbox's cgroup is found in the cgroup v1 layout (one
// directory per controller, the hybrid layout's unified one too) and in the
// v2 layout (a single directory), so that a leftover fails the leak checks
// whichever the host runs.
func TestCgroupDirs(t *testing.T) {
	for _, tt := range []struct {
		name string
		dirs []string // made under the fake cgroup root
		id   string
		want []string
	}{
		{"v1", []string{"memory/lizard/a", "pids/lizard/a", "pids/lizard/b", "unified/lizard/a", "memory/other/a"}, "a",
			[]string{"memory/lizard/a", "pids/lizard/a", "unified/lizard/a"}},
		{"v1 every sandbox", []string{"memory/lizard/a", "pids/lizard/b"}, "",
			[]string{"memory/lizard/a", "pids/lizard/b"}},
		{"v2", []string{"lizard/a", "lizard/b", "system.slice/a"}, "a", []string{"lizard/a"}},
		{"v2 every sandbox", []string{"lizard/a", "lizard/b"}, "", []string{"lizard/a", "lizard/b"}},
		{"none", []string{"lizard", "memory/lizard"}, "", nil},
		// Another server's parent on the same host is not this one's.
		{"v1 other parent", []string{"memory/lizard/a", "memory/lizard-b/c", "pids/lizard-b/c"}, "", []string{"memory/lizard/a"}},
		{"v2 other parent", []string{"lizard/a", "lizard-b/c"}, "", []string{"lizard/a"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			for _, d := range tt.dirs {
				if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			// A file named like a sandbox is not a cgroup.
			os.WriteFile(filepath.Join(root, "lizard", "file"), nil, 0o644)
			var got []string
			for _, m := range CgroupDirs(root, "lizard", tt.id) {
				rel, _ := filepath.Rel(root, m)
				got = append(got, rel)
			}
			slices.Sort(got)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("CgroupDirs(%v, %q) = %v, want %v", tt.dirs, tt.id, got, tt.want)
			}
		})
	}
}

// TestOwnNetns: a server's namespaces are <prefix>-<id>; another server's
// whose prefix extends this one's are not its own.
func TestOwnNetns(t *testing.T) {
	for _, tt := range []struct {
		prefix, name string
		want         bool
	}{
		{"lizard", "lizard-abc123", true},
		{"lizard", "lizard-a-abc123", false},
		{"lizard-a", "lizard-a-abc123", true},
		{"lizard-a", "lizard-abc123", false},
		{"lizard", "lizard-", false},
		{"lizard", "lztest-node1", false},
	} {
		if got := OwnNetns(tt.prefix, tt.name); got != tt.want {
			t.Errorf("OwnNetns(%q, %q) = %v, want %v", tt.prefix, tt.name, got, tt.want)
		}
	}
}
