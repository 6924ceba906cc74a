package tmplqueue

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/template"
)

// builder builds each template when the test lets it: it writes "step
// 1" and "step 2 of <name>", then waits for its release, then succeeds
// or fails as told; built templates are found by Lookup.
type builder struct {
	mu      sync.Mutex
	built   map[string]bool
	release map[string]chan error
	started chan string
}

func newBuilder(names ...string) *builder {
	b := &builder{built: map[string]bool{"base": true}, release: map[string]chan error{}, started: make(chan string, len(names))}
	for _, n := range names {
		b.release[n] = make(chan error)
	}
	return b
}

func (b *builder) EnsureBuilt(ctx context.Context, name string, progress io.Writer) (template.Template, error) {
	b.started <- name
	fmt.Fprintf(progress, "step 1\nstep 2 of %s", name) // the last line unfinished
	fmt.Fprint(progress, "\n")
	select {
	case err := <-b.release[name]:
		if err != nil {
			return template.Template{}, err
		}
	case <-ctx.Done():
		return template.Template{}, ctx.Err()
	}
	b.mu.Lock()
	b.built[name] = true
	b.mu.Unlock()
	return template.Template{Name: name, Version: "v1"}, nil
}

func (b *builder) Lookup(project, name string) (template.Template, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.built[template.Resolve(name)] {
		return template.Template{}, fmt.Errorf("template %q: %w", name, errdefs.ErrNotFound)
	}
	return template.Template{Name: name}, nil
}

func (b *builder) LookupVersion(project, name, digest string) (template.Template, error) {
	return b.Lookup(project, name)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// TestQueue: templates are built one after another; until built, a
// lookup of one queued or building is 503 template_building naming its
// state (a failed one is not found again); the status file says the
// same, and goes once every build ended well.
func TestQueue(t *testing.T) {
	b := newBuilder("python", "node")
	file := filepath.Join(t.TempDir(), "builds.json")
	q := New(Config{Builder: b, Templates: b, Names: []string{"python312", "node"}, StatusFile: file})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { q.Run(ctx); close(done) }()

	if got := <-b.started; got != "python" {
		t.Fatalf("first build %q, want python (python312 is its alias)", got)
	}
	waitFor(t, "python's progress", func() bool { s, _ := q.Status("python"); return s.Progress == "step 2 of python" })
	building := func(name, says string) {
		t.Helper()
		_, err := q.Lookup("p", name)
		if !errors.Is(err, errdefs.ErrUnavailable) || errdefs.Code(err) != ErrBuilding || !strings.Contains(err.Error(), says) {
			t.Fatalf("Lookup %s: %v, want %s saying %q", name, err, ErrBuilding, says)
		}
	}
	building("python", "is being built (step 2 of python)")
	building("node", "waits to be built")
	if _, err := q.Lookup("p", "base"); err != nil {
		t.Fatalf("Lookup base: %v", err)
	}
	if _, err := q.Lookup("p", "nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Lookup of a template not queued: %v", err)
	}
	list, err := ReadStatus(file)
	if err != nil || len(list) != 2 || list[0].Name != "python" || list[0].State != Building || list[1].State != Queued {
		t.Fatalf("status file: %+v %v", list, err)
	}

	b.release["python"] <- nil
	if got := <-b.started; got != "node" {
		t.Fatalf("second build %q", got)
	}
	if _, ok := q.Status("python"); ok {
		t.Fatalf("python is still listed after its build")
	}
	if _, err := q.Lookup("p", "python"); err != nil {
		t.Fatalf("Lookup python once built: %v", err)
	}
	b.release["node"] <- errors.New("apt-get failed")
	<-done
	s, ok := q.Status("node")
	if !ok || s.State != Failed || s.Progress != "apt-get failed" {
		t.Fatalf("node after its build failed: %+v %v", s, ok)
	}
	if _, err := q.Lookup("p", "node"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Lookup of a failed build: %v, want not found", err)
	}
	if list, _ := ReadStatus(file); len(list) != 1 || list[0].State != Failed {
		t.Fatalf("status file after the builds: %+v", list)
	}
}

// TestQueueCancelled: a server stopping mid-build leaves the template
// building (for the next start) and stops.
func TestQueueCancelled(t *testing.T) {
	b := newBuilder("python")
	q := New(Config{Builder: b, Templates: b, Names: []string{"python"}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { q.Run(ctx); close(done) }()
	<-b.started
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	if s, ok := q.Status("python"); !ok || s.State != Building {
		t.Fatalf("status after a cancel: %+v %v", s, ok)
	}
	if list, err := ReadStatus(filepath.Join(t.TempDir(), "none.json")); err != nil || list != nil {
		t.Fatalf("ReadStatus of no file: %v %v", list, err)
	}
}
