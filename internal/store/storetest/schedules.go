package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
)

// scheduleOf is a schedule of sandbox sb due at next.
func scheduleOf(sb store.Sandbox, id string, next time.Time) store.Schedule {
	return store.Schedule{ID: id, ProjectID: sb.ProjectID, SandboxID: sb.ID, Spec: json.RawMessage(`{"every":"1m"}`),
		Enabled: true, NextRunAt: &next, CreatedAt: ts(0)}
}

// claimOf is the claim of sc's due time due, moving it to next.
func claimOf(sc store.Schedule, runID string, due, next time.Time) store.RunClaim {
	return store.RunClaim{Due: due, Next: next, Run: store.ScheduleRun{ID: runID, ScheduleID: sc.ID, SandboxID: sc.SandboxID,
		ProjectID: sc.ProjectID, Status: store.RunRunning, StartedAt: due}}
}

// testSchedules: records, quotas, due lists, claims (once per due time,
// overlaps counted, requested runs), run ends and their counters, the
// self-disable, interrupted runs, and a killed sandbox taking its
// schedules with it.
func testSchedules(t *testing.T, ctx context.Context, open func() store.Store) {
	st0 := open()
	st, ok := st0.(store.Schedules)
	if !ok {
		t.Fatalf("%T does not implement store.Schedules", st0)
	}
	other := open().(store.Schedules)
	p, err := st0.CreateProject(ctx, "sched", "")
	if err != nil {
		t.Fatal(err)
	}
	sb := store.Sandbox{ID: "sb-s1", ProjectID: p.ID, Template: "base", Size: "small", Status: "running", Spec: json.RawMessage(`{}`), StartedAt: ts(0)}
	sb2 := sb
	sb2.ID = "sb-s2"
	for _, s := range []store.Sandbox{sb, sb2} {
		if err := st0.PutSandbox(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	a := scheduleOf(sb, "sch_a", ts(10))
	if err := st.InsertSchedule(ctx, a, 2, 3); err != nil {
		t.Fatal(err)
	}
	if err := st.InsertSchedule(ctx, scheduleOf(store.Sandbox{ID: "sb-none", ProjectID: p.ID}, "sch_x", ts(10)), 0, 0); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("schedule of a sandbox without a row: %v, want ErrNotFound", err)
	}
	if err := st.InsertSchedule(ctx, scheduleOf(store.Sandbox{ID: sb.ID, ProjectID: "prj_other"}, "sch_x", ts(10)), 0, 0); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("schedule of another project's sandbox: %v, want ErrNotFound", err)
	}
	if err := st.InsertSchedule(ctx, scheduleOf(sb, "sch_b", ts(20)), 2, 3); err != nil {
		t.Fatal(err)
	}
	var ex *errdefs.Exceeded
	if err := st.InsertSchedule(ctx, scheduleOf(sb, "sch_c", ts(20)), 2, 3); !errors.Is(err, errdefs.ErrQuota) || !errors.As(err, &ex) || ex.Unit != string(store.LimitSchedulesPerSandbox) {
		t.Fatalf("third schedule of a sandbox with a limit of 2: %v, want the per-sandbox quota", err)
	}
	if err := st.InsertSchedule(ctx, scheduleOf(sb2, "sch_c", ts(30)), 2, 3); err != nil {
		t.Fatal(err)
	}
	if err := st.InsertSchedule(ctx, scheduleOf(sb2, "sch_d", ts(30)), 2, 3); !errors.Is(err, errdefs.ErrQuota) || !errors.As(err, &ex) || ex.Unit != string(store.LimitSchedules) {
		t.Fatalf("fourth schedule of a project with a limit of 3: %v, want the project quota", err)
	}
	got, err := other.Schedule(ctx, "sch_a")
	if err != nil || got.SandboxID != sb.ID || !got.Enabled || got.NextRunAt == nil || !got.NextRunAt.Equal(ts(10)) || string(got.Spec) != `{"every": "1m"}` && string(got.Spec) != `{"every":"1m"}` {
		t.Fatalf("Schedule through another handle: %+v %v", got, err)
	}
	if _, err := st.Schedule(ctx, "sch_none"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("unknown schedule: %v, want ErrNotFound", err)
	}
	if l, err := st.Schedules(ctx, p.ID, sb.ID); err != nil || len(l) != 2 || l[0].ID != "sch_a" || l[1].ID != "sch_b" {
		t.Fatalf("Schedules of %s: %+v %v", sb.ID, l, err)
	}
	if l, err := st.Schedules(ctx, p.ID, ""); err != nil || len(l) != 3 {
		t.Fatalf("Schedules of the project: %+v %v", l, err)
	}
	if l, err := st.Schedules(ctx, "prj_other", ""); err != nil || l == nil || len(l) != 0 {
		t.Fatalf("Schedules of another project: %+v %v, want []", l, err)
	}

	// Due lists: by next_run_at, across sub-second times.
	due := func(now time.Time) []string {
		t.Helper()
		l, err := other.DueSchedules(ctx, now)
		if err != nil {
			t.Fatal(err)
		}
		ids := []string{}
		for _, sc := range l {
			ids = append(ids, sc.ID)
		}
		return ids
	}
	if ids := due(ts(9)); len(ids) != 0 {
		t.Fatalf("due before any: %v", ids)
	}
	if ids := due(ts(10)); len(ids) != 1 || ids[0] != "sch_a" {
		t.Fatalf("due at 10 s: %v, want sch_a", ids)
	}
	if ids := due(ts(20).Add(-500 * time.Millisecond)); len(ids) != 1 {
		t.Fatalf("due half a second before 20 s: %v, want sch_a only", ids)
	}

	// Eight claims of one due time at once through two handles: one wins.
	var wg sync.WaitGroup
	results := make([]store.ClaimResult, 8)
	errs := make([]error, 8)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := st
			if i%2 == 1 {
				h = other
			}
			results[i], errs[i] = h.ClaimRun(ctx, claimOf(a, fmt.Sprintf("run_%d", i), ts(10), ts(70)))
		}()
	}
	wg.Wait()
	won := ""
	for i, r := range results {
		if errs[i] != nil {
			t.Fatalf("claim %d: %v", i, errs[i])
		}
		if r == store.Claimed {
			if won != "" {
				t.Fatalf("due time claimed twice: %s and run_%d", won, i)
			}
			won = fmt.Sprintf("run_%d", i)
		} else if r != store.ClaimLost {
			t.Fatalf("claim %d: result %v, want lost", i, r)
		}
	}
	if won == "" {
		t.Fatal("no claim won")
	}
	got, _ = st.Schedule(ctx, "sch_a")
	if !got.Running || !got.NextRunAt.Equal(ts(70)) || got.SkippedCount != 0 {
		t.Fatalf("after the claim: %+v, want running, next at 70 s", got)
	}
	// The next due time while the run goes on: skipped and counted.
	if r, err := st.ClaimRun(ctx, claimOf(a, "run_o", ts(70), ts(130))); err != nil || r != store.ClaimOverlapped {
		t.Fatalf("claim while running: %v %v, want overlapped", r, err)
	}
	got, _ = st.Schedule(ctx, "sch_a")
	if !got.NextRunAt.Equal(ts(130)) || got.SkippedCount != 1 {
		t.Fatalf("after an overlap: %+v, want next at 130 s, one skipped", got)
	}
	if runs, _ := st.Runs(ctx, "sch_a", 10); len(runs) != 1 || runs[0].ID != won || runs[0].Status != store.RunRunning || !runs[0].Due.Equal(ts(10)) {
		t.Fatalf("runs: %+v, want only %s, running", runs, won)
	}

	// The run ends as a failure: counted; two failures in a row with
	// DisableAfter 2 switch the schedule off.
	end := func(runID string, status string, failed bool) {
		t.Helper()
		r := store.ScheduleRun{ID: runID, ScheduleID: "sch_a", SandboxID: sb.ID, ProjectID: p.ID, Status: status, StartedAt: ts(10), Output: "out"}
		e := ts(12)
		code, d := 3, int64(2000)
		r.EndedAt, r.ExitCode, r.DurationMs, r.Woke, r.Slept = &e, &code, &d, true, true
		if err := other.UpdateRun(ctx, nil, r, &store.RunEnd{Failed: failed, DisableAfter: 2, DisabledReason: "failed twice"}); err != nil {
			t.Fatal(err)
		}
	}
	end(won, store.RunFailed, true)
	got, _ = st.Schedule(ctx, "sch_a")
	if got.Running || got.ConsecutiveFailures != 1 || got.LastStatus != store.RunFailed || got.LastRunAt == nil || !got.Enabled {
		t.Fatalf("after a failure: %+v", got)
	}
	runs, err := st.Runs(ctx, "sch_a", 10)
	if err != nil || len(runs) != 1 || runs[0].Status != store.RunFailed || runs[0].ExitCode == nil || *runs[0].ExitCode != 3 ||
		runs[0].Output != "out" || !runs[0].Woke || !runs[0].Slept || runs[0].EndedAt == nil || runs[0].DurationMs == nil || *runs[0].DurationMs != 2000 {
		t.Fatalf("the ended run: %+v %v", runs, err)
	}
	if r, err := st.ClaimRun(ctx, claimOf(a, "run_second", ts(130), ts(190))); err != nil || r != store.Claimed {
		t.Fatalf("claim after the run ended: %v %v", r, err)
	}
	end("run_second", store.RunTimeout, true)
	got, _ = st.Schedule(ctx, "sch_a")
	if got.Enabled || got.DisabledReason != "failed twice" || got.NextRunAt != nil || got.ConsecutiveFailures != 2 {
		t.Fatalf("after two failures in a row: %+v, want it off", got)
	}
	if ids := due(ts(1000)); len(ids) != 2 {
		t.Fatalf("due after sch_a switched off: %v, want sch_b and sch_c", ids)
	}
	// A run asked for switches it back on and is due at once.
	if err := st.RequestRun(ctx, "sch_a", ts(200)); err != nil {
		t.Fatal(err)
	}
	if err := st.RequestRun(ctx, "sch_none", ts(200)); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("RequestRun of nothing: %v", err)
	}
	got, _ = st.Schedule(ctx, "sch_a")
	if !got.Enabled || got.DisabledReason != "" || got.ConsecutiveFailures != 0 || got.RunRequested == nil {
		t.Fatalf("after RequestRun: %+v", got)
	}
	if ids := due(ts(0)); len(ids) != 1 || ids[0] != "sch_a" {
		t.Fatalf("due with a run asked for: %v, want sch_a", ids)
	}
	req := claimOf(a, "run_asked", ts(200), time.Time{})
	req.Requested = true
	if r, err := other.ClaimRun(ctx, req); err != nil || r != store.Claimed {
		t.Fatalf("claim of the requested run: %v %v", r, err)
	}
	req.Run.ID = "run_asked2"
	if r, err := st.ClaimRun(ctx, req); err != nil || r != store.ClaimLost {
		t.Fatalf("second claim of the requested run: %v %v, want lost", r, err)
	}
	// SetSchedule replaces its settings and keeps its counters.
	got, _ = st.Schedule(ctx, "sch_a")
	next := ts(300)
	got.Spec, got.NextRunAt = json.RawMessage(`{"every":"2m"}`), &next
	if err := st.SetSchedule(ctx, got); err != nil {
		t.Fatal(err)
	}
	if err := st.SetSchedule(ctx, store.Schedule{ID: "sch_none", Spec: json.RawMessage(`{}`)}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("SetSchedule of nothing: %v", err)
	}
	if got2, _ := other.Schedule(ctx, "sch_a"); !got2.NextRunAt.Equal(next) || got2.SkippedCount != 1 || !got2.Running {
		t.Fatalf("after SetSchedule: %+v", got2)
	}

	// A server stopped during run_asked: its runs are interrupted at start.
	ir, err := st.InterruptRuns(ctx, "", ts(400))
	if err != nil || len(ir) != 1 || ir[0].ID != "run_asked" {
		t.Fatalf("InterruptRuns: %+v %v, want run_asked", ir, err)
	}
	if runs, _ := st.Runs(ctx, "sch_a", 1); len(runs) != 1 || runs[0].Status != store.RunInterrupted || runs[0].EndedAt == nil {
		t.Fatalf("the interrupted run: %+v", runs)
	}
	if got, _ := st.Schedule(ctx, "sch_a"); got.Running || got.LastStatus != store.RunInterrupted {
		t.Fatalf("after the interruption: %+v", got)
	}
	if ir, err := st.InterruptRuns(ctx, "", ts(400)); err != nil || len(ir) != 0 {
		t.Fatalf("InterruptRuns again: %+v %v, want none", ir, err)
	}

	// Deleting a schedule takes its runs; deleting a sandbox's row takes
	// its schedules.
	if err := st.DeleteSchedule(ctx, "sch_b"); err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteSchedule(ctx, "sch_b"); err != nil {
		t.Fatalf("second delete: %v", err)
	}
	if err := st0.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if l, err := other.Schedules(ctx, p.ID, ""); err != nil || len(l) != 1 || l[0].ID != "sch_c" {
		t.Fatalf("schedules after the sandbox went: %+v %v, want sch_c only", l, err)
	}
	if runs, err := st.Runs(ctx, "sch_a", 10); err != nil || len(runs) != 0 {
		t.Fatalf("runs of a schedule that went with its sandbox: %+v %v", runs, err)
	}
	// A run that went with them is not an error to end.
	e := ts(500)
	if err := st.UpdateRun(ctx, nil, store.ScheduleRun{ID: "run_asked", ScheduleID: "sch_a", SandboxID: sb.ID, Status: store.RunSucceeded, EndedAt: &e},
		&store.RunEnd{}); err != nil {
		t.Fatalf("UpdateRun of a run that is gone: %v", err)
	}
}

// testScheduleFence: in a cluster, a claim is fenced by the claimer's
// incarnation and the sandbox's node: a node that is not current, or not
// the sandbox's, cannot run it.
func testScheduleFence(t *testing.T, ctx context.Context, open func() store.Cluster, p store.Project) {
	c := open()
	st := c.(store.Schedules)
	fa, fb, _ := twoNodes(t, ctx, c, open())
	sb := sandboxOn(p, "sb-f", "running", 1, 256)
	if err := c.PutSandboxFenced(ctx, fa, sb, nil); err != nil {
		t.Fatal(err)
	}
	sc := scheduleOf(sb, "sch_f", ts(10))
	if err := st.InsertSchedule(ctx, sc, 0, 0); err != nil {
		t.Fatal(err)
	}
	cl := claimOf(sc, "run_b", ts(10), ts(70))
	cl.Fence = &fb
	if _, err := st.ClaimRun(ctx, cl); !errors.Is(err, errdefs.ErrConflict) && !errors.Is(err, store.ErrFenced) {
		t.Fatalf("claim by the node that does not hold the sandbox: %v, want a refusal", err)
	}
	stale := fa
	stale.Incarnation--
	cl.Fence, cl.Run.ID = &stale, "run_stale"
	if _, err := st.ClaimRun(ctx, cl); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("claim by a stale incarnation: %v, want ErrFenced", err)
	}
	cl.Fence, cl.Run.ID = &fa, "run_a"
	if r, err := st.ClaimRun(ctx, cl); err != nil || r != store.Claimed {
		t.Fatalf("claim by the sandbox's node: %v %v", r, err)
	}
	// A node that registered again (a restart) ends its runs fenced.
	fa2, err := c.RegisterNode(ctx, nodeInfo("a"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	e := ts(20)
	run := cl.Run
	run.Status, run.EndedAt = store.RunSucceeded, &e
	if err := st.UpdateRun(ctx, &fa, run, &store.RunEnd{}); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("UpdateRun by the old incarnation: %v, want ErrFenced", err)
	}
	if err := st.UpdateRun(ctx, &fa2, run, &store.RunEnd{}); err != nil {
		t.Fatal(err)
	}
}
