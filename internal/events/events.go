// Package events is the projects' lifecycle event log: the sink the
// sandbox core tells of what happens to sandboxes (sandbox.EventSink), the
// schedules' runs (ScheduleRuns), their durable record in the store
// (store.Events: one log for every node of a cluster) and the stream that
// GET /api/events follows (Follow). The webhooks that carry the same
// events out are internal/webhook's. Only cmd/lizard wires it; the API
// and the schedules call it through interfaces of their own.
//
// Publishing never waits: an event goes into a bounded buffer that a
// writer of its own empties into the store in batches, retrying with
// backoff while the store does not answer. When the buffer is full the
// newest events are dropped and counted, and once the store takes writes
// again each project that lost some gets an events.dropped event saying
// how many, so that a follower knows to look again at its sandboxes.
package events

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/store"
)

// Event types beyond the core's (sandbox.Event*).
const (
	// TypeScheduleRunFinished: a schedule's run ended (ScheduleRuns).
	TypeScheduleRunFinished = "schedule.run_finished"
	// TypeDropped: events of the project were lost (Event.Dropped says
	// how many) because the buffer was full while the store was out.
	TypeDropped = "events.dropped"
)

// Types are every event type, in the order the docs list them.
var Types = []string{
	sandbox.EventCreated, sandbox.EventPaused, sandbox.EventResumed, sandbox.EventTimedOut,
	sandbox.EventKilled, sandbox.EventDied, sandbox.EventMoved, TypeScheduleRunFinished, TypeDropped,
}

// CheckTypes refuses a type that is not one of Types, naming field (the
// request's parameter) and the index of the bad one.
func CheckTypes(field string, types []string) error {
	for i, t := range types {
		if !slices.Contains(Types, t) {
			return fmt.Errorf("%s[%d] %q: not an event type; want one of %s: %w", field, i, t, strings.Join(Types, ", "), errdefs.ErrInvalid)
		}
	}
	return nil
}

// Event is one event as the stream and webhooks carry it (JSON), and as
// the log keeps it (store.Event.Data).
type Event struct {
	// ID is stable: the same in the stream, on every webhook delivery and
	// on every retry of one.
	ID        string `json:"id"`
	Type      string `json:"type"`
	ProjectID string `json:"projectId"`
	SandboxID string `json:"sandboxId,omitempty"`
	// By is what caused it: api, traffic, schedule, timeout or move
	// (sandbox.Cause*).
	By string `json:"by,omitempty"`
	// Detail says more, for people: why a sandbox died, where it moved,
	// a run's status.
	Detail string `json:"detail,omitempty"`
	// Node is the cluster node it happened on ("" on a single server).
	Node string    `json:"node,omitempty"`
	At   time.Time `json:"at"`
	// Run is the run of a schedule.run_finished event.
	Run *Run `json:"run,omitempty"`
	// Dropped is how many events an events.dropped event stands for.
	Dropped int `json:"dropped,omitempty"`
}

// Run is a schedule's run as its event tells it: the fields of the Lizard
// SDK's SandboxScheduleRun that fit in an event (not its output).
type Run struct {
	ID         string    `json:"id"`
	ScheduleID string    `json:"scheduleId"`
	SandboxID  string    `json:"sandboxId"`
	Status     string    `json:"status"`
	Woke       bool      `json:"woke"`
	Slept      bool      `json:"slept"`
	StartedAt  time.Time `json:"startedAt"`
	EndedAt    time.Time `json:"endedAt"`
	DurationMs int64     `json:"durationMs"`
	ExitCode   *int      `json:"exitCode"`
	Error      string    `json:"error,omitempty"`
}

// ScheduleRun is what the schedules (internal/schedule) tell of a run that
// ended.
type ScheduleRun struct {
	ProjectID  string
	SandboxID  string
	ScheduleID string
	RunID      string
	// Status is the run's final status: succeeded, failed, timeout or
	// interrupted.
	Status      string
	Woke, Slept bool
	StartedAt   time.Time
	EndedAt     time.Time
	ExitCode    *int // nil: the command did not exit (timeout, interrupted)
	Error       string
}

// ScheduleRuns is how the schedules tell of their runs; *Log implements it.
// ScheduleRunFinished returns at once and never fails (as
// sandbox.EventSink's Publish): call it once per run, when the run is over
// and its sandbox back asleep if the run woke it.
type ScheduleRuns interface {
	ScheduleRunFinished(ScheduleRun)
}

// record is ev as the store keeps it.
func (ev Event) record() (store.Event, error) {
	data, err := json.Marshal(ev)
	if err != nil {
		return store.Event{}, err
	}
	return store.Event{ID: ev.ID, ProjectID: ev.ProjectID, SandboxID: ev.SandboxID, Type: ev.Type, At: ev.At, Data: data}, nil
}

// newID is a new event's stable id.
func newID() string { return store.NewID("evt_", 20) }
