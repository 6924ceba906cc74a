package ready

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/runtime"
	"github.com/lizard-build/lizard/internal/runtime/fake"
	"github.com/lizard-build/lizard/internal/sandbox/sandboxtest"
	"github.com/lizard-build/lizard/internal/template"
)

// newStates returns States over the fake runtime, without the sandbox
// core: background work runs until the test ends; booting records what is
// being made.
func newStates(t *testing.T) (*States, *fake.Runtime, *sync.Map) {
	t.Helper()
	rt, err := fake.New(fake.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var bg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		bg.Wait()
		list, _ := rt.List(context.Background())
		for _, sb := range list {
			rt.Destroy(context.Background(), sb.ID)
		}
	})
	var booting sync.Map
	s := New(Config{
		Dir: t.TempDir(), Runtime: rt, Checkpointer: rt,
		Mounts: func(string) []runtime.Mount { return nil },
		Booting: func(id, rootfs string) func() {
			booting.Store(id, rootfs)
			return func() { booting.Delete(id) }
		},
		AgentUp: func(ctx context.Context, addr, token string, _ time.Duration) (*agent.Client, error) {
			ag := agent.NewClient("http://"+addr, token, http.DefaultClient)
			for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				if _, err := ag.Health(ctx); err == nil {
					return ag, nil
				} else if time.Now().After(end) {
					return nil, err
				}
			}
		},
		Go: func(fn func(context.Context)) {
			bg.Add(1)
			go func() { defer bg.Done(); fn(ctx) }()
		},
	})
	return s, rt, &booting
}

var medium = Size{Name: "medium", Resources: runtime.Resources{CPUs: 1, MemoryMB: 512}}

// TestPrepare: a state is made once (its sandbox booted, marked booting,
// destroyed after), concurrent preparations of it share one boot, a start
// command that exits is an error with its status and output and is not
// retried in the background at once, and PrepareTemplates makes missing
// states and removes the states of templates that are gone.
func TestPrepare(t *testing.T) {
	s, rt, booting := newStates(t)
	rootfs := t.TempDir()
	served := template.Template{Name: "served", Version: "v1", Rootfs: rootfs,
		Env:          []string{"WHO=served"},
		StartCommand: []string{"sh", "-c", `echo "$WHO" >> "$HOME/starts"; exec sleep 600`},
		ReadyCommand: []string{"sh", "-c", `test -s "$HOME/starts"`}}
	ctx := context.Background()

	var wg sync.WaitGroup
	states := make([]State, 3)
	errs := make([]error, 3)
	for i := range states {
		wg.Add(1)
		go func() {
			defer wg.Done()
			states[i], errs[i] = s.Prepare(ctx, served, medium, nil)
		}()
	}
	wg.Wait()
	for i := range states {
		if errs[i] != nil || states[i].AgentToken != states[0].AgentToken {
			t.Fatalf("preparation %d: %+v, %v; want the first's %+v", i, states[i], errs[i], states[0])
		}
	}
	st, dir, ok := s.Lookup(served, "medium")
	if !ok || st.AgentToken != states[0].AgentToken || st.How != "the ready command passed" {
		t.Fatalf("Lookup: %+v %v", st, ok)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "home", "starts")); err != nil || string(b) != "served\n" {
		t.Fatalf("the state's files: %q, %v (the command runs once, with the template's env)", b, err)
	}
	if list, _ := rt.List(ctx); len(list) != 0 {
		t.Fatalf("sandboxes left: %+v", list)
	}
	n := 0
	booting.Range(func(any, any) bool { n++; return true })
	if n != 0 {
		t.Fatalf("%d sandboxes still marked booting", n)
	}
	if _, _, ok := s.Lookup(served, "large"); ok {
		t.Fatal("a state of another size")
	}

	// A start command that exits first.
	failing := template.Template{Name: "failing", Version: "v1", Rootfs: rootfs,
		StartCommand: []string{"sh", "-c", "echo no config >&2; exit 3"}, ReadyCommand: []string{"false"}}
	_, err := s.Prepare(ctx, failing, medium, nil)
	if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "status 3") || !strings.Contains(err.Error(), "no config") {
		t.Fatalf("Prepare of a command that exits: %v", err)
	}
	if !s.failedLately(keyOf(failing, "medium")) {
		t.Fatal("the failure is not remembered")
	}
	if _, err := s.Prepare(ctx, template.Template{Name: "plain", Rootfs: rootfs}, medium, nil); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("Prepare of a template without a start command: %v", err)
	}

	// PrepareTemplates: a state of a template that is gone goes; a missing
	// one is made; the failed one is not tried again yet.
	gone := filepath.Join(s.cfg.Dir, "gone")
	if err := os.MkdirAll(filepath.Join(gone, "v0", "medium"), 0o700); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	os.Chtimes(gone, old, old)
	s.Drop(dir)
	if _, _, ok := s.Lookup(served, "medium"); ok {
		t.Fatal("the state is still there after Drop")
	}
	s.PrepareTemplates(func() ([]template.Template, error) { return []template.Template{served, failing}, nil }, medium)
	sandboxtest.Eventually(t, "PrepareTemplates to make the state again", func() bool {
		_, _, ok := s.Lookup(served, "medium")
		return ok
	})
	sandboxtest.Eventually(t, "the scan to end", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return !s.scanning
	})
	if _, err := os.Stat(gone); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the state of a template that is gone is still there: %v", err)
	}
	if _, _, ok := s.Lookup(failing, "medium"); ok {
		t.Fatal("a state for the failing command")
	}
}
