package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
)

// Warm pools across nodes (docs/CLUSTER.md). A snapshot's warm copies are
// kept by one node, its pool node: the snapshot's own node until another
// adopts the pool, when that one is drained with --move, declared dead or
// removed. The adopter downloads the durable image once into its
// snapshot directory (a cache, every digest checked) and restores the
// copies from it; this service then holds a foreign entry: the pool and
// the cache, not the snapshot's record.

// Pools is what the store of a cluster node offers for warm pools on
// other nodes than their snapshot's: the node's name and the fenced
// adoption of a pool (store.Cluster.AdoptPool).
type Pools interface {
	Node() string
	AdoptPool(ctx context.Context, id, from string) error
	// AdoptedPools lists the snapshots of other nodes whose pools this
	// node keeps.
	AdoptedPools(ctx context.Context) ([]store.Snapshot, error)
}

// PoolPeers reaches the pool node of a snapshot whose pool another node
// keeps: a delete of the snapshot here drops the copies and the cache
// there. A node declared dead or removed is dropped already (nil).
type PoolPeers interface {
	DropPool(ctx context.Context, node, id string) error
}

// SetPoolPeers wires the cluster's pool peers (set once, before serving).
func (s *Service) SetPoolPeers(p PoolPeers) {
	s.mu.Lock()
	s.poolPeers = p
	s.mu.Unlock()
}

// node is this node's name in a cluster, "" on a single server.
func (s *Service) node() string {
	if p, ok := s.cfg.Store.(Pools); ok {
		return p.Node()
	}
	return ""
}

// poolHereLocked reports whether this node keeps se's warm copies.
func (s *Service) poolHereLocked(se *snapEntry) bool { return se.poolNode == s.node() }

// AdoptPool makes this node keep the warm copies of the project's durable
// snapshot id, which node from keeps now (it is drained with --move,
// declared dead or removed): the image is downloaded once into the cache
// (verified), the pool is adopted in the store (fenced: of two adopters
// one wins, the other gets ErrConflict and drops its download) and filled.
func (s *Service) AdoptPool(ctx context.Context, projectID, id, from string) error {
	p, ok := s.cfg.Store.(Pools)
	f, ok2 := s.cfg.Store.(ForeignSnapshots)
	if !ok || !ok2 || s.cfg.Images == nil {
		return errdefs.WithCode("feature_unavailable", fmt.Errorf("adopt the pool of snapshot %s: this node is not in a cluster with an object store: %w", id, errdefs.ErrConflict))
	}
	if err := s.checkpointer("warm pools"); err != nil {
		return err
	}
	row, err := f.SnapshotAnywhere(ctx, projectID, id)
	if err != nil {
		return err
	}
	var snap Snapshot
	if err := json.Unmarshal(row.Spec, &snap); err != nil || snap.ID != id {
		return fmt.Errorf("snapshot %s: unreadable record: %w", id, errdefs.ErrConflict)
	}
	if snap.DurableAt == nil {
		return fmt.Errorf("snapshot %s is not durable yet; its pool cannot move: %w", id, errdefs.ErrConflict)
	}
	if snap.VolumeID != "" {
		return fmt.Errorf("snapshot %s holds volume %s; it has no warm pool: %w", id, snap.VolumeID, errdefs.ErrConflict)
	}
	self := p.Node()
	s.mu.Lock()
	se := s.snapshots[id]
	s.mu.Unlock()
	fresh := se == nil
	if fresh {
		if err := s.sameBuild(ctx, SnapshotImageName(id)); err != nil {
			return fmt.Errorf("adopt the pool of snapshot %s: %w", id, err)
		}
		rootfs, release, err := s.hereRootfs(projectID, snap.Template, snap.Rootfs, true)
		if err != nil {
			return fmt.Errorf("adopt the pool of snapshot %s: %w", id, err)
		}
		defer release()
		snap.Rootfs = rootfs
		if err := os.MkdirAll(s.cfg.SnapshotDir, 0o700); err != nil {
			return err
		}
		if err := s.images.Materialize(ctx, SnapshotImageName(id), s.snapshotDir(id)); err != nil {
			return fmt.Errorf("adopt the pool of snapshot %s: %w", id, err)
		}
	}
	err = p.AdoptPool(ctx, id, from)
	if err != nil && !(errors.Is(err, errdefs.ErrConflict) && row.KeepsPool() == self) {
		if fresh {
			os.RemoveAll(s.snapshotDir(id))
		}
		return fmt.Errorf("adopt the pool of snapshot %s: %w", id, err)
	}
	s.mu.Lock()
	if se == nil {
		se = &snapEntry{snap: snap, foreign: row.Node != self}
		s.snapshots[id] = se
	}
	se.snap.PoolSize, se.snap.PoolPaused = snap.PoolSize, snap.PoolPaused
	se.poolNode = self
	s.mu.Unlock()
	s.log.Info("warm pool adopted", "snapshot", id, "from", from, "poolSize", snap.PoolSize)
	s.fillPool(se)
	return nil
}

// sameBuild checks, before it is downloaded, that durable image name was
// written by this node's runsc build (its manifest's checkpoint says which;
// an image that does not say, or a runtime that cannot tell, passes: the
// runtime checks again at each restore).
func (s *Service) sameBuild(ctx context.Context, name string) error {
	rd, ok := s.cfg.Runtime.(interface {
		RunscDigest(ctx context.Context) (string, error)
	})
	if !ok {
		return nil
	}
	m, err := s.cfg.Images.Stat(ctx, name)
	if err != nil {
		return err
	}
	var cp struct {
		RunscDigest string `json:"runscDigest"`
	}
	if len(m.Checkpoint) == 0 || json.Unmarshal(m.Checkpoint, &cp) != nil || cp.RunscDigest == "" {
		return nil
	}
	mine, err := rd.RunscDigest(ctx)
	if err != nil {
		return err
	}
	if cp.RunscDigest != mine {
		return errdefs.WithCode("incompatible_checkpoint", fmt.Errorf("image %s was written by runsc build %s, this node runs %s: %w", name, cp.RunscDigest, mine, errdefs.ErrConflict))
	}
	return nil
}

// DropPool lets the warm pool of snapshot id go from this node, which
// keeps it for another node's snapshot: the copies are destroyed and the
// cached image removed (the snapshot was deleted on its node). A snapshot
// of this node's own, or none, is left as it is.
func (s *Service) DropPool(ctx context.Context, id string) error {
	s.mu.Lock()
	se := s.snapshots[id]
	if se == nil || !se.foreign {
		s.mu.Unlock()
		return nil
	}
	se.gone = true
	delete(s.snapshots, id)
	s.mu.Unlock()
	s.trimPool(ctx, se)
	s.log.Info("warm pool dropped", "snapshot", id)
	return os.RemoveAll(s.snapshotDir(id))
}

// PoolMoved is the outcome of handing one warm pool over (HandOverPools).
type PoolMoved struct {
	ID, To string
	Err    error
}

// HandOverPools has other nodes adopt the warm pools this node keeps (a
// drain --move): each pool's snapshot must be durable first (ctx bounds
// the wait), adopt asks another node to take it (returning its name), and
// the copies here go. A pool that could not move is reported (Evacuate
// then drops its copies with the node's other warm copies).
func (s *Service) HandOverPools(ctx context.Context, adopt func(ctx context.Context, projectID, id string) (string, error)) []PoolMoved {
	s.mu.Lock()
	var ses []*snapEntry
	for _, se := range s.snapshots {
		if !se.gone && s.poolHereLocked(se) && se.snap.PoolSize > 0 && !se.snap.PoolPaused && se.snap.VolumeID == "" {
			ses = append(ses, se)
		}
	}
	s.mu.Unlock()
	var out []PoolMoved
	for _, se := range ses {
		s.mu.Lock()
		id, project := se.snap.ID, se.snap.ProjectID
		s.mu.Unlock()
		m := PoolMoved{ID: id}
		if m.Err = s.waitSnapshotDurable(ctx, se); m.Err == nil {
			m.To, m.Err = adopt(ctx, project, id)
		}
		if m.Err != nil {
			s.log.Error("warm pool not handed over; its copies stay here", "snapshot", id, "err", m.Err)
			out = append(out, m)
			continue
		}
		s.mu.Lock()
		if se.poolNode == s.node() {
			se.poolNode = m.To
		}
		foreign := se.foreign
		s.mu.Unlock()
		if foreign {
			m.Err = s.DropPool(context.WithoutCancel(ctx), id)
		} else {
			s.trimPool(context.WithoutCancel(ctx), se)
		}
		s.log.Info("warm pool handed over", "snapshot", id, "node", m.To)
		out = append(out, m)
	}
	return out
}

// waitSnapshotDurable waits until se's image is durable.
func (s *Service) waitSnapshotDurable(ctx context.Context, se *snapEntry) error {
	for {
		s.mu.Lock()
		durable, gone, id := se.snap.DurableAt != nil, se.gone, se.snap.ID
		s.mu.Unlock()
		switch {
		case gone:
			return snapNotFound(id)
		case durable:
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("snapshot %s: its image did not become durable: %w", id, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// loadSnapshot is recovery's entry for a snapshot record: its own (the
// image is on this disk, or durable), or another node's whose pool this
// node keeps (foreign: the image is a cache, downloaded again when
// missing). ok false: the record is not this node's to keep.
func (s *Service) loadSnapshot(r store.Snapshot, snap Snapshot) (*snapEntry, bool) {
	self := s.node()
	se := &snapEntry{snap: snap, poolNode: r.KeepsPool(), foreign: r.Node != self}
	if se.foreign {
		if se.poolNode != self || snap.DurableAt == nil {
			return nil, false
		}
	}
	return se, true
}
