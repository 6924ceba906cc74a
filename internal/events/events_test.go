package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/sandbox/sandboxtest"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/store/dbtest"
	"github.com/lizard-build/lizard/internal/store/sqlite"
)

// Tests over the fake runtime (sandboxtest) and the SQLite store: no root.

func newLog(t *testing.T, st Store, edit func(*Config)) *Log {
	t.Helper()
	cfg := Config{Store: st, Logger: sandboxtest.Logger(t), PollInterval: 20 * time.Millisecond}
	if edit != nil {
		edit(&cfg)
	}
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	return l
}

// follower is a stream of the log read by a test.
type follower struct {
	mu   sync.Mutex
	evs  []Event
	err  error
	done chan struct{}
}

// follow starts a stream of q; it ends with the test.
func follow(t *testing.T, l *Log, q Query) *follower {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	f := &follower{done: make(chan struct{})}
	started := make(chan struct{})
	go func() {
		defer close(f.done)
		once := sync.OnceFunc(func() { close(started) })
		err := l.Follow(ctx, q, Stream{
			Opened: func() error { once(); return nil },
			Send: func(ev store.Event) error {
				var e Event
				if err := json.Unmarshal(ev.Data, &e); err != nil {
					return err
				}
				f.mu.Lock()
				f.evs = append(f.evs, e)
				f.mu.Unlock()
				return nil
			},
			Keepalive: func() error { return nil },
		})
		f.mu.Lock()
		f.err = err
		f.mu.Unlock()
		once()
	}()
	t.Cleanup(func() { cancel(); <-f.done })
	<-started // its starting point is known (or it failed)
	return f
}

// got is what the stream has read, as "type/by" of sandbox id (every
// sandbox when ""), or its error.
func (f *follower) got(id string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, e := range f.evs {
		if id == "" || e.SandboxID == id {
			out = append(out, e.Type+"/"+e.By)
		}
	}
	return out
}

func (f *follower) events() []Event {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.evs)
}

func (f *follower) wait(t *testing.T, id string, want []string) {
	t.Helper()
	sandboxtest.Eventually(t, fmt.Sprintf("events %q", want), func() bool { return len(f.got(id)) >= len(want) })
	if got := f.got(id); !slices.Equal(got, want) {
		t.Fatalf("stream: %q, want %q", got, want)
	}
}

func newCore(t *testing.T, env *sandboxtest.Env, sink sandbox.EventSink) *sandbox.Service {
	t.Helper()
	core := sandbox.New(sandbox.Config{Runtime: env.Runtime, Store: env.Store, Templates: env.Templates,
		SnapshotDir: env.SnapshotDir, Logger: sandboxtest.Logger(t), Events: sink})
	if err := core.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(core.Close)
	return core
}

// TestStream: a sandbox's life, told by the core, reaches the stream in
// order with its causes; filters by sandbox and type; another project's
// stream sees nothing of it; a stream resumes after its Last-Event-ID.
func TestStream(t *testing.T) {
	env := sandboxtest.NewEnv(t)
	l := newLog(t, env.Store, func(c *Config) { c.Node = "n1" })
	core := newCore(t, env, l)
	ctx := context.Background()
	other, err := env.Store.CreateProject(ctx, "other", "")
	if err != nil {
		t.Fatal(err)
	}
	all := follow(t, l, Query{ProjectID: env.Project.ID})
	paused := follow(t, l, Query{ProjectID: env.Project.ID, Types: []string{sandbox.EventPaused, sandbox.EventResumed}})
	foreign := follow(t, l, Query{ProjectID: other.ID})

	a, err := core.Create(ctx, sandbox.CreateRequest{ProjectID: env.Project.ID})
	if err != nil {
		t.Fatal(err)
	}
	// A stream starts at the log's end: the create is written first.
	all.wait(t, "", []string{"sandbox.created/api"})
	only := follow(t, l, Query{ProjectID: env.Project.ID, SandboxID: a.ID})
	b, err := core.Create(ctx, sandbox.CreateRequest{ProjectID: env.Project.ID})
	if err != nil {
		t.Fatal(err)
	}
	if err := core.Pause(ctx, env.Project.ID, a.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := core.Resume(sandbox.WithCause(ctx, sandbox.CauseTraffic), env.Project.ID, a.ID); err != nil {
		t.Fatal(err)
	}
	if err := core.Kill(ctx, env.Project.ID, a.ID); err != nil {
		t.Fatal(err)
	}
	if err := core.Kill(ctx, env.Project.ID, b.ID); err != nil {
		t.Fatal(err)
	}
	all.wait(t, "", []string{"sandbox.created/api", "sandbox.created/api", "sandbox.paused/api", "sandbox.resumed/traffic",
		"sandbox.killed/api", "sandbox.killed/api"})
	if got := all.got(a.ID); !slices.Equal(got, []string{"sandbox.created/api", "sandbox.paused/api", "sandbox.resumed/traffic", "sandbox.killed/api"}) {
		t.Fatalf("sandbox a in the whole stream: %q", got)
	}
	paused.wait(t, "", []string{"sandbox.paused/api", "sandbox.resumed/traffic"})
	only.wait(t, "", []string{"sandbox.paused/api", "sandbox.resumed/traffic", "sandbox.killed/api"})
	evs := all.events()
	for _, e := range evs {
		if e.ProjectID != env.Project.ID || e.Node != "n1" || e.At.IsZero() || len(e.ID) < 10 {
			t.Fatalf("an event: %+v", e)
		}
	}
	if len(foreign.events()) != 0 {
		t.Fatalf("another project's stream got %+v", foreign.events())
	}

	// Resume after the second event: the rest, in order.
	resumed := follow(t, l, Query{ProjectID: env.Project.ID, LastEventID: evs[1].ID})
	resumed.wait(t, "", []string{"sandbox.paused/api", "sandbox.resumed/traffic", "sandbox.killed/api", "sandbox.killed/api"})
	if got := resumed.events(); got[0].ID != evs[2].ID || got[3].ID != evs[5].ID {
		t.Fatalf("resumed stream: %+v, want from %s", got, evs[2].ID)
	}
	// A resumed stream with a filter.
	killed := follow(t, l, Query{ProjectID: env.Project.ID, LastEventID: evs[0].ID, SandboxID: b.ID, Types: []string{sandbox.EventKilled}})
	killed.wait(t, "", []string{"sandbox.killed/api"})
	// Since an instant before the first event: all of them.
	since := follow(t, l, Query{ProjectID: env.Project.ID, Since: evs[0].At.Add(-time.Millisecond)})
	since.wait(t, "", all.got(""))

	// An id the log does not hold, or another project's, is refused.
	for _, q := range []Query{{ProjectID: env.Project.ID, LastEventID: "evt_nope"}, {ProjectID: other.ID, LastEventID: evs[0].ID}} {
		opened := false
		err := l.Follow(ctx, q, Stream{Opened: func() error { opened = true; return nil }})
		if !errors.Is(err, errdefs.ErrInvalid) || errdefs.Code(err) != "event_not_found" || opened {
			t.Fatalf("Follow after %s in %s: %v, want ErrInvalid event_not_found", q.LastEventID, q.ProjectID, err)
		}
	}
}

// TestRestart: events written by one log are read by the next one over
// the same database (a server restarted), and a stream resumes across.
func TestRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lizard.db")
	st, err := sqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	l, err := New(Config{Store: st, Logger: sandboxtest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		l.Publish(sandbox.Event{Type: sandbox.EventCreated, ProjectID: "prj_r", SandboxID: fmt.Sprintf("sb%d", i)})
	}
	l.Close() // writes what waits
	st.Close()

	st2, err := sqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st2.Close() })
	l2 := newLog(t, st2, nil)
	first := follow(t, l2, Query{ProjectID: "prj_r", Since: time.Now().Add(-time.Hour)})
	sandboxtest.Eventually(t, "the events of before the restart", func() bool { return len(first.events()) == 5 })
	evs := first.events()
	for i, e := range evs {
		if e.SandboxID != fmt.Sprintf("sb%d", i) {
			t.Fatalf("event %d after the restart: %+v", i, e)
		}
	}
	resumed := follow(t, l2, Query{ProjectID: "prj_r", LastEventID: evs[2].ID})
	l2.Publish(sandbox.Event{Type: sandbox.EventKilled, ProjectID: "prj_r", SandboxID: "sb0"})
	resumed.wait(t, "", []string{"sandbox.created/", "sandbox.created/", "sandbox.killed/"})
}

// TestRetention: pruning removes what is past the retention, by the log's
// clock, and nothing younger; a retention under an hour is refused.
func TestRetention(t *testing.T) {
	st, _ := sandboxtest.ProjectStore(t)
	var now atomic.Pointer[time.Time]
	start := time.Now()
	now.Store(&start)
	l := newLog(t, st, func(c *Config) {
		c.Retention = 2 * time.Hour
		c.Now = func() time.Time { return *now.Load() }
	})
	f := follow(t, l, Query{ProjectID: "prj_t"})
	l.Publish(sandbox.Event{Type: sandbox.EventCreated, ProjectID: "prj_t", SandboxID: "old", At: start.Add(-90 * time.Minute)})
	l.Publish(sandbox.Event{Type: sandbox.EventCreated, ProjectID: "prj_t", SandboxID: "new", At: start})
	f.wait(t, "", []string{"sandbox.created/", "sandbox.created/"})
	ctx := context.Background()
	count := func() int {
		evs, err := st.Events(ctx, store.EventQuery{ProjectID: "prj_t"})
		if err != nil {
			t.Fatal(err)
		}
		return len(evs)
	}
	if n, err := l.Prune(ctx); err != nil || n != 0 || count() != 2 {
		t.Fatalf("prune within the retention: %d %v, %d left", n, err, count())
	}
	later := start.Add(time.Hour)
	now.Store(&later)
	if n, err := l.Prune(ctx); err != nil || n != 1 || count() != 1 {
		t.Fatalf("prune an hour later (the old one is 2.5 h old): %d %v, %d left, want 1 pruned", n, err, count())
	}
	much := start.Add(3 * time.Hour)
	now.Store(&much)
	if n, err := l.Prune(ctx); err != nil || n != 1 || count() != 0 {
		t.Fatalf("prune 3 h later: %d %v, %d left", n, err, count())
	}
	if _, err := New(Config{Store: st, Retention: 59 * time.Minute}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("a retention under an hour: %v, want ErrInvalid", err)
	}
}

// outage is a store that refuses appends while down.
type outage struct {
	Store
	down    atomic.Bool
	refused atomic.Int64
}

func (o *outage) AppendEvents(ctx context.Context, evs []store.Event) error {
	if o.down.Load() {
		o.refused.Add(1)
		return errors.New("database down")
	}
	return o.Store.AppendEvents(ctx, evs)
}

// TestBufferFull: while the store refuses writes, publishing never waits;
// what the buffer cannot hold is dropped and counted, and once the store
// is back every buffered event is written, then an events.dropped event
// with the count.
func TestBufferFull(t *testing.T) {
	st, _ := sandboxtest.ProjectStore(t)
	o := &outage{Store: st}
	o.down.Store(true)
	const buffer = 10
	l := newLog(t, o, func(c *Config) { c.Buffer = buffer })
	f := follow(t, l, Query{ProjectID: "prj_b"})
	l.Publish(sandbox.Event{Type: sandbox.EventCreated, ProjectID: "prj_b", SandboxID: "first"})
	// The writer holds the first event and retries it.
	sandboxtest.Eventually(t, "the writer's first refused append", func() bool { return o.refused.Load() > 0 })
	const more = 30
	for i := range more {
		l.Publish(sandbox.Event{Type: sandbox.EventCreated, ProjectID: "prj_b", SandboxID: fmt.Sprintf("sb%d", i)})
	}
	o.down.Store(false)
	want := append(slices.Repeat([]string{"sandbox.created/"}, 1+buffer), TypeDropped+"/")
	f.wait(t, "", want)
	evs := f.events()
	if d := evs[len(evs)-1]; d.Dropped != more-buffer || d.ProjectID != "prj_b" || d.Detail == "" {
		t.Fatalf("the events.dropped event: %+v, want %d dropped", d, more-buffer)
	}
	if evs[0].SandboxID != "first" || evs[1].SandboxID != "sb0" || evs[buffer].SandboxID != fmt.Sprintf("sb%d", buffer-1) {
		t.Fatalf("the events kept: %+v", evs)
	}
}

// TestScheduleRunFinished: a schedule's run reaches the stream with its
// run.
func TestScheduleRunFinished(t *testing.T) {
	st, _ := sandboxtest.ProjectStore(t)
	l := newLog(t, st, nil)
	f := follow(t, l, Query{ProjectID: "prj_s", Types: []string{TypeScheduleRunFinished}})
	start := time.Now().Add(-3 * time.Second).UTC()
	code := 0
	var runs ScheduleRuns = l
	l.Publish(sandbox.Event{Type: sandbox.EventResumed, ProjectID: "prj_s", SandboxID: "sb1", By: sandbox.CauseSchedule})
	runs.ScheduleRunFinished(ScheduleRun{ProjectID: "prj_s", SandboxID: "sb1", ScheduleID: "sch_1", RunID: "run_1", Status: "succeeded",
		Woke: true, Slept: true, StartedAt: start, EndedAt: start.Add(2 * time.Second), ExitCode: &code})
	f.wait(t, "", []string{"schedule.run_finished/schedule"})
	e := f.events()[0]
	r := e.Run
	if r == nil || r.ID != "run_1" || r.ScheduleID != "sch_1" || r.SandboxID != "sb1" || r.Status != "succeeded" || !r.Woke || !r.Slept ||
		r.DurationMs != 2000 || r.ExitCode == nil || *r.ExitCode != 0 || !r.StartedAt.Equal(start) || e.SandboxID != "sb1" || e.Detail != "succeeded" {
		t.Fatalf("the run's event: %+v run %+v", e, r)
	}
}

// TestNodes: in a cluster, each node's log writes to the one database and
// a stream on any node shows every node's events, in the log's order, on
// both backends.
func TestNodes(t *testing.T) {
	dbtest.Each(t, func(t *testing.T, open func() dbtest.Database) {
		nodes(t, func() Store { return open() })
	})
}

func nodes(t *testing.T, open func() Store) {
	a := newLog(t, open(), func(c *Config) { c.Node = "a" })
	b := newLog(t, open(), func(c *Config) { c.Node = "b" })
	onA := follow(t, a, Query{ProjectID: "prj_n"})
	onB := follow(t, b, Query{ProjectID: "prj_n"})
	for i := range 6 {
		l := a
		if i%2 == 1 {
			l = b
		}
		l.Publish(sandbox.Event{Type: sandbox.EventCreated, ProjectID: "prj_n", SandboxID: fmt.Sprintf("sb%d", i)})
		// One at a time, so that the log's order is the test's.
		sandboxtest.Eventually(t, "the event in the log", func() bool { return len(onA.events()) == i+1 })
	}
	sandboxtest.Eventually(t, "node b's stream", func() bool { return len(onB.events()) == 6 })
	for _, f := range []*follower{onA, onB} {
		for i, e := range f.events() {
			wantNode := "a"
			if i%2 == 1 {
				wantNode = "b"
			}
			if e.SandboxID != fmt.Sprintf("sb%d", i) || e.Node != wantNode {
				t.Fatalf("event %d: %+v", i, e)
			}
		}
	}
}

func TestCheckTypes(t *testing.T) {
	if err := CheckTypes("type", []string{"sandbox.paused", TypeScheduleRunFinished}); err != nil {
		t.Fatal(err)
	}
	err := CheckTypes("events", []string{"sandbox.paused", "sandbox.exploded"})
	if !errors.Is(err, errdefs.ErrInvalid) || !containsAll(err.Error(), "events[1]", "sandbox.exploded", "sandbox.created") {
		t.Fatalf("an unknown type: %v", err)
	}
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// TestEndStreams: a server shutting down ends its streams (its HTTP server
// waits for them) while its log still writes.
func TestEndStreams(t *testing.T) {
	st, _ := sandboxtest.ProjectStore(t)
	l := newLog(t, st, nil)
	f := follow(t, l, Query{ProjectID: "prj_e"})
	l.EndStreams()
	select {
	case <-f.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the stream did not end")
	}
	if f.err != nil {
		t.Fatalf("an ended stream: %v", f.err)
	}
	l.Publish(sandbox.Event{Type: sandbox.EventCreated, ProjectID: "prj_e", SandboxID: "sb1"})
	sandboxtest.Eventually(t, "the event written after the streams ended", func() bool {
		evs, err := st.Events(context.Background(), store.EventQuery{ProjectID: "prj_e"})
		return err == nil && len(evs) == 1
	})
}
