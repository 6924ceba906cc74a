package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/store/sqlite"
)

// TestTemplatePool: `lizard template pool` sets, replaces and removes a
// project's pools of built-in templates (an alias under its real name) and
// of the project's own (built here or published by a node), and refuses a
// bad size, an unknown sandbox size and a template the project does not
// see; `lizard template pools` lists them.
func TestTemplatePool(t *testing.T) {
	noConfig(t)
	ctx := context.Background()
	dataDir, tplDir := t.TempDir(), t.TempDir()
	st, def, other := poolStore(t, dataDir)
	// myapp is built in this machine's cache (the registry's layout: a
	// directory with its metadata and rootfs); remote only published by
	// another node.
	myapp := filepath.Join(tplDir, ".projects", def.ID, "myapp")
	if err := os.MkdirAll(filepath.Join(myapp, "rootfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(myapp, "template.json"), []byte(`{"version":"v1"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := st.PutTemplateVersion(ctx, store.TemplateVersion{ProjectID: def.ID, Name: "remote", Digest: "sha256:00", Node: "node-b"}); err != nil {
		t.Fatal(err)
	}

	run := func(args ...string) error {
		return Run(ctx, append(append([]string{"template"}, args...), "--data-dir", dataDir, "--template-dir", tplDir))
	}
	type pool struct {
		project, template, sandboxSize string
		size                           int
	}
	pools := func() []pool {
		t.Helper()
		ps, err := st.TemplatePools(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out := []pool{}
		for _, p := range ps {
			out = append(out, pool{p.ProjectID, p.Template, p.SandboxSize, p.Size})
		}
		return out
	}

	for _, args := range [][]string{
		{"pool", "base", "--size", "3"}, // the default sandbox size
		{"pool", "python312", "--size", "2", "--sandbox-size", "small"},
		{"pool", "myapp", "--size", "1", "--sandbox-size", "large"},
		{"pool", "remote", "--size", "4", "--sandbox-size", "nano"},
		{"pool", "node", "--size", "1", "--project", "other"},
	} {
		if err := run(args...); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
	}
	want := []pool{
		{def.ID, "base", "medium", 3},
		{def.ID, "myapp", "large", 1},
		{def.ID, "python", "small", 2},
		{def.ID, "remote", "nano", 4},
		{other.ID, "node", "medium", 1},
	}
	// same: the store lists by project id (random), template, sandbox size.
	same := func(got, want []pool) bool {
		want = slices.Clone(want)
		slices.SortFunc(want, func(a, b pool) int {
			return strings.Compare(a.project+"/"+a.template+"/"+a.sandboxSize, b.project+"/"+b.template+"/"+b.sandboxSize)
		})
		return slices.Equal(got, want)
	}
	if got := pools(); !same(got, want) {
		t.Fatalf("pools: %+v, want %+v", got, want)
	}

	for _, tc := range []struct {
		args []string
		is   error
		says string
	}{
		{[]string{"pool", "base", "--size", "101"}, errdefs.ErrInvalid, "0 (no pool) to 100"},
		{[]string{"pool", "base", "--size", "-1"}, errdefs.ErrInvalid, "0 (no pool) to 100"},
		{[]string{"pool", "base", "--size", "1", "--sandbox-size", "huge"}, errdefs.ErrInvalid, "nano, mini, small, medium, large, big"},
		{[]string{"pool", "nope", "--size", "1"}, errdefs.ErrNotFound, `template "nope" not found for project default`},
		{[]string{"pool", "myapp", "--size", "1", "--project", "other"}, errdefs.ErrNotFound, `template "myapp" not found for project other`},
		{[]string{"pool", "base", "--size", "1", "--project", "nobody"}, errdefs.ErrNotFound, "--project nobody"},
	} {
		if err := run(tc.args...); !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%v: %v, want %v saying %q", tc.args, err, tc.is, tc.says)
		}
	}
	if err := run("pool", "base"); err == nil || !strings.Contains(err.Error(), "--size N is required") {
		t.Errorf("pool without --size: %v", err)
	}
	if got := pools(); !same(got, want) {
		t.Fatalf("pools after refused sets: %+v, want %+v", got, want)
	}

	// A second setting replaces the first; a size of 0 removes it, and
	// removing it again is no error.
	if err := run("pool", "base", "--size", "5"); err != nil {
		t.Fatal(err)
	}
	want[0].size = 5
	if got := pools(); !same(got, want) {
		t.Fatalf("pools after a replace: %+v, want %+v", got, want)
	}
	var out bytes.Buffer
	if err := setTemplatePool(ctx, &out, st, nil, templatePool{project: "default", template: "python", sandboxSize: "small"}); err != nil {
		t.Fatal(err)
	}
	if got := out.String(); got != "pool of python (small) for project default removed\n" {
		t.Fatalf("remove says %q", got)
	}
	if err := run("pool", "python", "--size", "0", "--sandbox-size", "small"); err != nil {
		t.Fatalf("remove a missing pool: %v", err)
	}
	want = slices.Delete(want, 2, 3)
	if got := pools(); !same(got, want) {
		t.Fatalf("pools after a remove: %+v, want %+v", got, want)
	}
	out.Reset()
	if err := setTemplatePool(ctx, &out, st, nil, templatePool{project: "default", template: "base", size: 3}); err != nil {
		t.Fatal(err)
	}
	if got := out.String(); got != "pool of base (medium) for project default: 3 sandboxes per node\n" {
		t.Fatalf("set says %q", got)
	}

	// The listing: the project's pools, or every project's with --all.
	out.Reset()
	if err := listTemplatePools(ctx, &out, st, "default", false); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 4 || strings.Join(strings.Fields(lines[0]), " ") != "TEMPLATE SANDBOX SIZE SIZE UPDATED" ||
		!slices.Equal(strings.Fields(lines[1])[:3], []string{"base", "medium", "3"}) ||
		!slices.Equal(strings.Fields(lines[2])[:3], []string{"myapp", "large", "1"}) ||
		!slices.Equal(strings.Fields(lines[3])[:3], []string{"remote", "nano", "4"}) {
		t.Fatalf("template pools:\n%s", out.String())
	}
	out.Reset()
	if err := listTemplatePools(ctx, &out, st, "default", true); err != nil {
		t.Fatal(err)
	}
	lines = strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 5 || !strings.HasPrefix(lines[0], "PROJECT") || !slices.ContainsFunc(lines, func(l string) bool {
		return slices.Equal(strings.Fields(l)[:4], []string{"other", "node", "medium", "1"})
	}) {
		t.Fatalf("template pools --all:\n%s", out.String())
	}
	for _, args := range [][]string{{"pools"}, {"pools", "--all"}, {"pools", "--project", "other"}} {
		if err := run(args...); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
	}
}

// TestParseTemplatePools: serve's --template-pool values become settings
// of the named project (default when none), the size resolved; bad ones
// are refused naming the value.
func TestParseTemplatePools(t *testing.T) {
	ctx := context.Background()
	st, def, other := poolStore(t, t.TempDir())
	got, err := parseTemplatePools(ctx, st, []string{"base=2", "other/python312:small=1", other.ID + "/myapp:nano=100"})
	if err != nil {
		t.Fatal(err)
	}
	want := []store.TemplatePool{
		{ProjectID: def.ID, Template: "base", SandboxSize: "medium", Size: 2},
		{ProjectID: other.ID, Template: "python", SandboxSize: "small", Size: 1},
		{ProjectID: other.ID, Template: "myapp", SandboxSize: "nano", Size: 100},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("parsed %+v, want %+v", got, want)
	}
	for v, says := range map[string]string{
		"base":           "want [PROJECT/]TEMPLATE",
		"base=0":         `N "0"`,
		"base=101":       `N "101"`,
		"base:huge=1":    `size "huge"`,
		"nobody/base=1":  `project "nobody"`,
		"=1":             "no template",
		"other/:small=1": "no template",
	} {
		if _, err := parseTemplatePools(ctx, st, []string{v}); err == nil || !strings.Contains(err.Error(), says) || !strings.Contains(err.Error(), v) {
			t.Errorf("--template-pool %q: %v, want an error saying %q", v, err, says)
		}
	}
}

// poolStore opens the SQLite store of dataDir with two projects, default
// and other; it is closed at the test's end.
func poolStore(t *testing.T, dataDir string) (*sqlite.Store, store.Project, store.Project) {
	t.Helper()
	ctx := context.Background()
	st, err := sqlite.Open(filepath.Join(dataDir, "lizard.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	var ps []store.Project
	for _, name := range []string{"default", "other"} {
		p, err := st.CreateProject(ctx, name, name)
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	return st, ps[0], ps[1]
}
