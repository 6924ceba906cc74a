package sandbox

import (
	"context"
	"time"
)

// Lifecycle events: the core tells Config.Events what happened to each
// sandbox (made, paused, resumed, timed out, killed, died, moved), for the
// project's event stream and webhooks (internal/events). The sink only
// records: it must be quick, must not block and must not call the service.

// EventSink is told of lifecycle events.
type EventSink interface {
	Publish(Event)
}

// Event is one thing that happened to a sandbox.
type Event struct {
	Type      string
	ProjectID string
	SandboxID string
	// By is what caused it where more than one thing can (Cause*).
	By string
	// Detail says more, for people: why it died, the snapshot it came
	// from, where it moved.
	Detail string
	At     time.Time
}

// Event types.
const (
	EventCreated  = "sandbox.created"
	EventPaused   = "sandbox.paused"
	EventResumed  = "sandbox.resumed"
	EventTimedOut = "sandbox.timed_out"
	EventKilled   = "sandbox.killed"
	EventDied     = "sandbox.died"
	EventMoved    = "sandbox.moved"
)

// Causes of an event (Event.By).
const (
	CauseAPI      = "api"      // a client's call (the default)
	CauseTraffic  = "traffic"  // a request that needed the sandbox woke it
	CauseSchedule = "schedule" // a schedule's run
	CauseTimeout  = "timeout"  // its own deadline
	CauseMove     = "move"     // a move between nodes
)

type causeKey struct{}

// WithCause marks ctx's lifecycle calls as caused by by (a Cause*): the
// events they make say so.
func WithCause(ctx context.Context, by string) context.Context {
	return context.WithValue(ctx, causeKey{}, by)
}

// causeOf is the cause ctx carries, CauseAPI when none.
func causeOf(ctx context.Context) string {
	if by, ok := ctx.Value(causeKey{}).(string); ok && by != "" {
		return by
	}
	return CauseAPI
}

// emit tells the sink of an event of rec's sandbox.
func (s *Service) emit(typ string, rec Record, by, detail string) {
	if s.cfg.Events == nil || rec.Status == StatusPooled {
		return
	}
	s.cfg.Events.Publish(Event{Type: typ, ProjectID: rec.ProjectID, SandboxID: rec.ID, By: by, Detail: detail, At: time.Now().UTC()})
}

// recordOf is a copy of e's record, read under the table's lock.
func (s *Service) recordOf(e *entry) Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	return e.rec.clone()
}
