package events

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
)

// KeepaliveInterval is how often a stream with nothing to send says it is
// there (proxies close idle connections).
const KeepaliveInterval = 15 * time.Second

// Query is what a stream follows: one project's events, of one sandbox
// and some types when set, from where a client left off.
type Query struct {
	ProjectID string
	SandboxID string   // "": every sandbox
	Types     []string // none: every type (CheckTypes first)
	// LastEventID resumes after that event of the project (the stream's
	// Last-Event-ID); it must be in the log (within the retention).
	LastEventID string
	// Since, without LastEventID, starts with the events since then
	// (within the retention); zero: from now on.
	Since time.Time
}

// Stream is where Follow sends; an error from any of its functions ends
// the stream (the client went).
type Stream struct {
	// Opened is called once the stream's starting point is known, before
	// any event (nil: nothing to do).
	Opened func() error
	// Send gets each event.
	Send func(store.Event) error
	// Keepalive is called every KeepaliveInterval without an event.
	Keepalive func() error
}

// Follow sends each event q selects to out, in the log's order, until ctx
// is done, out fails (nil is returned then: the client went) or the
// server ends its streams (EndStreams). Events of
// every node of a cluster are there (the log is the shared store's). A
// LastEventID the log does not hold (never was, another project's, past
// the retention) is ErrInvalid, before Opened.
func (l *Log) Follow(ctx context.Context, q Query, out Stream) error {
	sq := store.EventQuery{ProjectID: q.ProjectID, SandboxID: q.SandboxID, Types: q.Types}
	switch {
	case q.LastEventID != "":
		seq, err := l.cfg.Store.EventSeq(ctx, q.ProjectID, q.LastEventID)
		if errors.Is(err, errdefs.ErrNotFound) {
			return errdefs.WithCode("event_not_found", fmt.Errorf(
				"Last-Event-ID %q: no event of this project with that id is in the log (events are kept %s): start again without it: %w",
				q.LastEventID, l.cfg.Retention, errdefs.ErrInvalid))
		}
		if err != nil {
			return err
		}
		sq.After = seq
	case !q.Since.IsZero():
		sq.Since = q.Since
	default:
		seq, err := l.cfg.Store.LastEventSeq(ctx)
		if err != nil {
			return err
		}
		sq.After = seq
	}
	if out.Opened != nil {
		if err := out.Opened(); err != nil {
			return nil
		}
	}
	l.hub.join()
	defer l.hub.leave()
	idle := time.NewTimer(KeepaliveInterval)
	defer idle.Stop()
	for {
		// The wake-up is taken before the query: an append after the
		// query wakes this loop.
		wake := l.hub.next()
		top, err := l.cfg.Store.LastEventSeq(ctx)
		if err != nil {
			return l.ended(ctx, err)
		}
		for {
			page, err := l.cfg.Store.Events(ctx, sq)
			if err != nil {
				return l.ended(ctx, err)
			}
			for _, ev := range page {
				if err := out.Send(ev); err != nil {
					return nil
				}
				sq.After = ev.Seq
			}
			if len(page) < store.DefaultEventPage {
				break
			}
			idle.Reset(KeepaliveInterval)
		}
		// Every event up to top had committed when top was read (the
		// log's order is its commits'), so none the filter left out
		// needs to be read again.
		sq.After = max(sq.After, top)
		select {
		case <-ctx.Done():
			return nil
		case <-l.streams.Done():
			return nil
		case <-wake:
		case <-idle.C:
			if out.Keepalive() != nil {
				return nil
			}
			idle.Reset(KeepaliveInterval)
		}
	}
}

// ended is a stream's end on err: none when the client went.
func (l *Log) ended(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// hub wakes the streams of this server when the log may have grown: at
// once after this server's appends, and after the poller sees another
// node's.
type hub struct {
	mu        sync.Mutex
	changed   chan struct{} // closed at the next change
	followers int
}

func (h *hub) init() { h.changed = make(chan struct{}) }

// next is closed at the next change.
func (h *hub) next() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.changed
}

func (h *hub) broadcast() {
	h.mu.Lock()
	defer h.mu.Unlock()
	close(h.changed)
	h.changed = make(chan struct{})
}

func (h *hub) join() {
	h.mu.Lock()
	h.followers++
	h.mu.Unlock()
}

func (h *hub) leave() {
	h.mu.Lock()
	h.followers--
	h.mu.Unlock()
}

func (h *hub) following() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.followers > 0
}

// poll looks for events other nodes appended every PollInterval while
// streams follow the log, and wakes them when the log grew.
func (l *Log) poll(ctx context.Context) {
	t := time.NewTicker(l.cfg.PollInterval)
	defer t.Stop()
	var seen int64
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !l.hub.following() {
			continue
		}
		top, err := l.cfg.Store.LastEventSeq(ctx)
		if err != nil || top == seen {
			continue
		}
		seen = top
		l.hub.broadcast()
	}
}
