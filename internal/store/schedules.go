package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// Schedule is the durable record of a sandbox schedule
// (internal/sandbox/schedule). Spec holds its settings, which the store does
// not look inside; the columns beside it are what the nodes coordinate on:
// when it is next due, whether it is on, and its counters.
type Schedule struct {
	ID        string
	ProjectID string
	// SandboxID is the sandbox it runs in. The record goes with the
	// sandbox's row: deleting the row deletes its schedules and their runs.
	SandboxID string
	Spec      json.RawMessage
	Enabled   bool
	// DisabledReason says why the schedule switched itself off ("" when
	// it was not the schedule's doing).
	DisabledReason string
	// NextRunAt is the next due time; nil while it has none (disabled).
	NextRunAt *time.Time
	// RunRequested is when a run now was asked for (RequestRun); nil when
	// none is pending.
	RunRequested        *time.Time
	LastRunAt           *time.Time
	LastStatus          string
	ConsecutiveFailures int
	SkippedCount        int
	// Running: a run of it is in progress (a run row with status running).
	Running   bool
	CreatedAt time.Time
}

// ScheduleRun is one run of a schedule.
type ScheduleRun struct {
	ID         string
	ScheduleID string
	SandboxID  string
	ProjectID  string
	// Node runs it ("" on a single server).
	Node string
	// Due is the due time it ran for (the request's time for a run asked
	// for): a schedule runs once per due time.
	Due        time.Time
	Status     string // one of the Run* statuses
	Woke       bool   // it resumed a paused sandbox
	Slept      bool   // it paused the sandbox again after
	StartedAt  time.Time
	EndedAt    *time.Time
	ExitCode   *int
	Output     string
	Error      string
	DurationMs *int64
}

// Run statuses.
const (
	RunRunning     = "running"
	RunSucceeded   = "succeeded"
	RunFailed      = "failed"
	RunTimeout     = "timeout"
	RunInterrupted = "interrupted"
)

// KeptRuns is how many runs of a schedule the store keeps; older ones go
// as new ones end.
const KeptRuns = 100

// RunClaim is a node's claim of one due time of a schedule: the claim and
// the schedule's next due time change together, so that of several nodes
// (or restarts) only one runs a due time.
type RunClaim struct {
	// Fence, when set (cluster mode), is the claiming node's
	// incarnation: the claim is refused (ErrFenced) unless it is current
	// and the schedule's sandbox is on its node.
	Fence *Fence
	// Due is the due time claimed: the schedule's NextRunAt as the
	// claimer read it, or, with Requested, its RunRequested.
	Due       time.Time
	Requested bool
	// Next is the schedule's next due time after the claim (a scheduled
	// claim only); Missed is how many due times besides Due passed while
	// no node ran them: they are added to the skipped count.
	Next   time.Time
	Missed int
	// Run is the run to start (status running).
	Run ScheduleRun
}

// ClaimResult is what ClaimRun did.
type ClaimResult int

const (
	// ClaimLost: the due time was no longer the schedule's (another node
	// or an earlier claim took it, the schedule changed or went, or it is
	// off): nothing changed.
	ClaimLost ClaimResult = iota
	// Claimed: the run was inserted, the schedule advanced.
	Claimed
	// ClaimOverlapped: a run of the schedule was still in progress, so
	// the due time was skipped and counted; the schedule advanced.
	ClaimOverlapped
)

// RunEnd is how a run ended, for the schedule's counters.
type RunEnd struct {
	// Failed counts towards ConsecutiveFailures (a success resets it);
	// with DisableAfter > 0 the schedule switches itself off when that
	// many runs in a row failed, with DisabledReason.
	Failed         bool
	DisableAfter   int
	DisabledReason string
}

// Schedules is the part of the store that keeps sandbox schedules and
// their runs; both backends implement it.
type Schedules interface {
	// InsertSchedule adds a schedule, refused with a quota error (ErrQuota,
	// Limit.Exceeded) when its sandbox already has perSandbox schedules or
	// its project perProject (0: no limit), counted in the same
	// transaction. A sandbox without a row is ErrNotFound.
	InsertSchedule(ctx context.Context, sc Schedule, perSandbox, perProject int) error
	// SetSchedule replaces a schedule's settings: Spec, Enabled,
	// DisabledReason, NextRunAt and ConsecutiveFailures (its other
	// counters and pending request stay). An unknown id is ErrNotFound.
	SetSchedule(ctx context.Context, sc Schedule) error
	// RequestRun asks for a run of the schedule now (at), switching it on
	// and clearing its failures. An unknown id is ErrNotFound.
	RequestRun(ctx context.Context, id string, at time.Time) error
	// Schedule returns one schedule; an unknown id is ErrNotFound.
	Schedule(ctx context.Context, id string) (Schedule, error)
	// Schedules lists a project's schedules ("" : every project's), only
	// those of sandboxID when it is not "", oldest first.
	Schedules(ctx context.Context, projectID, sandboxID string) ([]Schedule, error)
	// DeleteSchedule removes a schedule and its runs; a missing one is
	// not an error.
	DeleteSchedule(ctx context.Context, id string) error
	// DueSchedules lists the schedules that are on and due at now
	// (NextRunAt not after it) or have a run requested.
	DueSchedules(ctx context.Context, now time.Time) ([]Schedule, error)
	// ClaimRun claims c.Due of schedule c.Run.ScheduleID in one
	// transaction (see RunClaim and ClaimResult).
	ClaimRun(ctx context.Context, c RunClaim) (ClaimResult, error)
	// UpdateRun records a run's progress (status, woke, slept, end, exit
	// code, output, error); with end it also records the end on the
	// schedule (last run, status, failures) and drops runs beyond
	// KeptRuns. With f set it is fenced as ClaimRun is. A run that is
	// gone (its schedule or sandbox went) is not an error.
	UpdateRun(ctx context.Context, f *Fence, run ScheduleRun, end *RunEnd) error
	// Runs lists a schedule's last limit runs, newest first.
	Runs(ctx context.Context, scheduleID string, limit int) ([]ScheduleRun, error)
	// InterruptRuns ends every run still running on node (a server
	// stopped during them) with status interrupted at at (Interrupt), and
	// returns them so ended.
	InterruptRuns(ctx context.Context, node string, at time.Time) ([]ScheduleRun, error)
}

// ScheduleNotFound is the error for an unknown schedule id.
func ScheduleNotFound(id string) error {
	return errdefs.WithCode("schedule_not_found", fmt.Errorf("schedule %q: %w", id, errdefs.ErrNotFound))
}

// ScheduleQuota checks a new schedule against its limits: n of its
// sandbox's and m of its project's exist.
func ScheduleQuota(n, perSandbox, m, perProject int) error {
	if perSandbox > 0 && n+1 > perSandbox {
		return LimitSchedulesPerSandbox.Exceeded(float64(n), float64(perSandbox), 1)
	}
	if perProject > 0 && m+1 > perProject {
		return LimitSchedules.Exceeded(float64(m), float64(perProject), 1)
	}
	return nil
}

// InterruptedError is the error of a run cut short by a stop of its server.
const InterruptedError = "the server stopped during the run"

// Interrupt ends r as InterruptRuns does: interrupted at at.
func Interrupt(r *ScheduleRun, at time.Time) {
	d := at.Sub(r.StartedAt).Milliseconds()
	r.Status, r.EndedAt, r.DurationMs, r.Error = RunInterrupted, &at, &d, InterruptedError
}
