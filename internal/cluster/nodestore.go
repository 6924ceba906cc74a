package cluster

import (
	"context"
	"fmt"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
)

// NodeStore is the store the sandbox service and the volume manager of a
// cluster node use: the shared database seen from this node. Sandbox writes
// are fenced by the node's incarnation and admitted cluster-wide; lists
// return this node's rows; snapshots and volumes are recorded on this node.
// Everything else (projects, keys, limits) passes through. The services
// above it are the single-node ones, unchanged.
type NodeStore struct {
	Database
	m   *Member
	cfg NodeStoreConfig
}

// NodeStoreConfig is what cluster admission checks a sandbox against.
type NodeStoreConfig struct {
	// Holding are the sandbox statuses that hold vCPUs and memory.
	Holding []string
	// The node's capacity (0: no limit).
	VCPUs        float64
	MemoryMB     int64
	MaxSandboxes int
	// Limits returns a project's limits; nil: none.
	Limits func(ctx context.Context, projectID string) (store.Limits, error)
}

// NewNodeStore is m's node's view of m's database.
func NewNodeStore(m *Member, cfg NodeStoreConfig) *NodeStore {
	return &NodeStore{Database: m.cfg.DB, m: m, cfg: cfg}
}

var _ store.Store = (*NodeStore)(nil)

// PutSandbox writes a sandbox row of this node, fenced, admitting it
// against the node's capacity and the project's limits cluster-wide when
// it newly holds resources. While the node's own lease has lapsed it
// refuses (ErrUnavailable): no lifecycle change without a current lease.
func (s *NodeStore) PutSandbox(ctx context.Context, sb store.Sandbox) error {
	if s.m.isLost(sb.ID) {
		return store.SandboxNotFound(sb.ID) // lost while this node was fenced
	}
	if !s.m.Healthy() {
		return s.m.unhealthy()
	}
	a := &store.Admission{Holding: s.cfg.Holding, NodeVCPUs: s.cfg.VCPUs, NodeMemoryMB: s.cfg.MemoryMB, MaxSandboxes: s.cfg.MaxSandboxes}
	if s.cfg.Limits != nil {
		l, err := s.cfg.Limits(ctx, sb.ProjectID)
		if err != nil {
			return s.m.storeError(store.Fence{}, fmt.Errorf("limits of project %s: %w", sb.ProjectID, err))
		}
		a.Limits = l
	}
	f := s.m.Fence()
	return s.m.storeError(f, s.Database.PutSandboxFenced(ctx, f, sb, a))
}

// DeleteSandbox removes a row of this node, fenced. The row of a sandbox
// lost while the node was fenced stays, so that clients are told it was
// lost.
func (s *NodeStore) DeleteSandbox(ctx context.Context, id string) error {
	if s.m.isLost(id) {
		return nil
	}
	f := s.m.Fence()
	return s.m.storeError(f, s.Database.DeleteSandboxFenced(ctx, f, id))
}

// Sandboxes lists this node's rows but the lost ones: recovery destroys
// the runtime sandboxes that have none.
func (s *NodeStore) Sandboxes(ctx context.Context) ([]store.Sandbox, error) {
	rows, err := s.Database.SandboxesOn(ctx, s.m.Self())
	if err != nil {
		return nil, err
	}
	out := rows[:0]
	for _, r := range rows {
		if r.Status != store.SandboxLost {
			out = append(out, r)
		}
	}
	return out, nil
}

// PutSnapshot records a snapshot on this node's disk.
func (s *NodeStore) PutSnapshot(ctx context.Context, sn store.Snapshot) error {
	sn.Node = s.m.Self()
	return s.m.storeError(store.Fence{}, s.Database.PutSnapshot(ctx, sn))
}

// Snapshots lists the snapshots on this node's disk.
func (s *NodeStore) Snapshots(ctx context.Context) ([]store.Snapshot, error) {
	all, err := s.Database.Snapshots(ctx)
	return mine(all, err, s.m.Self(), func(sn store.Snapshot) string { return sn.Node })
}

// InsertVolume records a volume on this node's disk.
func (s *NodeStore) InsertVolume(ctx context.Context, v store.Volume) error {
	v.Node = s.m.Self()
	return s.m.storeError(store.Fence{}, s.Database.InsertVolume(ctx, v))
}

// UpdateVolume replaces a volume's spec; the volume is on this node's
// disk (it moves here when this node attached another's).
func (s *NodeStore) UpdateVolume(ctx context.Context, v store.Volume) error {
	v.Node = s.m.Self()
	return s.m.storeError(store.Fence{}, s.Database.UpdateVolume(ctx, v))
}

// Volumes lists the volumes on this node's disk.
func (s *NodeStore) Volumes(ctx context.Context) ([]store.Volume, error) {
	all, err := s.Database.Volumes(ctx)
	return mine(all, err, s.m.Self(), func(v store.Volume) string { return v.Node })
}

// mine keeps the records of node.
func mine[T any](all []T, err error, node string, of func(T) string) ([]T, error) {
	if err != nil {
		return nil, err
	}
	out := []T{}
	for _, r := range all {
		if of(r) == node {
			out = append(out, r)
		}
	}
	return out, nil
}

// Orphan returns the row of the project's paused sandbox id when no live
// node holds it: it is orphaned (its node was declared dead, was removed or
// let it go), or its row is on this node, which took it over in a resume
// that failed (sandbox.Orphans). Anything else is ErrNotFound.
func (s *NodeStore) Orphan(ctx context.Context, projectID, id string) (store.Sandbox, error) {
	o, err := s.Database.SandboxOwner(ctx, id)
	if err != nil {
		return store.Sandbox{}, err
	}
	if o.ProjectID != projectID || o.Status != store.SandboxPaused || !o.Orphaned() && o.Node != s.m.Self() {
		return store.Sandbox{}, store.SandboxNotFound(id)
	}
	rows, err := s.Database.SandboxesOn(ctx, o.Node)
	if err != nil {
		return store.Sandbox{}, err
	}
	for _, r := range rows {
		if r.ID == id && r.Status == store.SandboxPaused {
			return r, nil
		}
	}
	return store.Sandbox{}, store.SandboxNotFound(id)
}

// ReleaseSandbox orphans a durable paused sandbox of this node, fenced, so
// that another node takes it over (sandbox.Releaser, drain --move).
func (s *NodeStore) ReleaseSandbox(ctx context.Context, id string) error {
	f := s.m.Fence()
	return s.m.storeError(f, s.Database.ReleaseSandbox(ctx, f, id))
}

// SnapshotAnywhere finds the project's snapshot id on any node
// (sandbox.ForeignSnapshots): a durable one restores anywhere.
func (s *NodeStore) SnapshotAnywhere(ctx context.Context, projectID, id string) (store.Snapshot, error) {
	all, err := s.Database.Snapshots(ctx)
	if err != nil {
		return store.Snapshot{}, err
	}
	for _, sn := range all {
		if sn.ID == id && sn.ProjectID == projectID {
			return sn, nil
		}
	}
	return store.Snapshot{}, fmt.Errorf("snapshot %q: %w", id, errdefs.ErrNotFound)
}

// Node is this node's name (sandbox.Pools).
func (s *NodeStore) Node() string { return s.m.Self() }

// AdoptPool makes this node keep snapshot id's warm copies, which node
// from keeps now; fenced (sandbox.Pools).
func (s *NodeStore) AdoptPool(ctx context.Context, id, from string) error {
	f := s.m.Fence()
	return s.m.storeError(f, s.Database.AdoptPool(ctx, f, id, from))
}

// AdoptedPools lists the snapshots of other nodes whose warm pools this
// node keeps (sandbox.Pools).
func (s *NodeStore) AdoptedPools(ctx context.Context) ([]store.Snapshot, error) {
	all, err := s.Database.Snapshots(ctx)
	if err != nil {
		return nil, err
	}
	out := []store.Snapshot{}
	for _, sn := range all {
		if sn.PoolNode == s.m.Self() && sn.Node != s.m.Self() {
			out = append(out, sn)
		}
	}
	return out, nil
}
