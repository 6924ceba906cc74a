package sandbox

import (
	"reflect"
	"testing"

	"github.com/lizard-build/lizard/internal/codeinterp"
	"github.com/lizard-build/lizard/internal/runtime"
	"github.com/lizard-build/lizard/internal/volume"
)

// TestMounts: only code-interpreter-v1's sandboxes (and so their
// checkpoints' restores) see the code-interpreter server; every sandbox
// keeps its volume.
func TestMounts(t *testing.T) {
	const prog = "/data/agent/code-interpreter-abc.py"
	ci := runtime.Mount{Source: prog, Destination: codeinterp.SandboxPath, ReadOnly: true}
	vol := runtime.Mount{Source: "/data/volumes/v1/mnt", Destination: volume.MountPath}
	for _, tc := range []struct {
		name, template, path string
		vol                  []runtime.Mount
		want                 []runtime.Mount
	}{
		{"base", "base", prog, nil, nil},
		{"base with a volume", "base", prog, []runtime.Mount{vol}, []runtime.Mount{vol}},
		{"interpreter, its base", "interpreter", prog, nil, nil},
		{"an alias", "python312", prog, nil, nil},
		{"a project's template", "my-app", prog, []runtime.Mount{vol}, []runtime.Mount{vol}},
		{"code-interpreter-v1", "code-interpreter-v1", prog, nil, []runtime.Mount{ci}},
		{"code-interpreter-v1 with a volume", "code-interpreter-v1", prog, []runtime.Mount{vol}, []runtime.Mount{ci, vol}},
		{"no program installed", "code-interpreter-v1", "", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Service{cfg: Config{CodeInterpreterPath: tc.path}}
			if got := s.mounts(tc.template, tc.vol); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("mounts(%q, %v) = %+v, want %+v", tc.template, tc.vol, got, tc.want)
			}
		})
	}
}
