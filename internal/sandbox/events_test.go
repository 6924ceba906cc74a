package sandbox

import (
	"context"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/sandbox/sandboxtest"
)

// recorder is an EventSink that keeps what it is told.
type recorder struct {
	mu     sync.Mutex
	events []Event
}

func (r *recorder) Publish(ev Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, ev)
}

// of returns "type/by" of the events of sandbox id, in order.
func (r *recorder) of(id string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, ev := range r.events {
		if ev.SandboxID == id {
			out = append(out, ev.Type+"/"+ev.By)
		}
	}
	return out
}

// TestFakeEvents: every lifecycle step of a sandbox is told to the sink
// once, with its cause; warm copies are told only when claimed.
func TestFakeEvents(t *testing.T) {
	env := newFakeEnv(t)
	rec := &recorder{}
	s := env.service(t, func(c *Config) { c.Events = rec })
	ctx := context.Background()

	a := env.create(t, s, CreateRequest{})
	if err := s.Pause(ctx, env.Project.ID, a.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Resume(WithCause(ctx, CauseTraffic), env.Project.ID, a.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.Kill(ctx, env.Project.ID, a.ID); err != nil {
		t.Fatal(err)
	}
	want := []string{"sandbox.created/api", "sandbox.paused/api", "sandbox.resumed/traffic", "sandbox.killed/api"}
	if got := rec.of(a.ID); !slices.Equal(got, want) {
		t.Fatalf("events of a created, paused, resumed and killed sandbox: %q, want %q", got, want)
	}

	timedOut := env.create(t, s, CreateRequest{TimeoutMs: 200})
	autoPaused := env.create(t, s, CreateRequest{TimeoutMs: 200, AutoPause: true})
	sandboxtest.Eventually(t, "both deadlines", func() bool {
		return len(rec.of(timedOut.ID)) == 2 && len(rec.of(autoPaused.ID)) == 2
	})
	if got, want := rec.of(timedOut.ID), []string{"sandbox.created/api", "sandbox.timed_out/timeout"}; !slices.Equal(got, want) {
		t.Fatalf("a sandbox killed by its deadline: %q, want %q", got, want)
	}
	if got, want := rec.of(autoPaused.ID), []string{"sandbox.created/api", "sandbox.paused/timeout"}; !slices.Equal(got, want) {
		t.Fatalf("a sandbox paused by its deadline: %q, want %q", got, want)
	}

	dies := env.create(t, s, CreateRequest{})
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { s.Watch(wctx, 50*time.Millisecond); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	if err := env.Runtime.Crash(dies.ID); err != nil {
		t.Fatal(err)
	}
	sandboxtest.Eventually(t, "the death to be told", func() bool { return len(rec.of(dies.ID)) == 2 })
	rec.mu.Lock()
	last := rec.events[len(rec.events)-1]
	rec.mu.Unlock()
	if last.Type != EventDied || last.Detail == "" || last.ProjectID != env.Project.ID || last.At.IsZero() {
		t.Fatalf("the death: %+v", last)
	}

	// A snapshot's warm copy is no sandbox of the project until claimed.
	src := env.create(t, s, CreateRequest{})
	rec.mu.Lock()
	before := len(rec.events)
	rec.mu.Unlock()
	dir := filepath.Join(t.TempDir(), "image")
	saved, err := s.Checkpoint(ctx, env.Project.ID, src.ID, dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Copy(ctx, CopyRequest{From: saved, Dir: dir, SnapshotID: "snap_x", PoolOf: "snap_x"}); err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	after := len(rec.events)
	rec.mu.Unlock()
	if after != before {
		t.Fatalf("%d events told while the snapshot and its warm copy were made, want none (a copy is told of when claimed): %+v", after-before, rec.events[before:])
	}
	claimed, ok := s.Claim(ctx, "snap_x", 0)
	if !ok {
		t.Fatal("no warm copy to claim")
	}
	if got := rec.of(claimed.ID); len(got) != 1 || got[0] != "sandbox.created/api" {
		t.Fatalf("a claimed warm copy: %q", got)
	}
}
