// Package sandboxtest is what tests of the sandbox service and of its
// feature packages stand on without root or runsc: the fake runtime
// (internal/runtime/fake), a SQLite store with one project, a template
// registry of one empty "base" template, and the service's log sent to the
// test's. It does not import the service (the service's own tests use it
// too); each test builds its sandbox.Service from an Env.
package sandboxtest

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/runtime/fake"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/store/sqlite"
	"github.com/lizard-build/lizard/internal/template"
)

// Templates has one template, "base", whose rootfs is an empty directory
// (the fake only checks that it exists).
type Templates struct{ Rootfs string }

// Lookup implements sandbox.Templates.
func (d Templates) Lookup(project, name string) (template.Template, error) {
	if name != "base" {
		return template.Template{}, errdefs.ErrNotFound
	}
	return template.Template{Name: "base", Rootfs: d.Rootfs}, nil
}

// LookupVersion implements sandbox.Templates.
func (d Templates) LookupVersion(project, name, digest string) (template.Template, error) {
	return d.Lookup(project, name)
}

// Env is what a service over the fake stands on; a second service over
// the same Env is the server restarted.
type Env struct {
	Runtime     *fake.Runtime
	Store       *sqlite.Store
	Project     store.Project
	Templates   Templates
	SnapshotDir string
}

// NewEnv makes an Env in the test's temporary directories; the fake's
// sandboxes are destroyed at the test's end.
func NewEnv(t testing.TB) *Env {
	t.Helper()
	rt, err := fake.New(fake.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	st, p := ProjectStore(t)
	env := &Env{Runtime: rt, Store: st, Project: p, Templates: Templates{Rootfs: t.TempDir()}, SnapshotDir: t.TempDir()}
	t.Cleanup(func() {
		list, _ := rt.List(context.Background())
		for _, sb := range list {
			rt.Destroy(context.Background(), sb.ID)
		}
	})
	return env
}

// ProjectStore opens a SQLite store in a temporary directory with one
// project, "p".
func ProjectStore(t testing.TB) (*sqlite.Store, store.Project) {
	t.Helper()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "lizard.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	p, err := st.CreateProject(context.Background(), "p", "p")
	if err != nil {
		t.Fatal(err)
	}
	return st, p
}

// Logger sends warnings and errors to the test's log.
func Logger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// Eventually polls cond for up to 10 s.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// Stdout runs one command through exec, which hands the command's agent
// events to onEvent (a service's Exec), and returns what it wrote to
// stdout; the test fails unless it ran and exited 0.
func Stdout(t testing.TB, what string, exec func(onEvent func(agent.Event) error) error) string {
	t.Helper()
	var out strings.Builder
	code := -1
	err := exec(func(ev agent.Event) error {
		if ev.Line != nil && ev.Stream == "stdout" {
			out.WriteString(*ev.Line + "\n")
		}
		if ev.ExitCode != nil {
			code = *ev.ExitCode
		}
		return nil
	})
	if err != nil || code != 0 {
		t.Fatalf("exec %s: exit %d, %v (out %q)", what, code, err, out.String())
	}
	return out.String()
}
