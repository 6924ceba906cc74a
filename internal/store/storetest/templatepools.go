package storetest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
)

// testTemplatePools: warm pool settings per project, template and sandbox
// size are listed in that order, replaced in place (a new size and time),
// removed by a size of 0, refused when malformed, and seen by another
// handle.
func testTemplatePools(t *testing.T, ctx context.Context, open func() store.Store) {
	st, ok := open().(store.TemplatePools)
	if !ok {
		t.Fatalf("the backend does not implement store.TemplatePools")
	}
	other := open().(store.TemplatePools)
	list := func(s store.TemplatePools) []store.TemplatePool {
		t.Helper()
		l, err := s.TemplatePools(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if l == nil {
			t.Fatal("TemplatePools: nil, want []")
		}
		return l
	}
	// key is a setting as the test compares it: UpdatedAt is the backend's.
	type key struct {
		project, template, sandboxSize string
		size                           int
	}
	keys := func(l []store.TemplatePool) []key {
		t.Helper()
		out := []key{}
		for _, p := range l {
			if p.UpdatedAt.IsZero() || p.UpdatedAt.Location() != time.UTC {
				t.Fatalf("pool %+v: UpdatedAt not set in UTC", p)
			}
			out = append(out, key{p.ProjectID, p.Template, p.SandboxSize, p.Size})
		}
		return out
	}
	if l := list(st); len(l) != 0 {
		t.Fatalf("TemplatePools of nothing: %+v, want []", l)
	}

	before := time.Now().Add(-time.Minute) // a database's clock may differ a little
	for _, p := range []store.TemplatePool{
		{ProjectID: "prj_b", Template: "base", SandboxSize: "small", Size: 1},
		{ProjectID: "prj_a", Template: "web", SandboxSize: "small", Size: 3},
		{ProjectID: "prj_a", Template: "base", SandboxSize: "large", Size: 2},
		{ProjectID: "prj_a", Template: "base", SandboxSize: "medium", Size: 5, UpdatedAt: ts(0)}, // UpdatedAt is ignored
	} {
		if err := st.SetTemplatePool(ctx, p); err != nil {
			t.Fatalf("set %+v: %v", p, err)
		}
	}
	want := []key{
		{"prj_a", "base", "large", 2},
		{"prj_a", "base", "medium", 5},
		{"prj_a", "web", "small", 3},
		{"prj_b", "base", "small", 1},
	}
	l := list(other)
	if got := keys(l); !slices.Equal(got, want) {
		t.Fatalf("pools: %+v, want %+v", got, want)
	}
	for _, p := range l {
		if p.UpdatedAt.Before(before) || p.UpdatedAt.After(time.Now().Add(time.Minute)) {
			t.Fatalf("pool %+v: UpdatedAt is not the time it was set", p)
		}
	}
	webAt := l[2].UpdatedAt

	// A second setting replaces the first: its size and its time.
	time.Sleep(10 * time.Millisecond)
	if err := other.SetTemplatePool(ctx, store.TemplatePool{ProjectID: "prj_a", Template: "web", SandboxSize: "small", Size: 7}); err != nil {
		t.Fatal(err)
	}
	l = list(st)
	want[2].size = 7
	if got := keys(l); !slices.Equal(got, want) {
		t.Fatalf("pools after a replace: %+v, want %+v", got, want)
	}
	if !l[2].UpdatedAt.After(webAt) {
		t.Fatalf("replaced pool updated at %v, before at %v: want later", l[2].UpdatedAt, webAt)
	}

	// A size of 0 removes the setting; removing a missing one is no error.
	if err := st.SetTemplatePool(ctx, store.TemplatePool{ProjectID: "prj_a", Template: "base", SandboxSize: "medium"}); err != nil {
		t.Fatal(err)
	}
	if err := st.SetTemplatePool(ctx, store.TemplatePool{ProjectID: "prj_a", Template: "base", SandboxSize: "medium"}); err != nil {
		t.Fatalf("remove a missing pool: %v", err)
	}
	if err := st.SetTemplatePool(ctx, store.TemplatePool{ProjectID: "prj_z", Template: "none", SandboxSize: "small"}); err != nil {
		t.Fatalf("remove a pool never set: %v", err)
	}
	want = append(want[:1], want[2:]...)
	if got := keys(list(other)); !slices.Equal(got, want) {
		t.Fatalf("pools after a remove: %+v, want %+v", got, want)
	}

	for _, p := range []store.TemplatePool{
		{ProjectID: "prj_a", Template: "base", SandboxSize: "small", Size: -1},
		{Template: "base", SandboxSize: "small", Size: 1},
		{ProjectID: "prj_a", SandboxSize: "small", Size: 1},
		{ProjectID: "prj_a", Template: "base", Size: 1},
		{ProjectID: "prj_a", Template: "base"}, // a removal is checked too
	} {
		if err := st.SetTemplatePool(ctx, p); !errors.Is(err, errdefs.ErrInvalid) {
			t.Fatalf("set %+v: %v, want ErrInvalid", p, err)
		}
	}
	if got := keys(list(st)); !slices.Equal(got, want) {
		t.Fatalf("pools after refused sets: %+v, want %+v", got, want)
	}
}
