package events

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/store"
)

// Defaults and bounds of Config.
const (
	// DefaultRetention is how long events stay in the log.
	DefaultRetention = 24 * time.Hour
	// MinRetention is the shortest retention allowed: a client that
	// lost its stream resumes it with Last-Event-ID within an hour.
	MinRetention = time.Hour
	// DefaultBuffer is how many events wait for the store at most.
	DefaultBuffer = 10_000
	// DefaultPollInterval is how often followers look for events other
	// nodes wrote.
	DefaultPollInterval = 500 * time.Millisecond
)

const (
	// maxBatch is the most events one append writes.
	maxBatch = 256
	// flushTimeout bounds the last append at Close.
	flushTimeout = 5 * time.Second
	// pruneEvery is how often the log drops what is past its retention.
	pruneEvery = 5 * time.Minute
	// retryMax caps the wait between appends the store refused.
	retryMax = 5 * time.Second
)

// Store is what the log keeps its events in (store.Events has it).
type Store interface {
	AppendEvents(ctx context.Context, evs []store.Event) error
	Events(ctx context.Context, q store.EventQuery) ([]store.Event, error)
	EventSeq(ctx context.Context, projectID, id string) (int64, error)
	LastEventSeq(ctx context.Context) (int64, error)
	PruneEvents(ctx context.Context, before time.Time) (int64, error)
}

// Config wires a Log.
type Config struct {
	Store Store
	// Node is this server's node name in cluster mode ("" on a single
	// server); events say where they happened.
	Node string
	// Retention is how long events are kept (0: DefaultRetention; at
	// least MinRetention).
	Retention time.Duration
	// Buffer is how many events may wait for the store (0:
	// DefaultBuffer); beyond it they are dropped and counted.
	Buffer int
	// PollInterval is how often followers look for other nodes' events
	// (0: DefaultPollInterval).
	PollInterval time.Duration
	// Appended, when set, is called after every append that wrote events
	// (the webhooks' deliverer looks for new deliveries at once).
	Appended func()
	Logger   *slog.Logger
	// Now is the clock of retention (nil: time.Now).
	Now func() time.Time
}

// Log is the event log of every project: the sink of the sandbox core
// and of the schedules, and what the event stream follows.
type Log struct {
	cfg  Config
	log  *slog.Logger
	ch   chan store.Event
	hub  hub
	stop context.CancelFunc
	done chan struct{}
	// streams ends with EndStreams: every Follow returns.
	streams    context.Context
	endStreams context.CancelFunc

	mu      sync.Mutex
	dropped map[string]int // project → events dropped since the last events.dropped
}

var (
	_ sandbox.EventSink = (*Log)(nil)
	_ ScheduleRuns      = (*Log)(nil)
)

// New starts the log's writer, pruner and poller; Close stops them.
func New(cfg Config) (*Log, error) {
	if cfg.Retention == 0 {
		cfg.Retention = DefaultRetention
	}
	if cfg.Retention < MinRetention {
		return nil, fmt.Errorf("--events-retention %s: must be at least %s (a stream resumes within an hour): %w", cfg.Retention, MinRetention, errdefs.ErrInvalid)
	}
	if cfg.Buffer <= 0 {
		cfg.Buffer = DefaultBuffer
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	ctx, stop := context.WithCancel(context.Background())
	l := &Log{cfg: cfg, log: cfg.Logger, ch: make(chan store.Event, cfg.Buffer), stop: stop, done: make(chan struct{}),
		dropped: map[string]int{}}
	l.hub.init()
	l.streams, l.endStreams = context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); l.write(ctx) }()
	go func() { defer wg.Done(); l.prune(ctx) }()
	go func() { defer wg.Done(); l.poll(ctx) }()
	go func() { wg.Wait(); close(l.done) }()
	return l, nil
}

// Close stops the log: the events still waiting are written (within a
// few seconds) before it returns. Events published after are dropped.
// Streams end too.
func (l *Log) Close() {
	l.EndStreams()
	l.stop()
	<-l.done
}

// EndStreams ends every stream (Follow returns; clients reconnect with
// their Last-Event-ID), and those that start later at once: for a server
// shutting down, whose HTTP server waits for its requests to end, while
// events are still written.
func (l *Log) EndStreams() { l.endStreams() }

// Retention is how long events are kept.
func (l *Log) Retention() time.Duration { return l.cfg.Retention }

// Publish records a lifecycle event of the sandbox core; it never waits.
func (l *Log) Publish(ev sandbox.Event) {
	at := ev.At
	if at.IsZero() {
		at = time.Now().UTC()
	}
	l.put(Event{ID: newID(), Type: ev.Type, ProjectID: ev.ProjectID, SandboxID: ev.SandboxID, By: ev.By, Detail: ev.Detail,
		Node: l.cfg.Node, At: at})
}

// ScheduleRunFinished records the end of a schedule's run; it never
// waits.
func (l *Log) ScheduleRunFinished(r ScheduleRun) {
	at := r.EndedAt
	if at.IsZero() {
		at = time.Now().UTC()
	}
	run := &Run{ID: r.RunID, ScheduleID: r.ScheduleID, SandboxID: r.SandboxID, Status: r.Status, Woke: r.Woke, Slept: r.Slept,
		StartedAt: r.StartedAt.UTC(), EndedAt: at.UTC(), ExitCode: r.ExitCode, Error: r.Error}
	if !r.StartedAt.IsZero() {
		run.DurationMs = at.Sub(r.StartedAt).Milliseconds()
	}
	l.put(Event{ID: newID(), Type: TypeScheduleRunFinished, ProjectID: r.ProjectID, SandboxID: r.SandboxID, By: sandbox.CauseSchedule,
		Detail: r.Status, Node: l.cfg.Node, At: at.UTC(), Run: run})
}

// put queues ev for the writer, or counts it dropped when the buffer is
// full.
func (l *Log) put(ev Event) {
	rec, err := ev.record()
	if err != nil {
		l.log.Error("event not recorded: it does not encode", "type", ev.Type, "err", err)
		return
	}
	select {
	case l.ch <- rec:
	default:
		l.mu.Lock()
		first := len(l.dropped) == 0
		l.dropped[ev.ProjectID]++
		l.mu.Unlock()
		if first {
			l.log.Error("event buffer full: events are dropped until the store takes writes again (each project that lost some gets an events.dropped event)",
				"buffer", l.cfg.Buffer)
		}
	}
}

// write empties the buffer into the store in batches until ctx is done,
// then writes what is left within flushTimeout.
func (l *Log) write(ctx context.Context) {
	var batch []store.Event
	for {
		if len(batch) == 0 {
			select {
			case ev := <-l.ch:
				batch = append(batch, ev)
			case <-ctx.Done():
			}
		}
		batch = l.fill(batch)
		if ctx.Err() != nil {
			break
		}
		if l.appendRetrying(ctx, batch) {
			batch = batch[:0]
		}
	}
	fctx, cancel := context.WithTimeout(context.Background(), flushTimeout)
	defer cancel()
	for len(batch) > 0 && fctx.Err() == nil {
		if err := l.cfg.Store.AppendEvents(fctx, batch); err != nil {
			l.log.Error("events lost at shutdown: the store did not take them", "events", len(batch)+len(l.ch), "err", err)
			return
		}
		batch = l.fill(batch[:0])
	}
}

// fill adds to batch what waits in the buffer, up to maxBatch.
func (l *Log) fill(batch []store.Event) []store.Event {
	for len(batch) < maxBatch {
		select {
		case ev := <-l.ch:
			batch = append(batch, ev)
		default:
			return batch
		}
	}
	return batch
}

// appendRetrying appends batch, and then, once the buffer is empty, an
// events.dropped event per project that lost events, retrying with jittered backoff while the
// store refuses; false when ctx ended first.
func (l *Log) appendRetrying(ctx context.Context, batch []store.Event) bool {
	wait := 100 * time.Millisecond
	var failedSince time.Time
	for {
		err := l.cfg.Store.AppendEvents(ctx, batch)
		if err == nil {
			if !failedSince.IsZero() {
				l.log.Info("event log: the store takes writes again", "after", time.Since(failedSince).Round(time.Millisecond))
			}
			l.appended()
			if len(l.ch) == 0 {
				// After the events that waited: the dropped ones came
				// after them.
				l.appendDropped(ctx)
			}
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		if failedSince.IsZero() {
			failedSince = time.Now()
			l.log.Warn("event log: the store does not take events; retrying (they wait in the buffer)", "events", len(batch), "err", err)
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait/2 + rand.N(wait/2+1)):
		}
		wait = min(2*wait, retryMax)
	}
}

// appendDropped appends an events.dropped event for each project that
// lost events, once the store takes writes again; counts that do not
// make it are kept for the next time.
func (l *Log) appendDropped(ctx context.Context) {
	l.mu.Lock()
	lost := l.dropped
	if len(lost) == 0 {
		l.mu.Unlock()
		return
	}
	l.dropped = map[string]int{}
	l.mu.Unlock()
	var evs []store.Event
	for project, n := range lost {
		rec, err := Event{ID: newID(), Type: TypeDropped, ProjectID: project, Node: l.cfg.Node, At: time.Now().UTC(), Dropped: n,
			Detail: fmt.Sprintf("%d events were lost while this server's event buffer (%d) was full", n, l.cfg.Buffer)}.record()
		if err == nil {
			evs = append(evs, rec)
		}
	}
	if err := l.cfg.Store.AppendEvents(ctx, evs); err != nil {
		l.mu.Lock()
		for project, n := range lost {
			l.dropped[project] += n
		}
		l.mu.Unlock()
		return
	}
	l.log.Warn("event log: events were dropped while the buffer was full", "projects", len(lost))
	l.appended()
}

// appended tells followers and Config.Appended that events were written.
func (l *Log) appended() {
	l.hub.broadcast()
	if l.cfg.Appended != nil {
		l.cfg.Appended()
	}
}

// Prune removes the events past the retention and says how many.
func (l *Log) Prune(ctx context.Context) (int64, error) {
	return l.cfg.Store.PruneEvents(ctx, l.cfg.Now().Add(-l.cfg.Retention))
}

// prune runs Prune every pruneEvery until ctx is done.
func (l *Log) prune(ctx context.Context) {
	t := time.NewTicker(pruneEvery)
	defer t.Stop()
	for {
		if n, err := l.Prune(ctx); err != nil && ctx.Err() == nil {
			l.log.Warn("event log: prune", "err", err)
		} else if n > 0 {
			l.log.Debug("event log: pruned", "events", n, "retention", l.cfg.Retention)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
