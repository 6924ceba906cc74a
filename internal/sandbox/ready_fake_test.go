package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lizard-build/lizard/internal/runtime"
	"github.com/lizard-build/lizard/internal/sandbox/sandboxtest"
	"github.com/lizard-build/lizard/internal/template"
)

// readyTemplates adds templates with a start command to the env's "base".
type readyTemplates struct {
	sandboxtest.Templates
	more map[string]template.Template
}

func (d readyTemplates) Lookup(project, name string) (template.Template, error) {
	if t, ok := d.more[name]; ok {
		return t, nil
	}
	return d.Templates.Lookup(project, name)
}

func (d readyTemplates) LookupVersion(project, name, digest string) (template.Template, error) {
	return d.Lookup(project, name)
}

// TestFakeReadyStates: the core over package ready. PrepareReady makes a
// template's state once; a create starts from a copy of it; a state whose
// restore fails is dropped and the create boots and starts the command
// itself (package ready's own tests cover the preparation).
func TestFakeReadyStates(t *testing.T) {
	env := newFakeEnv(t)
	served := template.Template{Name: "served", Version: "v1", Rootfs: env.Templates.Rootfs,
		StartCommand: []string{"sh", "-c", `echo started >> "$HOME/starts"; echo serving; exec sleep 600`},
		ReadyCommand: []string{"sh", "-c", `test -s "$HOME/starts"`}}
	readyDir := t.TempDir()
	tpls := readyTemplates{env.Templates, map[string]template.Template{"served": served}}
	s := env.service(t, func(c *Config) { c.ReadyDir, c.Templates, c.LogDir = readyDir, tpls, t.TempDir() })
	ctx := context.Background()

	var progress strings.Builder
	st, err := s.PrepareReady(ctx, served, "", &progress)
	if err != nil {
		t.Fatalf("PrepareReady: %v\n%s", err, progress.String())
	}
	if st.How != "the ready command passed" || st.StartPid <= 0 || st.AgentToken == "" || st.Size != DefaultSize {
		t.Fatalf("ready state %+v", st)
	}
	if !strings.Contains(progress.String(), "ready state: saved") {
		t.Fatalf("progress:\n%s", progress.String())
	}
	_, dir, ok := s.ready.Lookup(served, DefaultSize)
	if !ok {
		t.Fatal("no ready state after PrepareReady")
	}
	if _, err := os.Stat(filepath.Join(dir, runtime.ImageFile)); err != nil {
		t.Fatalf("the state has no image: %v", err)
	}
	// Asked again, the same state: nothing is booted.
	again, err := s.PrepareReady(ctx, served, "", nil)
	if err != nil || again.CreatedAt != st.CreatedAt || again.AgentToken != st.AgentToken {
		t.Fatalf("PrepareReady again: %+v, %v; want %+v", again, err, st)
	}
	// The preparing sandbox is gone.
	if list, _ := env.Runtime.List(ctx); len(list) != 0 {
		t.Fatalf("sandboxes left after preparing: %+v", list)
	}

	// A create is a copy of the state: the command's file is there, written
	// once, by the preparation.
	rec := env.create(t, s, CreateRequest{Template: "served"})
	if got := env.run(t, s, rec.ID, `cat "$HOME/starts"`); got != "started\n" {
		t.Fatalf("starts in a sandbox from the ready state: %q", got)
	}
	var msgs []string
	for _, l := range s.logs.tail(rec.ID, 100) {
		msgs = append(msgs, l.Message)
	}
	if !strings.Contains(strings.Join(msgs, "\n"), "started from the ready state of template served") {
		t.Fatalf("log %q", msgs)
	}

	// A state the runtime cannot restore is dropped; the create boots and
	// the command starts in the new sandbox.
	if err := os.WriteFile(filepath.Join(dir, runtime.ImageFile), []byte("not a digest"), 0o600); err != nil {
		t.Fatal(err)
	}
	booted := env.create(t, s, CreateRequest{Template: "served"})
	sandboxtest.Eventually(t, "the start command in the booted sandbox", func() bool {
		return env.run(t, s, booted.ID, `cat "$HOME/starts" 2>/dev/null || true`) == "started\n"
	})
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		// It may have been made again in the background already: then it
		// is a new, complete one.
		if st2, _, ok := s.ready.Lookup(served, DefaultSize); !ok || st2.AgentToken == st.AgentToken {
			t.Fatalf("the broken state is still there (%v)", err)
		}
	}
}

// TestFakeTmpdir: over the fake, each sandbox's commands have a TMPDIR of
// their own in their home, as each real sandbox has its own /tmp (the
// start command's files are there).
func TestFakeTmpdir(t *testing.T) {
	env := newFakeEnv(t)
	s := env.service(t, nil)
	a, b := env.create(t, s, CreateRequest{}), env.create(t, s, CreateRequest{})
	ta := env.run(t, s, a.ID, `echo "$TMPDIR"; test -d "$TMPDIR" && case "$TMPDIR" in "$HOME"/*) echo inside;; esac`)
	tb := env.run(t, s, b.ID, `echo "$TMPDIR"`)
	if !strings.HasSuffix(ta, "\ninside\n") || strings.TrimSuffix(ta, "inside\n") == tb || strings.TrimSpace(tb) == "" {
		t.Fatalf("TMPDIR of a: %q, of b: %q", ta, tb)
	}
}
