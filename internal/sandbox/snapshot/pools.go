package snapshot

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/sandbox/images"
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
func (m *Manager) SetPoolPeers(p PoolPeers) {
	m.mu.Lock()
	m.peers = p
	m.mu.Unlock()
}

// node is this node's name in a cluster, "" on a single server.
func (m *Manager) node() string {
	if p, ok := m.cfg.Store.(Pools); ok {
		return p.Node()
	}
	return ""
}

// poolHereLocked reports whether this node keeps se's warm copies.
func (m *Manager) poolHereLocked(se *entry) bool { return se.poolNode == m.node() }

// AdoptPool makes this node keep the warm copies of the project's durable
// snapshot id, which node from keeps now (it is drained with --move,
// declared dead or removed): the image is downloaded once into the cache
// (verified), the pool is adopted in the store (fenced: of two adopters
// one wins, the other gets ErrConflict and drops its download) and filled.
func (m *Manager) AdoptPool(ctx context.Context, projectID, id, from string) error {
	p, ok := m.cfg.Store.(Pools)
	f, ok2 := m.cfg.Store.(ForeignSnapshots)
	if !ok || !ok2 || m.cfg.Images == nil {
		return errdefs.WithCode("feature_unavailable", fmt.Errorf("adopt the pool of snapshot %s: this node is not in a cluster with an object store: %w", id, errdefs.ErrConflict))
	}
	if err := m.checkpointer("warm pools"); err != nil {
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
	m.mu.Lock()
	se := m.snapshots[id]
	m.mu.Unlock()
	fresh := se == nil
	if fresh {
		if err := m.sameBuild(ctx, images.SnapshotImageName(id)); err != nil {
			return fmt.Errorf("adopt the pool of snapshot %s: %w", id, err)
		}
		rootfs, release, err := m.cfg.Core.TemplateVersion(projectID, snap.Template, snap.Rootfs, true)
		if err != nil {
			return fmt.Errorf("adopt the pool of snapshot %s: %w", id, err)
		}
		defer release()
		snap.Rootfs = rootfs
		if err := os.MkdirAll(m.cfg.Dir, 0o700); err != nil {
			return err
		}
		if err := m.images.Materialize(ctx, images.SnapshotImageName(id), m.dir(id)); err != nil {
			return fmt.Errorf("adopt the pool of snapshot %s: %w", id, err)
		}
	}
	err = p.AdoptPool(ctx, id, from)
	if err != nil && !(errors.Is(err, errdefs.ErrConflict) && row.KeepsPool() == self) {
		if fresh {
			os.RemoveAll(m.dir(id))
		}
		return fmt.Errorf("adopt the pool of snapshot %s: %w", id, err)
	}
	m.mu.Lock()
	if se == nil {
		se = &entry{snap: snap, foreign: row.Node != self}
		m.snapshots[id] = se
	}
	se.snap.PoolSize, se.snap.PoolPaused = snap.PoolSize, snap.PoolPaused
	se.poolNode = self
	m.mu.Unlock()
	m.log.Info("warm pool adopted", "snapshot", id, "from", from, "poolSize", snap.PoolSize)
	m.fillPool(se)
	return nil
}

// sameBuild checks, before it is downloaded, that durable image name was
// written by this node's runsc build (its manifest's checkpoint says which;
// an image that does not say, or a runtime that cannot tell, passes: the
// runtime checks again at each restore).
func (m *Manager) sameBuild(ctx context.Context, name string) error {
	rd, ok := m.cfg.Runtime.(interface {
		RunscDigest(ctx context.Context) (string, error)
	})
	if !ok {
		return nil
	}
	man, err := m.cfg.Images.Stat(ctx, name)
	if err != nil {
		return err
	}
	var cp struct {
		RunscDigest string `json:"runscDigest"`
	}
	if len(man.Checkpoint) == 0 || json.Unmarshal(man.Checkpoint, &cp) != nil || cp.RunscDigest == "" {
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
func (m *Manager) DropPool(ctx context.Context, id string) error {
	m.mu.Lock()
	se := m.snapshots[id]
	if se == nil || !se.foreign {
		m.mu.Unlock()
		return nil
	}
	se.gone = true
	delete(m.snapshots, id)
	m.mu.Unlock()
	m.trimPool(ctx, se)
	m.log.Info("warm pool dropped", "snapshot", id)
	return os.RemoveAll(m.dir(id))
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
func (m *Manager) HandOverPools(ctx context.Context, adopt func(ctx context.Context, projectID, id string) (string, error)) []PoolMoved {
	m.mu.Lock()
	var ses []*entry
	for _, se := range m.snapshots {
		if !se.gone && m.poolHereLocked(se) && se.snap.PoolSize > 0 && !se.snap.PoolPaused && se.snap.VolumeID == "" {
			ses = append(ses, se)
		}
	}
	m.mu.Unlock()
	var out []PoolMoved
	for _, se := range ses {
		m.mu.Lock()
		id, project := se.snap.ID, se.snap.ProjectID
		m.mu.Unlock()
		pm := PoolMoved{ID: id}
		if pm.Err = m.waitDurable(ctx, se); pm.Err == nil {
			pm.To, pm.Err = adopt(ctx, project, id)
		}
		if pm.Err != nil {
			m.log.Error("warm pool not handed over; its copies stay here", "snapshot", id, "err", pm.Err)
			out = append(out, pm)
			continue
		}
		m.mu.Lock()
		if se.poolNode == m.node() {
			se.poolNode = pm.To
		}
		foreign := se.foreign
		m.mu.Unlock()
		if foreign {
			pm.Err = m.DropPool(context.WithoutCancel(ctx), id)
		} else {
			m.trimPool(context.WithoutCancel(ctx), se)
		}
		m.log.Info("warm pool handed over", "snapshot", id, "node", pm.To)
		out = append(out, pm)
	}
	return out
}

// waitDurable waits until se's image is durable.
func (m *Manager) waitDurable(ctx context.Context, se *entry) error {
	for {
		m.mu.Lock()
		durable, gone, id := se.snap.DurableAt != nil, se.gone, se.snap.ID
		m.mu.Unlock()
		switch {
		case gone:
			return notFound(id)
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

// load is recovery's entry for a snapshot record: its own (the
// image is on this disk, or durable), or another node's whose pool this
// node keeps (foreign: the image is a cache, downloaded again when
// missing). ok false: the record is not this node's to keep.
func (m *Manager) load(r store.Snapshot, snap Snapshot) (*entry, bool) {
	self := m.node()
	se := &entry{snap: snap, poolNode: r.KeepsPool(), foreign: r.Node != self}
	if se.foreign {
		if se.poolNode != self || snap.DurableAt == nil {
			return nil, false
		}
	}
	return se, true
}

// Snapshots of other nodes: a durable snapshot restores on any node (the
// cluster's placement sends a restore elsewhere when the snapshot's node
// is gone or cannot take it).

// ForeignSnapshots is what the store of a cluster node offers to find a
// snapshot recorded on another node: the project's snapshot id, whichever
// node took it; ErrNotFound if none.
type ForeignSnapshots interface {
	SnapshotAnywhere(ctx context.Context, projectID, id string) (store.Snapshot, error)
}

// foreignSnapshot is the project's durable snapshot id of another node.
func (m *Manager) foreignSnapshot(ctx context.Context, projectID, id string) (Snapshot, bool) {
	f, ok := m.cfg.Store.(ForeignSnapshots)
	if !ok || m.cfg.Images == nil {
		return Snapshot{}, false
	}
	row, err := f.SnapshotAnywhere(ctx, projectID, id)
	if err != nil {
		return Snapshot{}, false
	}
	var snap Snapshot
	if err := json.Unmarshal(row.Spec, &snap); err != nil || snap.ID != id || snap.ProjectID != projectID || snap.DurableAt == nil {
		return Snapshot{}, false
	}
	return snap, true
}

// restoreForeign starts a copy of another node's durable snapshot: its
// image is downloaded (every digest checked) for this restore and removed
// after it.
func (m *Manager) restoreForeign(ctx context.Context, snap Snapshot, timeoutMs int64) (sandbox.Record, error) {
	if err := os.MkdirAll(m.cfg.Dir, 0o700); err != nil {
		return sandbox.Record{}, err
	}
	dir, err := os.MkdirTemp(m.cfg.Dir, "restore-"+snap.ID+"-")
	if err != nil {
		return sandbox.Record{}, err
	}
	defer os.RemoveAll(dir)
	img := filepath.Join(dir, "image")
	if err := m.images.Materialize(ctx, images.SnapshotImageName(snap.ID), img); err != nil {
		return sandbox.Record{}, fmt.Errorf("restore snapshot %s: %w", snap.ID, err)
	}
	m.log.Info("restoring a snapshot of another node", "snapshot", snap.ID)
	return m.restore(ctx, snap, img, true, sandbox.CopyRequest{TimeoutMs: timeoutMs})
}
