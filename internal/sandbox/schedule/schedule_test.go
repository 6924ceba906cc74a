package schedule

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/events"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/sandbox/sandboxtest"
	"github.com/lizard-build/lizard/internal/store"
)

func patch(t *testing.T, s string) Patch {
	t.Helper()
	var p Patch
	if err := json.Unmarshal([]byte(s), &p); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestApplyErrors: bad input is ErrInvalid naming the field.
func TestApplyErrors(t *testing.T) {
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct{ body, field string }{
		{`{"command":"x"}`, "every"},
		{`{"every":"5m","cron":"* * * * *","command":"x"}`, "every"},
		{`{"every":"30s","command":"x"}`, "every"},
		{`{"every":59,"command":"x"}`, "every"},
		{`{"every":"soon","command":"x"}`, "every"},
		{`{"every":true,"command":"x"}`, "every"},
		{`{"every":"400d","command":"x"}`, "every"},
		{`{"cron":"* * * *","command":"x"}`, "cron"},
		{`{"cron":"61 * * * *","command":"x"}`, "cron"},
		{`{"cron":"0 0 30 2 *","command":"x"}`, "cron"},
		{`{"cron":5,"command":"x"}`, "cron"},
		{`{"cron":"* * * * *","timezone":"Mars/Olympus","command":"x"}`, "timezone"},
		{`{"cron":"* * * * *","timezone":"Local","command":"x"}`, "timezone"},
		{`{"every":"5m"}`, "command"},
		{`{"every":"5m","command":"x","prompt":"y"}`, "command"},
		{`{"every":"5m","command":"  "}`, "command"},
		{`{"every":"5m","prompt":""}`, "prompt"},
		{`{"every":"5m","command":"x","timeoutSeconds":0}`, "timeoutSeconds"},
		{`{"every":"5m","command":"x","timeoutSeconds":601}`, "timeoutSeconds"},
		{`{"every":"5m","command":"x","timeoutSeconds":1.5}`, "timeoutSeconds"},
		{`{"every":"5m","command":"x","timeoutSeconds":"10"}`, "timeoutSeconds"},
		{`{"every":"5m","prompt":"y","agent":"gemini"}`, "agent"},
		{`{"every":"5m","prompt":"y","reasoningEffort":"max"}`, "reasoningEffort"},
		{`{"every":"5m","command":"x","agent":"claude"}`, "agent"},
		{`{"every":"5m","command":"x","enabled":"yes"}`, "enabled"},
		{`{"every":"5m","command":"x","keepMemory":1}`, "keepMemory"},
		{`{"every":"5m","command":"x","name":7}`, "name"},
	} {
		_, _, err := patch(t, tc.body).Apply(Spec{}, true, now)
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.HasPrefix(err.Error(), tc.field+":") {
			t.Errorf("%s: %v, want ErrInvalid naming %s", tc.body, err, tc.field)
		}
	}
}

func TestApply(t *testing.T) {
	now := time.Date(2026, 5, 1, 12, 0, 0, 500, time.UTC)
	for _, tc := range []struct {
		body  string
		every string
		secs  int64
	}{
		{`{"every":"5m","command":"x"}`, "5m", 300},
		{`{"every":"1h","command":"x"}`, "1h", 3600},
		{`{"every":90,"command":"x"}`, "1m30s", 90},
		{`{"every":"3600","command":"x"}`, "1h", 3600},
		{`{"every":"1h30m","command":"x"}`, "1h30m", 5400},
		{`{"every":"2d","command":"x"}`, "2d", 172800},
	} {
		s, on, err := patch(t, tc.body).Apply(Spec{}, true, now)
		if err != nil || s.Every != tc.every || s.EverySeconds != tc.secs || !on || s.Timezone != "UTC" || s.TimeoutSeconds != 600 {
			t.Errorf("%s: %+v %v", tc.body, s, err)
		}
		if next := s.Next(now); !next.Equal(now.Truncate(time.Second).Add(time.Duration(tc.secs) * time.Second)) {
			t.Errorf("%s: next %s", tc.body, next)
		}
	}
	// An update: cron in place of every; prompt in place of command.
	s, _, _ := patch(t, `{"every":"5m","command":"x","name":"n"}`).Apply(Spec{}, true, now)
	s, on, err := patch(t, `{"cron":"0 9 * * *","timezone":"Europe/Berlin","prompt":"p","model":"m","reasoningEffort":"high","enabled":false}`).Apply(s, true, now)
	if err != nil || on || s.Every != "" || s.EverySeconds != 0 || s.Cron != "0 9 * * *" || s.Command != "" || s.Prompt != "p" || s.Name != "n" || s.Model != "m" {
		t.Fatalf("update: %+v %v %v", s, on, err)
	}
	if next := s.Next(now); !next.Equal(time.Date(2026, 5, 2, 7, 0, 0, 0, time.UTC)) {
		t.Fatalf("09:00 Berlin in May: %s", next)
	}
	// null clears the model.
	if s, _, err = patch(t, `{"model":null}`).Apply(s, true, now); err != nil || s.Model != "" || s.Prompt != "p" {
		t.Fatalf("model: null: %+v %v", s, err)
	}
}

func TestEveryMissed(t *testing.T) {
	anchor := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	s := Spec{EverySeconds: 60, Anchor: anchor}
	if n := s.Missed(anchor.Add(time.Minute), anchor.Add(time.Minute+30*time.Second)); n != 0 {
		t.Fatalf("on time: %d missed", n)
	}
	if n := s.Missed(anchor.Add(time.Minute), anchor.Add(4*time.Minute)); n != 3 {
		t.Fatalf("three minutes late: %d missed, want 3", n)
	}
	if next := s.Next(anchor.Add(4 * time.Minute)); !next.Equal(anchor.Add(5 * time.Minute)) {
		t.Fatalf("next after a due time: %s", next)
	}
	c := Spec{Cron: "*/10 * * * *", Timezone: "UTC"}
	if n := c.Missed(anchor, anchor.Add(time.Hour)); n != 6 {
		t.Fatalf("an hour of a ten-minute cron: %d missed, want 6", n)
	}
}

// Tests over the fake runtime (sandboxtest): no root.

type fixture struct {
	env  *sandboxtest.Env
	core *sandbox.Service
	svc  *Service
	told *told
	stop context.CancelFunc
	done chan struct{}
}

// told keeps what the core and the schedules tell of (the event log's
// part): lifecycle events and ended runs.
type told struct {
	mu     sync.Mutex
	events []sandbox.Event
	runs   []events.ScheduleRun
}

func (t *told) Publish(ev sandbox.Event) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.events = append(t.events, ev)
}

func (t *told) ScheduleRunFinished(r events.ScheduleRun) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.runs = append(t.runs, r)
}

// of returns "type/by" of sandbox id's lifecycle events.
func (t *told) of(id string) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for _, ev := range t.events {
		if ev.SandboxID == id {
			out = append(out, ev.Type+"/"+ev.By)
		}
	}
	return out
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	env := sandboxtest.NewEnv(t)
	tl := &told{}
	core := sandbox.New(sandbox.Config{Runtime: env.Runtime, Store: env.Store, Templates: env.Templates,
		SnapshotDir: env.SnapshotDir, Logger: sandboxtest.Logger(t), Events: tl})
	if err := core.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(core.Close)
	f := &fixture{env: env, core: core, told: tl}
	f.start(t)
	return f
}

// start runs a schedule service (again: a restart).
func (f *fixture) start(t *testing.T) {
	f.svc = New(Config{Core: f.core, Store: f.env.Store, Poll: 20 * time.Millisecond, Logger: sandboxtest.Logger(t), Runs: f.told,
		Limits: func(context.Context, string) (store.Limits, error) {
			return store.Limits{Schedules: 4, SchedulesPerSandbox: 3}, nil
		}})
	ctx, cancel := context.WithCancel(context.Background())
	f.stop, f.done = cancel, make(chan struct{})
	go func() {
		defer close(f.done)
		f.svc.Run(ctx)
	}()
	t.Cleanup(f.halt)
}

func (f *fixture) halt() {
	f.stop()
	<-f.done
}

func (f *fixture) sandbox(t *testing.T) sandbox.Record {
	t.Helper()
	rec, err := f.core.Create(context.Background(), sandbox.CreateRequest{ProjectID: f.env.Project.ID})
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

func (f *fixture) runs(t *testing.T, id string) []RunView {
	t.Helper()
	l, err := f.svc.Runs(context.Background(), f.env.Project.ID, id, 0)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// waitRuns waits until the schedule has n finished runs and returns them,
// newest first.
func (f *fixture) waitRuns(t *testing.T, id string, n int) []RunView {
	t.Helper()
	var l []RunView
	sandboxtest.Eventually(t, "finished runs", func() bool {
		l = f.runs(t, id)
		done := 0
		for _, r := range l {
			if r.Finished {
				done++
			}
		}
		return done >= n
	})
	return l
}

// TestCommandRuns: a run asked for runs within a poll, as root in root's
// home, its output kept; a due time missed while no server ran runs once
// and the others are counted skipped; the next due time stays.
func TestCommandRuns(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	p := f.env.Project.ID
	rec := f.sandbox(t)
	v, err := f.svc.Create(ctx, p, rec.ID, patch(t, `{"every":"1h","command":"echo out; echo err >&2; pwd","name":"n"}`))
	if err != nil {
		t.Fatal(err)
	}
	if v.Kind != "command" || v.Every == nil || *v.Every != "1h" || v.NextRunAt == nil || v.Running || v.Agent != nil || !v.KeepMemory {
		t.Fatalf("created: %+v", v)
	}
	next := *v.NextRunAt
	if _, err := f.svc.RunNow(ctx, p, v.ID); err != nil {
		t.Fatal(err)
	}
	runs := f.waitRuns(t, v.ID, 1)
	r := runs[0]
	if r.Status != store.RunSucceeded || r.ExitCode == nil || *r.ExitCode != 0 || r.Woke || r.Slept || r.Output == nil ||
		!strings.Contains(*r.Output, "out\n") || !strings.Contains(*r.Output, "err\n") {
		t.Fatalf("run: %+v", r)
	}
	got, _ := f.svc.Get(ctx, p, v.ID)
	if !got.NextRunAt.Equal(next) || got.LastStatus == nil || *got.LastStatus != store.RunSucceeded || got.Running {
		t.Fatalf("after a run asked for: %+v, want next still %s", got, next)
	}
	// Three due times passed while no server ran them.
	sc, _ := f.env.Store.Schedule(ctx, v.ID)
	past := time.Now().UTC().Add(-3*time.Hour + time.Minute).Truncate(time.Second)
	sc.NextRunAt = &past
	if err := f.env.Store.SetSchedule(ctx, sc); err != nil {
		t.Fatal(err)
	}
	f.waitRuns(t, v.ID, 2)
	got, _ = f.svc.Get(ctx, p, v.ID)
	if got.SkippedCount != 2 || !got.NextRunAt.Equal(next) {
		t.Fatalf("after three missed due times: %+v, want 2 skipped, next at %s", got, next)
	}
	time.Sleep(100 * time.Millisecond)
	if l := f.runs(t, v.ID); len(l) != 2 {
		t.Fatalf("%d runs, want 2: one for the missed due times", len(l))
	}
}

// TestWakeAndSleep: a run of a paused sandbox resumes it and pauses it
// after; a running one is left running.
func TestWakeAndSleep(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	p := f.env.Project.ID
	rec := f.sandbox(t)
	if err := f.core.Pause(ctx, p, rec.ID); err != nil {
		t.Fatal(err)
	}
	v, err := f.svc.Create(ctx, p, rec.ID, patch(t, `{"every":"1h","command":"echo awake"}`))
	if err != nil {
		t.Fatal(err)
	}
	f.svc.RunNow(ctx, p, v.ID)
	r := f.waitRuns(t, v.ID, 1)[0]
	if r.Status != store.RunSucceeded || !r.Woke || !r.Slept {
		t.Fatalf("run of a paused sandbox: %+v, want woke and slept", r)
	}
	if got, _ := f.core.Get(p, rec.ID); got.Status != sandbox.StatusPaused {
		t.Fatalf("after the run: %s, want paused", got.Status)
	}
	// The wake and the sleep are the schedule's; the ended run is told of.
	if got, want := f.told.of(rec.ID), []string{"sandbox.created/api", "sandbox.paused/api", "sandbox.resumed/schedule", "sandbox.paused/schedule"}; !slices.Equal(got, want) {
		t.Fatalf("events: %q, want %q", got, want)
	}
	f.told.mu.Lock()
	runs := slices.Clone(f.told.runs)
	f.told.mu.Unlock()
	if len(runs) != 1 || runs[0].RunID != r.ID || runs[0].Status != store.RunSucceeded || !runs[0].Woke || !runs[0].Slept ||
		runs[0].ExitCode == nil || *runs[0].ExitCode != 0 || runs[0].EndedAt.IsZero() || runs[0].ScheduleID != v.ID {
		t.Fatalf("run events: %+v", runs)
	}
	if _, err := f.core.Resume(ctx, p, rec.ID); err != nil {
		t.Fatal(err)
	}
	f.svc.RunNow(ctx, p, v.ID)
	r = f.waitRuns(t, v.ID, 2)[0]
	if r.Woke || r.Slept {
		t.Fatalf("run of a running sandbox: %+v", r)
	}
	if got, _ := f.core.Get(p, rec.ID); got.Status != sandbox.StatusRunning {
		t.Fatalf("after the run: %s, want running", got.Status)
	}
}

// TestFailuresOverlapsAndQuota: failed runs count and switch the schedule
// off after DisableAfter; runSchedule switches it on; a due time while a
// run goes on is skipped; the quotas refuse with their limit.
func TestFailuresOverlapsAndQuota(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	p := f.env.Project.ID
	rec := f.sandbox(t)
	v, err := f.svc.Create(ctx, p, rec.ID, patch(t, `{"every":"1h","command":"exit 3"}`))
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= DisableAfter; i++ {
		f.svc.RunNow(ctx, p, v.ID)
		f.waitRuns(t, v.ID, i)
	}
	got, _ := f.svc.Get(ctx, p, v.ID)
	if got.Enabled || got.DisabledReason == nil || !strings.Contains(*got.DisabledReason, "5 failed runs") || got.ConsecutiveFailures != DisableAfter || got.NextRunAt != nil {
		t.Fatalf("after %d failures: %+v", DisableAfter, got)
	}
	if r := f.runs(t, v.ID)[0]; r.Status != store.RunFailed || r.ExitCode == nil || *r.ExitCode != 3 || r.Error == nil {
		t.Fatalf("failed run: %+v", r)
	}
	if got, err = f.svc.RunNow(ctx, p, v.ID); err != nil || !got.Enabled || got.DisabledReason != nil || got.ConsecutiveFailures != 0 || got.NextRunAt == nil {
		t.Fatalf("runSchedule of a switched-off schedule: %+v %v", got, err)
	}
	f.waitRuns(t, v.ID, DisableAfter+1)

	// Overlap: a run asked for while the last one still runs.
	slow, err := f.svc.Create(ctx, p, rec.ID, patch(t, `{"every":"1h","command":"sleep 1","timeoutSeconds":30}`))
	if err != nil {
		t.Fatal(err)
	}
	f.svc.RunNow(ctx, p, slow.ID)
	sandboxtest.Eventually(t, "the slow run", func() bool { g, _ := f.svc.Get(ctx, p, slow.ID); return g.Running })
	f.svc.RunNow(ctx, p, slow.ID)
	sandboxtest.Eventually(t, "the overlap counted", func() bool { g, _ := f.svc.Get(ctx, p, slow.ID); return g.SkippedCount == 1 })
	f.waitRuns(t, slow.ID, 1)
	if l := f.runs(t, slow.ID); len(l) != 1 {
		t.Fatalf("%d runs of the slow schedule, want 1", len(l))
	}

	// Timeout.
	to, err := f.svc.Create(ctx, p, rec.ID, patch(t, `{"every":"1h","command":"sleep 30","timeoutSeconds":1}`))
	if err != nil {
		t.Fatal(err)
	}
	f.svc.RunNow(ctx, p, to.ID)
	if r := f.waitRuns(t, to.ID, 1)[0]; r.Status != store.RunTimeout {
		t.Fatalf("run past its timeout: %+v", r)
	}

	// Quota: 3 per sandbox.
	_, err = f.svc.Create(ctx, p, rec.ID, patch(t, `{"every":"1h","command":"true"}`))
	var ex *errdefs.Exceeded
	if !errors.Is(err, errdefs.ErrQuota) || !errors.As(err, &ex) || ex.Limit != 3 {
		t.Fatalf("fourth schedule of a sandbox: %v, want the quota of 3", err)
	}
	// A prompt without an agent in the template, or with one the
	// sandbox lacks.
	if _, err := f.svc.Create(ctx, p, rec.ID, patch(t, `{"every":"1h","prompt":"hi"}`)); !errors.Is(err, errdefs.ErrInvalid) || !strings.HasPrefix(err.Error(), "agent:") {
		t.Fatalf("prompt in a base sandbox: %v, want a 400 naming agent", err)
	}
	rec2 := f.sandbox(t)
	if _, err := f.svc.Create(ctx, p, rec2.ID, patch(t, `{"every":"1h","prompt":"hi","agent":"codex"}`)); !errors.Is(err, errdefs.ErrInvalid) ||
		!strings.Contains(err.Error(), `"codex" is not installed`) {
		t.Fatalf("prompt for codex in a sandbox without it: %v", err)
	}
	// Another project's schedule is not found; a kill takes the
	// sandbox's schedules.
	if _, err := f.svc.Get(ctx, "prj_other", v.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another project's schedule: %v", err)
	}
	if err := f.core.Kill(ctx, p, rec.ID); err != nil {
		t.Fatal(err)
	}
	if l, err := f.svc.List(ctx, p, ""); err != nil || len(l) != 0 {
		t.Fatalf("schedules after the kill: %+v %v", l, err)
	}
	if _, err := f.svc.Create(ctx, p, rec.ID, patch(t, `{"every":"1h","command":"true"}`)); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("schedule of a killed sandbox: %v", err)
	}
}

// TestInterrupted: a run under way when the server stopped is recorded
// interrupted at the next start, and the sandbox it woke goes back to
// sleep.
func TestInterrupted(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	p := f.env.Project.ID
	rec := f.sandbox(t)
	v, err := f.svc.Create(ctx, p, rec.ID, patch(t, `{"every":"1h","command":"true"}`))
	if err != nil {
		t.Fatal(err)
	}
	f.halt()
	// What a server killed during a run it woke the sandbox for leaves.
	now := time.Now().UTC().Truncate(time.Second)
	sc, _ := f.env.Store.Schedule(ctx, v.ID)
	c := store.RunClaim{Due: *sc.NextRunAt, Next: sc.NextRunAt.Add(time.Hour), Run: store.ScheduleRun{ID: "run_cut", ScheduleID: v.ID,
		SandboxID: rec.ID, ProjectID: p, Status: store.RunRunning, StartedAt: now, Woke: true}}
	if res, err := f.env.Store.ClaimRun(ctx, c); err != nil || res != store.Claimed {
		t.Fatalf("claim: %v %v", res, err)
	}
	f.start(t)
	r := f.waitRuns(t, v.ID, 1)[0]
	if r.ID != "run_cut" || r.Status != store.RunInterrupted || !r.Woke {
		t.Fatalf("the cut run: %+v", r)
	}
	sandboxtest.Eventually(t, "the sandbox back asleep", func() bool {
		got, _ := f.core.Get(p, rec.ID)
		return got.Status == sandbox.StatusPaused
	})
	sandboxtest.Eventually(t, "slept recorded", func() bool { return f.runs(t, v.ID)[0].Slept })
	if got, _ := f.svc.Get(ctx, p, v.ID); got.LastStatus == nil || *got.LastStatus != store.RunInterrupted || got.Running {
		t.Fatalf("schedule after the interruption: %+v", got)
	}
}
