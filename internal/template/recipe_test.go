package template

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestAliases(t *testing.T) {
	for in, want := range map[string]string{"python312": "python", "node22": "node", "python": "python", "base": "base", "nope": "nope"} {
		if got := Resolve(in); got != want {
			t.Errorf("Resolve(%q) = %q, want %q", in, got, want)
		}
	}
	if got := AliasesOf("python"); !reflect.DeepEqual(got, []string{"python312"}) {
		t.Errorf("AliasesOf(python) = %v", got)
	}
	if got := AliasesOf("base"); got != nil {
		t.Errorf("AliasesOf(base) = %v, want nil", got)
	}
	// Every alias names a built-in template.
	for a, real := range aliases {
		if _, ok := builtins[real]; !ok {
			t.Errorf("alias %s → %s: not a built-in", a, real)
		}
		if _, ok := builtins[a]; ok {
			t.Errorf("alias %s is also a built-in", a)
		}
	}
}

func TestGetListResolveAliases(t *testing.T) {
	dir := t.TempDir()
	built := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	versions := map[string]string{"python": "3.11.2", "debian": "12.12"}
	fakeTemplate(t, dir, "python", metadata{Name: "python", Version: "bookworm-1", BuiltAt: built, Versions: versions})
	fakeTemplate(t, dir, "base", metadata{Name: "base", Version: "bookworm-2", BuiltAt: built})
	// A directory named like an alias is not a template of its own.
	fakeTemplate(t, dir, "node22", metadata{Name: "node22", Version: "x"})
	r := NewRegistry(dir)
	r.Debootstrap = "/nonexistent/debootstrap" // a build would fail

	for _, name := range []string{"python", "python312"} {
		got, err := r.Get(name)
		if err != nil {
			t.Fatalf("Get(%s): %v", name, err)
		}
		if got.Name != "python" || got.Version != "bookworm-1" || got.Rootfs != filepath.Join(dir, "python", "rootfs") ||
			!reflect.DeepEqual(got.Aliases, []string{"python312"}) || !reflect.DeepEqual(got.Versions, versions) {
			t.Errorf("Get(%s) = %+v", name, got)
		}
	}
	// node is not built: its alias is not found either, whatever is on disk.
	_, err := r.Get("node22")
	assertNotFound(t, err)

	got, err := r.EnsureBuilt(context.Background(), "python312", nil)
	if err != nil || got.Name != "python" {
		t.Errorf("EnsureBuilt(python312) = %+v, %v", got, err)
	}

	list, err := r.List()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tp := range list {
		names = append(names, tp.Name)
	}
	if !reflect.DeepEqual(names, []string{"base", "python"}) {
		t.Errorf("List names = %v, want [base python]", names)
	}
	if list[0].Aliases != nil || list[0].Versions != nil {
		t.Errorf("base = %+v, want no aliases nor versions", list[0])
	}
}

// TestRecipes: every built-in is base plus its packages, ends with the
// steps every template needs and installs what its users run.
func TestRecipes(t *testing.T) {
	common := []string{"creating user \"user\" (uid 1000)", "creating /.lizard", "writing /etc/hosts", "removing build-host files", "cleaning apt caches"}
	for name, rec := range builtins {
		if rec.Suite != "bookworm" || rec.Variant != "minbase" || !reflect.DeepEqual(rec.Packages, basePackages) {
			t.Errorf("%s: suite %s variant %s packages %v", name, rec.Suite, rec.Variant, rec.Packages)
		}
		var descs []string
		for _, s := range rec.Post {
			descs = append(descs, s.Desc)
		}
		if len(descs) < len(common) || !reflect.DeepEqual(descs[len(descs)-len(common):], common) {
			t.Errorf("%s: post steps %q do not end with %q", name, descs, common)
		}
		for _, kv := range rec.Env {
			if strings.HasPrefix(kv, "MPLBACKEND=") {
				t.Errorf("%s: MPLBACKEND in the environment would keep ipykernel from showing plots inline", name)
			}
		}
	}
	if got, want := builtins["python"].allPackages(), slices.Concat(basePackages, []string{"python3-pip", "python3-venv"}); !reflect.DeepEqual(got, want) {
		t.Errorf("python allPackages = %v, want %v", got, want)
	}
	// base is E2B's base too: git, sudo for user, python.
	if rec := builtins["base"]; !reflect.DeepEqual(rec.Install, []string{"git", "sudo", "python-is-python3"}) || len(rec.Check) != 3 ||
		rec.Post[0].Desc != sudoForUser.Desc {
		t.Errorf("base installs %v, checks %v, first step %q", rec.Install, rec.Check, rec.Post[0].Desc)
	}
	want := map[string][]string{
		"python":      {"python3", "python3-pip", "python3-venv"},
		"node":        {"nodejs", "npm"},
		"interpreter": {"python3-ipykernel", "python3-jupyter-client", "python3-matplotlib-inline", "python3-numpy", "python3-pandas", "python3-matplotlib", "nodejs", "bash"},
		"desktop":     {"xvfb", "openbox", "chromium", "xdotool", "x11vnc", "novnc", "websockify", "imagemagick"},
		"claude":      {"nodejs", "npm"},
		"codex":       {"nodejs", "npm"},
	}
	for name, pkgs := range want {
		for _, p := range pkgs {
			if !slices.Contains(builtins[name].Install, p) {
				t.Errorf("%s does not install %s", name, p)
			}
		}
		if len(builtins[name].Check) == 0 {
			t.Errorf("%s has no check", name)
		}
	}
}

// TestAgentTemplates: claude and codex install their agent's CLI with npm
// at a pinned version and check that it runs.
func TestAgentTemplates(t *testing.T) {
	for name, pkg := range map[string]string{"claude": "@anthropic-ai/claude-code@" + claudeCodeVersion, "codex": "@openai/codex@" + codexVersion} {
		rec := builtins[name]
		if len(rec.Post) == 0 || !strings.Contains(rec.Post[0].Desc, pkg) {
			t.Errorf("%s: first step %q, want the npm install of %s", name, rec.Post[0].Desc, pkg)
		}
		if !reflect.DeepEqual(rec.Check, [][]string{{name, "--version"}}) {
			t.Errorf("%s: checks %v", name, rec.Check)
		}
	}
}

func TestAggBackend(t *testing.T) {
	rootfs := t.TempDir()
	if err := os.Mkdir(filepath.Join(rootfs, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	rc := filepath.Join(rootfs, "etc", "matplotlibrc")
	// Without a matplotlibrc: one is written.
	if err := aggBackend.Run(context.Background(), rootfs, nil); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(rc); string(b) != "backend: Agg\n" {
		t.Errorf("new matplotlibrc = %q", b)
	}
	// With one: its backend line is replaced, the rest kept.
	if err := os.WriteFile(rc, []byte("#backend: Agg\nbackend      : TkAgg\nfont.size: 10"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := aggBackend.Run(context.Background(), rootfs, nil); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(rc); string(b) != "#backend: Agg\nfont.size: 10\nbackend: Agg\n" {
		t.Errorf("edited matplotlibrc = %q", b)
	}
}

func TestAllowPip(t *testing.T) {
	rootfs := t.TempDir()
	marker := filepath.Join(rootfs, "usr", "lib", "python3.11", "EXTERNALLY-MANAGED")
	if err := os.MkdirAll(filepath.Dir(marker), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(marker, []byte("[externally-managed]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := allowPip.Run(context.Background(), rootfs, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Errorf("marker still there: %v", err)
	}
	// Nothing to remove is fine.
	if err := allowPip.Run(context.Background(), rootfs, nil); err != nil {
		t.Error(err)
	}
}
