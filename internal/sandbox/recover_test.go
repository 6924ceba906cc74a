package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/runtime"
	"github.com/lizard-build/lizard/internal/sandbox/sandboxtest"
	"github.com/lizard-build/lizard/internal/store"
)

// stateRuntime is a runtime that holds sandboxes made by an earlier server:
// recovery lists them and asks their state; Destroy records what it
// destroyed. Nothing is created here.
type stateRuntime struct {
	mu        sync.Mutex
	state     map[string]runtime.State // a missing id is not held
	destroyed []string
}

var _ runtime.Stater = (*stateRuntime)(nil)

func (r *stateRuntime) set(id string, st runtime.State) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if st == "" {
		delete(r.state, id)
		return
	}
	r.state[id] = st
}

func (r *stateRuntime) Create(context.Context, runtime.Spec) (runtime.Sandbox, error) {
	return runtime.Sandbox{}, errors.New("not in this test")
}
func (r *stateRuntime) Start(context.Context, string) error { return errors.New("not in this test") }
func (r *stateRuntime) Stop(context.Context, string) error  { return errors.New("not in this test") }

func (r *stateRuntime) Destroy(_ context.Context, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.state, id)
	r.destroyed = append(r.destroyed, id)
	return nil
}

func (r *stateRuntime) List(context.Context) ([]runtime.Sandbox, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []runtime.Sandbox
	for id, st := range r.state {
		out = append(out, runtime.Sandbox{ID: id, State: st})
	}
	return out, nil
}

func (r *stateRuntime) State(_ context.Context, id string) (runtime.State, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st, ok := r.state[id]
	if !ok {
		return "", fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	return st, nil
}

func (r *stateRuntime) wasDestroyed(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range r.destroyed {
		if d == id {
			return true
		}
	}
	return false
}

// fakeAgent answers GET /health only while answering is set; otherwise it
// holds the request until the client gives up, as a starved agent does.
type fakeAgent struct {
	*httptest.Server
	answering atomic.Bool
}

func newFakeAgent(t *testing.T) *fakeAgent {
	a := &fakeAgent{}
	a.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !a.answering.Load() {
			<-r.Context().Done()
			return
		}
		if r.URL.Path != "/health" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"version":3}`)
	}))
	t.Cleanup(a.Close)
	return a
}

// TestRecoverUnresponsive: after a restart, a sandbox whose container runs
// but whose agent does not answer the probe is kept as unresponsive (listed
// so, 503 unresponsive to calls, never destroyed) and reattached once its
// agent answers; one the runtime no longer holds, or holds stopped, is
// destroyed; an unresponsive one can still be killed.
func TestRecoverUnresponsive(t *testing.T) {
	ctx := context.Background()
	st, p := sandboxtest.ProjectStore(t)
	rt := &stateRuntime{state: map[string]runtime.State{}}
	slow, frozen, quick := newFakeAgent(t), newFakeAgent(t), newFakeAgent(t)
	quick.answering.Store(true)
	put := func(id, addr string, state runtime.State) {
		t.Helper()
		rec := Record{ID: id, ProjectID: p.ID, Template: "base", Size: "small", Status: StatusRunning,
			AgentAddr: addr, AgentToken: "token-" + id, StartedAt: time.Now().UTC(), Rootfs: "/templates/base/rootfs"}
		spec, _ := json.Marshal(rec)
		if err := st.PutSandbox(ctx, store.Sandbox{ID: id, ProjectID: p.ID, Template: "base", Size: "small",
			Status: StatusRunning, Spec: spec, StartedAt: rec.StartedAt}); err != nil {
			t.Fatal(err)
		}
		rt.set(id, state)
	}
	hostOf := func(a *fakeAgent) string { return strings.TrimPrefix(a.URL, "http://") }
	put("slow", hostOf(slow), runtime.StateRunning)       // answers later
	put("frozen", hostOf(frozen), runtime.StateRunning)   // never answers; killed
	put("quick", hostOf(quick), runtime.StateRunning)     // answers at once
	put("stopped", hostOf(frozen), runtime.StateStopped)  // the runtime says stopped
	put("vanished", hostOf(frozen), runtime.StateRunning) // gone from the runtime before it lists

	s := New(Config{Runtime: rt, Store: st, RecoverProbeTimeout: time.Second})
	defer s.Close()
	if err := s.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	rt.set("vanished", "")

	statusOf := func(id string) string {
		for _, r := range s.List(p.ID) {
			if r.ID == id {
				return r.Status
			}
		}
		return "absent"
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for end := time.Now().Add(20 * time.Second); !cond(); {
			if time.Now().After(end) {
				t.Fatalf("%s: not within 20 s (slow %s, frozen %s, quick %s; destroyed %v)", what,
					statusOf("slow"), statusOf("frozen"), statusOf("quick"), rt.destroyed)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitFor("slow and frozen unresponsive", func() bool {
		return statusOf("slow") == StatusUnresponsive && statusOf("frozen") == StatusUnresponsive
	})
	if got := statusOf("quick"); got != StatusRunning {
		t.Fatalf("quick: %s, want running", got)
	}
	waitFor("stopped and vanished destroyed", func() bool { return rt.wasDestroyed("stopped") && rt.wasDestroyed("vanished") })
	if rt.wasDestroyed("slow") || rt.wasDestroyed("frozen") {
		t.Fatalf("a running sandbox was destroyed for not answering: %v", rt.destroyed)
	}
	// Shown in Get and in the metrics inventory; every call is a 503
	// unresponsive.
	if rec, err := s.Get(p.ID, "slow"); err != nil || rec.Status != StatusUnresponsive {
		t.Fatalf("get: %+v %v", rec.Status, err)
	}
	unresponsive := 0
	for _, sb := range s.Sandboxes() {
		if sb.State == StatusUnresponsive {
			unresponsive++
		}
	}
	if unresponsive != 2 {
		t.Fatalf("inventory shows %d unresponsive, want 2", unresponsive)
	}
	err := s.Exec(ctx, p.ID, "slow", ExecRequest{Cmd: []string{"true"}}, nil)
	if !errors.Is(err, errdefs.ErrUnavailable) || errdefs.Code(err) != "unresponsive" {
		t.Fatalf("exec of an unresponsive sandbox: %v (code %q)", err, errdefs.Code(err))
	}
	// A feature's change of the record waits for the sandbox to answer.
	if _, err := s.Update(ctx, p.ID, "slow", func(*Record) error { return nil }); errdefs.Code(err) != "unresponsive" {
		t.Fatalf("update of an unresponsive sandbox: %v", err)
	}
	if _, err := s.Get("other-project", "slow"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another project sees it: %v", err)
	}
	// Some probes later the agent answers: reattached, running, its record
	// kept.
	time.Sleep(1500 * time.Millisecond)
	slow.answering.Store(true)
	waitFor("slow reattached", func() bool { return statusOf("slow") == StatusRunning })
	if _, err := s.lookup(p.ID, "slow"); err != nil {
		t.Fatalf("reattached sandbox: %v", err)
	}
	if rt.wasDestroyed("slow") {
		t.Fatal("slow was destroyed")
	}
	// A kill of one that never answers destroys it and its record.
	if err := s.Kill(ctx, p.ID, "frozen"); err != nil {
		t.Fatalf("kill of an unresponsive sandbox: %v", err)
	}
	if !rt.wasDestroyed("frozen") || statusOf("frozen") != "absent" {
		t.Fatalf("frozen after its kill: %s, destroyed %v", statusOf("frozen"), rt.destroyed)
	}
	recs, err := st.Sandboxes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if r.ID == "frozen" {
			t.Fatal("frozen's record outlived its kill")
		}
	}
	if err := s.Kill(ctx, p.ID, "frozen"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("second kill: %v", err)
	}
}

// TestRecoverUnresponsiveStops: an unresponsive sandbox that the runtime
// later reports stopped is destroyed by the next probe.
func TestRecoverUnresponsiveStops(t *testing.T) {
	ctx := context.Background()
	st, p := sandboxtest.ProjectStore(t)
	rt := &stateRuntime{state: map[string]runtime.State{"dies": runtime.StateRunning}}
	ag := newFakeAgent(t)
	rec := Record{ID: "dies", ProjectID: p.ID, Template: "base", Status: StatusRunning,
		AgentAddr: strings.TrimPrefix(ag.URL, "http://"), AgentToken: "t", StartedAt: time.Now().UTC(), Rootfs: "/templates/base/rootfs"}
	spec, _ := json.Marshal(rec)
	if err := st.PutSandbox(ctx, store.Sandbox{ID: "dies", ProjectID: p.ID, Template: "base", Status: StatusRunning, Spec: spec, StartedAt: rec.StartedAt}); err != nil {
		t.Fatal(err)
	}
	s := New(Config{Runtime: rt, Store: st, RecoverProbeTimeout: time.Second})
	defer s.Close()
	if err := s.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(20 * time.Second); ; {
		if r, err := s.Get(p.ID, "dies"); err == nil && r.Status == StatusUnresponsive {
			break
		}
		if time.Now().After(end) {
			t.Fatal("not unresponsive within 20 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	rt.set("dies", runtime.StateStopped)
	for end := time.Now().Add(20 * time.Second); !rt.wasDestroyed("dies"); {
		if time.Now().After(end) {
			t.Fatal("a stopped unresponsive sandbox was not destroyed within 20 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := s.Get(p.ID, "dies"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("after its destroy: %v", err)
	}
}
