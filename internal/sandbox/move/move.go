// Package move empties a cluster node of its sandboxes for lizard nodes
// drain --move (docs/CLUSTER.md): every running sandbox is paused, every
// paused one waits until its image is durable in the object store and is
// released (orphaned, so that another node takes it over), those that ran
// are resumed on another node, and the node's warm copies go (the
// snapshots' pools are handed over first, by internal/sandbox/snapshot).
// It takes the sandbox core through Core; cmd/lizard runs it when the
// node's row says move.
package move

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/sandbox"
)

// Core is what a move needs of the sandbox core (*sandbox.Service).
type Core interface {
	EachLive(fn func(sandbox.Record))
	Live(id string) (sandbox.Record, bool)
	Pause(ctx context.Context, projectID, id string) error
	Release(ctx context.Context, id string) error
	Pools() map[string]int
	TrimPool(ctx context.Context, poolOf string, keep int)
}

var _ Core = (*sandbox.Service)(nil)

// Moved is the outcome of moving one sandbox away.
type Moved struct {
	ID, ProjectID string
	// WasRunning: it ran and was paused for the move (resume was
	// called); else it was paused and is just movable now.
	WasRunning bool
	Err        error
}

// Config is what Evacuate works with.
type Config struct {
	Core Core
	// ObjectStore: the node keeps images durable in an object store,
	// without which nothing can move.
	ObjectStore bool
	// Resume has another node take a released sandbox over and resume it.
	Resume func(ctx context.Context, projectID, id string) error
	// Poll is how often a pause image's upload is looked at (default
	// 200 ms).
	Poll time.Duration
}

// Evacuate moves this node's sandboxes to other nodes and returns what
// happened to each; ctx bounds the wait for uploads. A sandbox that could
// not move stays here, paused if it was paused for the move.
func Evacuate(ctx context.Context, cfg Config) []Moved {
	if cfg.Poll == 0 {
		cfg.Poll = 200 * time.Millisecond
	}
	var recs []sandbox.Record
	cfg.Core.EachLive(func(rec sandbox.Record) { recs = append(recs, rec) })
	out := make([]Moved, 0, len(recs))
	if !cfg.ObjectStore {
		// Nothing can move: nothing is paused for it either.
		for _, rec := range recs {
			out = append(out, Moved{ID: rec.ID, ProjectID: rec.ProjectID, WasRunning: rec.Status == sandbox.StatusRunning,
				Err: fmt.Errorf("sandbox %q cannot move: this node is not in a cluster with an object store: %w", rec.ID, errdefs.ErrConflict)})
		}
		return out
	}
	// Warm copies never ran user code: they go (their pools were handed
	// over before).
	for poolOf := range cfg.Core.Pools() {
		cfg.Core.TrimPool(context.WithoutCancel(ctx), poolOf, 0)
	}
	for _, rec := range recs {
		m := Moved{ID: rec.ID, ProjectID: rec.ProjectID, WasRunning: rec.Status == sandbox.StatusRunning}
		switch {
		case rec.Status == sandbox.StatusRunning:
			m.Err = cfg.Core.Pause(ctx, rec.ProjectID, rec.ID)
		case rec.Status == sandbox.StatusPaused:
		default:
			m.Err = fmt.Errorf("sandbox %q is %s: %w", rec.ID, rec.Status, errdefs.ErrConflict)
		}
		out = append(out, m)
	}
	var wg sync.WaitGroup
	for i := range out {
		if out[i].Err != nil {
			continue
		}
		wg.Add(1)
		go func(m *Moved) {
			defer wg.Done()
			if m.Err = release(ctx, cfg, m.ID); m.Err == nil && m.WasRunning {
				m.Err = cfg.Resume(ctx, m.ProjectID, m.ID)
			}
		}(&out[i])
	}
	wg.Wait()
	return out
}

// release waits until paused sandbox id's image is durable, then lets it
// go.
func release(ctx context.Context, cfg Config, id string) error {
	for {
		rec, ok := cfg.Core.Live(id)
		if !ok {
			return sandbox.NotFound(id)
		}
		if rec.Status != sandbox.StatusPaused {
			return fmt.Errorf("sandbox %q is %s again; it was not moved: %w", id, rec.Status, errdefs.ErrConflict)
		}
		if rec.DurableAt != nil {
			return cfg.Core.Release(ctx, id)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("sandbox %q: its image did not become durable: %w", id, ctx.Err())
		case <-time.After(cfg.Poll):
		}
	}
}
