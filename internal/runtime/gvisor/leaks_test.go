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
			for _, m := range CgroupDirs(root, tt.id) {
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
