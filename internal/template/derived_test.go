package template

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/lizard-build/lizard/internal/codeinterp"
)

func TestDerivedTemplate(t *testing.T) {
	dir := t.TempDir()
	r := NewRegistry(dir)

	// Without its base, the derived template does not exist.
	_, err := r.Get("code-interpreter-v1")
	assertNotFound(t, err)
	ts, err := r.List()
	if err != nil || len(ts) != 0 {
		t.Fatalf("List() = %v, %v; want nothing", ts, err)
	}

	fakeTemplate(t, dir, "interpreter", metadata{Name: "interpreter", Version: "bookworm-1", Env: []string{"LANG=C.UTF-8"},
		Versions: map[string]string{"python": "3.11.2"}})
	base, err := r.Get("interpreter")
	if err != nil {
		t.Fatal(err)
	}
	if len(base.StartCommand) != 0 {
		t.Fatalf("interpreter got a start command: %q", base.StartCommand)
	}
	ci, err := r.Get("code-interpreter-v1")
	if err != nil {
		t.Fatal(err)
	}
	if ci.Name != "code-interpreter-v1" || ci.Rootfs != base.Rootfs {
		t.Errorf("got name %q rootfs %q; want code-interpreter-v1 on %q", ci.Name, ci.Rootfs, base.Rootfs)
	}
	if want := "bookworm-1+" + codeinterp.Revision(); ci.Version != want {
		t.Errorf("version %q, want %q (the base's and the server's revision)", ci.Version, want)
	}
	if !reflect.DeepEqual(ci.StartCommand, codeinterp.StartCommand()) || !reflect.DeepEqual(ci.ReadyCommand, codeinterp.ReadyCommand()) {
		t.Errorf("start %q ready %q", ci.StartCommand, ci.ReadyCommand)
	}
	if !reflect.DeepEqual(ci.Env, base.Env) || !reflect.DeepEqual(ci.Versions, base.Versions) {
		t.Errorf("env %q versions %v, want the base's", ci.Env, ci.Versions)
	}

	ts, err = r.List()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, t := range ts {
		names = append(names, t.Name)
	}
	if want := []string{"code-interpreter-v1", "interpreter"}; !reflect.DeepEqual(names, want) {
		t.Errorf("List() names %q, want %q", names, want)
	}

	if !strings.Contains(strings.Join(r.Builtins(), " "), "code-interpreter-v1") {
		t.Errorf("Builtins() = %q lacks code-interpreter-v1", r.Builtins())
	}
	// EnsureBuilt finds the built base and builds nothing.
	got, err := r.EnsureBuilt(context.Background(), "code-interpreter-v1", nil)
	if err != nil || got.Rootfs != base.Rootfs {
		t.Errorf("EnsureBuilt = %+v, %v", got, err)
	}
}
