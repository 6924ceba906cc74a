//go:build linux

package template

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/lizard-build/lizard/internal/errdefs"
)

func names(ts []Template) []string {
	var out []string
	for _, t := range ts {
		out = append(out, t.Key())
	}
	return out
}

// TestProjectTemplates: two projects each own a "myapp"; each sees the
// built-ins and its own, never the other's; removing one leaves the other
// and the removed one's version for Prune to take once unused.
func TestProjectTemplates(t *testing.T) {
	top := NewRegistry(t.TempDir())
	installFake(t, top, "base", "base-1")
	a, err := top.Project("prj_a")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := top.Project("prj_b")
	ta := installFake(t, a, "myapp", "a-1")
	tb := installFake(t, b, "myapp", "b-1")
	installFake(t, b, "only-b", "b-2")

	for _, c := range []struct {
		project, version string
	}{{"prj_a", "a-1"}, {"prj_b", "b-1"}} {
		got, err := top.Lookup(c.project, "myapp")
		if err != nil || got.Version != c.version || got.Project != c.project {
			t.Errorf("Lookup(%s, myapp) = %+v, %v; want version %s", c.project, got, err, c.version)
		}
		if base, err := top.Lookup(c.project, "base"); err != nil || base.Project != "" {
			t.Errorf("Lookup(%s, base) = %+v, %v; want the built-in", c.project, base, err)
		}
	}
	if _, err := top.Lookup("prj_a", "only-b"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("project a sees b's template: %v", err)
	}
	if _, err := top.Lookup("prj_c", "myapp"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a project without templates: %v", err)
	}
	if got, _ := top.ListFor("prj_a"); !slices.Equal(names(got), []string{"base", "prj_a~myapp"}) {
		t.Errorf("ListFor(a) = %v", names(got))
	}
	if got, _ := top.ListFor("prj_b"); !slices.Equal(names(got), []string{"base", "prj_b~myapp", "prj_b~only-b"}) {
		t.Errorf("ListFor(b) = %v", names(got))
	}
	if got, _ := top.ListAll(); !slices.Equal(names(got), []string{"base", "prj_a~myapp", "prj_b~myapp", "prj_b~only-b"}) {
		t.Errorf("ListAll = %v", names(got))
	}
	if got, _ := top.List(); !slices.Equal(names(got), []string{"base"}) {
		t.Errorf("the top registry lists %v, want the built-in alone", names(got))
	}

	ctx := context.Background()
	if err := top.Delete(ctx, "prj_a", "base"); !errors.Is(err, errdefs.ErrPermission) {
		t.Errorf("Delete(base) = %v, want a permission error", err)
	}
	if err := top.Delete(ctx, "prj_a", "only-b"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a deletes b's template: %v", err)
	}
	if err := top.Delete(ctx, "prj_a", "myapp"); err != nil {
		t.Fatal(err)
	}
	if _, err := top.Lookup("prj_a", "myapp"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("after Delete: %v", err)
	}
	if got, err := top.Lookup("prj_b", "myapp"); err != nil || got.Rootfs != tb.Rootfs {
		t.Errorf("b's myapp after a's Delete: %+v, %v", got, err)
	}
	// A sandbox on a's version keeps it; once unused, Prune takes it.
	if removed, err := a.Prune(func(rootfs string) bool { return rootfs == ta.Rootfs }); err != nil || len(removed) != 0 {
		t.Errorf("prune of a used version: %v, %v", removed, err)
	}
	assertVersion(t, ta.Rootfs, "a-1")
	if removed, err := a.Prune(func(string) bool { return false }); err != nil || len(removed) != 1 {
		t.Errorf("prune once unused: %v, %v", removed, err)
	}
	assertGone(t, filepath.Dir(ta.Rootfs))
	assertVersion(t, tb.Rootfs, "b-1")
	if regs, _ := top.All(); len(regs) != 3 {
		t.Errorf("All = %d registries, want the top one and two projects'", len(regs))
	}
}

// TestMigrateCustom: a custom template at the top (from before templates
// belonged to projects) becomes the project's; the old version stays for
// what uses it; built-ins stay.
func TestMigrateCustom(t *testing.T) {
	top := NewRegistry(t.TempDir())
	base := installFake(t, top, "base", "base-1")
	old := installFake(t, top, "myapp", "custom-1")
	migrated, err := top.MigrateCustom("prj_default")
	if err != nil || !slices.Equal(migrated, []string{"myapp"}) {
		t.Fatalf("MigrateCustom = %v, %v", migrated, err)
	}
	got, err := top.Lookup("prj_default", "myapp")
	if err != nil || got.Version != "custom-1" || got.Rootfs == old.Rootfs {
		t.Fatalf("after migration: %+v, %v", got, err)
	}
	assertVersion(t, got.Rootfs, "custom-1")
	if _, err := top.Lookup("prj_other", "myapp"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another project sees the migrated template: %v", err)
	}
	if b, err := top.Get("base"); err != nil || b.Rootfs != base.Rootfs {
		t.Errorf("base after migration: %+v, %v", b, err)
	}
	assertGone(t, filepath.Join(top.Dir(), "myapp"))
	// The old version is a sandbox's until it goes.
	assertVersion(t, old.Rootfs, "custom-1")
	if _, err := top.Prune(func(rootfs string) bool { return rootfs == old.Rootfs }); err != nil {
		t.Fatal(err)
	}
	assertVersion(t, old.Rootfs, "custom-1")
	if _, err := top.Prune(func(string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	assertGone(t, old.Rootfs)
	assertVersion(t, got.Rootfs, "custom-1") // hard links: the copy keeps its files
	if migrated, err := top.MigrateCustom("prj_default"); err != nil || len(migrated) != 0 {
		t.Errorf("second MigrateCustom = %v, %v", migrated, err)
	}
	if _, err := os.Stat(filepath.Join(top.Dir(), projectsDir, "prj_default", "myapp")); err != nil {
		t.Errorf("the project's link: %v", err)
	}
}
