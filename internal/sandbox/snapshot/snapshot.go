// Package snapshot is the sandbox service's snapshots: a running sandbox
// saved — memory, processes, files — for new sandboxes to start from, with
// a warm pool of copies kept restored so that a restore is a claim; forks
// (a save and its copies at once); and, in a cluster, snapshots restored
// on other nodes than theirs and pools kept by another node (pools.go). It
// takes the sandbox core (internal/sandbox) through Core: the core
// checkpoints and starts copies and keeps the warm copies in its table;
// this package keeps the snapshot records in the store, their images in
// Config.Dir (durable in the object store through internal/sandbox/images)
// and the pools' sizes, under its own lock. Its callers are the two APIs
// (internal/api, internal/e2b), cluster mode (internal/cluster) and
// cmd/lizard, which wires it.
package snapshot

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/lizard-build/lizard/internal/disk"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/metrics"
	"github.com/lizard-build/lizard/internal/runtime"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/sandbox/images"
	"github.com/lizard-build/lizard/internal/store"
)

// Core is what snapshots need of the sandbox core (*sandbox.Service).
type Core interface {
	Get(projectID, id string) (sandbox.Record, error)
	Checkpoint(ctx context.Context, projectID, id, dir string) (sandbox.Saved, error)
	Copy(ctx context.Context, req sandbox.CopyRequest) (sandbox.Record, error)
	Claim(ctx context.Context, poolOf string, timeoutMs int64) (sandbox.Record, bool)
	Pooled(poolOf string) int
	Pools() map[string]int
	TrimPool(ctx context.Context, poolOf string, keep int)
	Admit(ctx context.Context, projectID string, cpus float64, memoryMB int64, n int) error
	FitsQuota(ctx context.Context, projectID string, cpus float64, memoryMB int64, n int) error
	Note(id, format string, args ...any)
	TemplateVersion(projectID, tplName, recorded string, fallback bool) (string, func(), error)
	KeepPools(keep func(poolOf string) bool)
	Recovered() <-chan struct{}
}

var _ Core = (*sandbox.Service)(nil)

// Config wires the snapshots.
type Config struct {
	Core    Core
	Runtime runtime.Runtime
	Store   store.Store
	// Dir holds the snapshot images (and forks' temporary ones).
	Dir string
	// Images keeps the images durable in an object store; nil: they live
	// only on this node's disk.
	Images images.Store
	// Disk refuses snapshots when the data directory's disk is low; nil:
	// no check.
	Disk *disk.Guard
	// Limits returns a project's limits (its snapshot count); nil: none.
	Limits func(ctx context.Context, projectID string) (store.Limits, error)
	// ProjectSnapshots counts a project's snapshots on every node
	// (cluster mode), for its snapshot limit; nil: this node's. Nodes
	// snapshotting at the same moment may both pass: the count is read,
	// not locked, across nodes.
	ProjectSnapshots func(ctx context.Context, projectID string) (int, error)
	// Observer is told of snapshots, restores and forks; nil: no one.
	Observer sandbox.Observer
	Logger   *slog.Logger
}

// Snapshot is a saved sandbox — memory, processes, files — that new
// sandboxes start from: what the save kept (sandbox.Saved) and the
// snapshot's own. Its JSON is the store's spec column.
type Snapshot struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"createdAt"`
	sandbox.Saved
	// PoolSize warm copies are kept restored, so that a restore is a claim.
	PoolSize   int  `json:"poolSize"`
	PoolPaused bool `json:"poolPaused,omitempty"`
	// DurableAt is when the image was made durable in the object store
	// (nil: only on this node's disk).
	DurableAt *time.Time `json:"durableAt,omitempty"`
}

// Info is a snapshot with its pool's state.
type Info struct {
	Snapshot
	ReadyCount int
}

// MaxPoolSize caps a snapshot's warm pool.
const MaxPoolSize = 10

// Operations as Config.Observer sees them.
const (
	opSnapshot = "snapshot"
	opRestore  = "restore"
	opFork     = "fork"
)

// Manager keeps the snapshots of a node. It is safe for concurrent use.
type Manager struct {
	cfg    Config
	log    *slog.Logger
	canCP  bool
	images *images.Jobs

	mu        sync.Mutex
	snapshots map[string]*entry
	pending   map[string]int // project → snapshots being taken
	// peers reaches other nodes' warm pools (pools.go).
	peers  PoolPeers
	closed bool
	bg     sync.WaitGroup
}

// entry is a live snapshot; the fields are guarded by Manager.mu.
type entry struct {
	snap    Snapshot
	filling bool
	gone    bool
	// poolNode keeps the warm copies ("" on a single server); foreign:
	// the snapshot is another node's, this one keeps its pool (pools.go).
	poolNode string
	foreign  bool
}

// New builds the snapshots. Call Recover before serving.
func New(cfg Config) *Manager {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	_, canCP := cfg.Runtime.(runtime.Checkpointer)
	return &Manager{cfg: cfg, log: cfg.Logger, canCP: canCP, images: images.New(cfg.Images, cfg.Logger),
		snapshots: map[string]*entry{}, pending: map[string]int{}}
}

// Close stops the pools' filling and the uploads; snapshots stay.
func (m *Manager) Close() {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	m.images.Close()
	m.bg.Wait()
}

func (m *Manager) observe(op string, start time.Time, err *error) {
	if m.cfg.Observer != nil {
		m.cfg.Observer.Operation(op, time.Since(start), *err)
	}
}

// checkpointer refuses feature on a runtime that cannot checkpoint.
func (m *Manager) checkpointer(feature string) error {
	if !m.canCP {
		return sandbox.NoCheckpoints(feature)
	}
	return nil
}

func (m *Manager) dir(id string) string { return filepath.Join(m.cfg.Dir, id) }

func notFound(id string) error {
	return errdefs.WithCode("snapshot_not_found", fmt.Errorf("snapshot %q: %w", id, errdefs.ErrNotFound))
}

func validPoolSize(n int) error {
	if n < 0 || n > MaxPoolSize {
		return fmt.Errorf("poolSize %d: must be 0 to %d: %w", n, MaxPoolSize, errdefs.ErrInvalid)
	}
	return nil
}

// Take saves project's running sandbox id as a snapshot; the sandbox keeps
// running (frozen for the moment of the save). The snapshot is ready when
// this returns.
func (m *Manager) Take(ctx context.Context, projectID, id, name string, poolSize int) (_ Info, err error) {
	defer m.observe(opSnapshot, time.Now(), &err)
	if err := m.checkpointer("snapshots"); err != nil {
		return Info{}, err
	}
	if err := validPoolSize(poolSize); err != nil {
		return Info{}, err
	}
	src, err := m.cfg.Core.Get(projectID, id)
	if err != nil {
		return Info{}, err
	}
	if err := m.cfg.Disk.Check(); err != nil {
		return Info{}, err
	}
	// The pool's copies will be of this sandbox: they must fit first.
	if src.VolumeID == "" {
		if err := m.cfg.Core.FitsQuota(ctx, projectID, src.CPUs, src.MemoryMB, poolSize); err != nil {
			return Info{}, fmt.Errorf("poolSize %d: %w", poolSize, err)
		}
	}
	release, err := m.reserve(ctx, projectID)
	if err != nil {
		return Info{}, err
	}
	defer release()
	snap := Snapshot{ID: store.NewID("snap_", 16), Name: name, PoolSize: poolSize}
	if snap.Saved, err = m.cfg.Core.Checkpoint(ctx, projectID, id, m.dir(snap.ID)); err != nil {
		os.RemoveAll(m.dir(snap.ID))
		return Info{}, err
	}
	snap.CreatedAt = time.Now().UTC()
	if snap.Name == "" {
		snap.Name = "Snapshot " + id
	}
	if err := m.put(context.WithoutCancel(ctx), snap); err != nil {
		os.RemoveAll(m.dir(snap.ID))
		return Info{}, err
	}
	se := &entry{snap: snap, poolNode: m.node()}
	m.mu.Lock()
	m.snapshots[snap.ID] = se
	m.mu.Unlock()
	release()
	m.log.Info("snapshot taken", "snapshot", snap.ID, "sandbox", id)
	m.cfg.Core.Note(id, "snapshot %s taken", snap.ID)
	m.makeDurable(se)
	m.fillPool(se)
	return m.info(se), nil
}

// reserve admits one more snapshot record of the project and holds its
// place until release.
func (m *Manager) reserve(ctx context.Context, project string) (release func(), err error) {
	var lim store.Limits
	if m.cfg.Limits != nil {
		if lim, err = m.cfg.Limits(ctx, project); err != nil {
			return nil, fmt.Errorf("limits of project %s: %w", project, err)
		}
	}
	everywhere := -1 // every node's, when the cluster counts them
	if lim.Snapshots > 0 && m.cfg.ProjectSnapshots != nil {
		if everywhere, err = m.cfg.ProjectSnapshots(ctx, project); err != nil {
			return nil, err
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	n := m.pending[project]
	if everywhere >= 0 {
		n += everywhere
	} else {
		for _, se := range m.snapshots {
			if se.snap.ProjectID == project && !se.gone && !se.foreign { // a foreign one is another node's record
				n++
			}
		}
	}
	if lim.Snapshots > 0 && n+1 > lim.Snapshots {
		return nil, store.LimitSnapshots.Exceeded(float64(n), float64(lim.Snapshots), 1)
	}
	m.pending[project]++
	var once sync.Once
	return func() {
		once.Do(func() {
			m.mu.Lock()
			defer m.mu.Unlock()
			if m.pending[project]--; m.pending[project] <= 0 {
				delete(m.pending, project)
			}
		})
	}, nil
}

func (m *Manager) put(ctx context.Context, snap Snapshot) error {
	spec, err := json.Marshal(snap)
	if err != nil {
		return err
	}
	return m.cfg.Store.PutSnapshot(ctx, store.Snapshot{ID: snap.ID, ProjectID: snap.ProjectID, Spec: spec, CreatedAt: snap.CreatedAt})
}

func (m *Manager) info(se *entry) Info {
	m.mu.Lock()
	snap := se.snap
	m.mu.Unlock()
	return Info{Snapshot: snap, ReadyCount: m.cfg.Core.Pooled(snap.ID)}
}

func (m *Manager) lookup(projectID, id string) (*entry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	se, ok := m.snapshots[id]
	if !ok || se.gone || se.snap.ProjectID != projectID {
		return nil, notFound(id)
	}
	return se, nil
}

// Get returns a snapshot of the project.
func (m *Manager) Get(projectID, id string) (Info, error) {
	se, err := m.lookup(projectID, id)
	if err != nil {
		return Info{}, err
	}
	return m.info(se), nil
}

// List lists the project's snapshots, oldest first.
func (m *Manager) List(projectID string) []Info {
	m.mu.Lock()
	var ses []*entry
	for _, se := range m.snapshots {
		if se.snap.ProjectID == projectID && !se.gone {
			ses = append(ses, se)
		}
	}
	m.mu.Unlock()
	sort.Slice(ses, func(i, j int) bool { return ses[i].snap.CreatedAt.Before(ses[j].snap.CreatedAt) })
	out := []Info{}
	for _, se := range ses {
		out = append(out, m.info(se))
	}
	return out
}

// Update changes the warm pool: its size, or whether it is paused (a
// paused pool releases its copies; the saved state stays).
func (m *Manager) Update(ctx context.Context, projectID, id string, poolSize *int, poolPaused *bool) (Info, error) {
	ctx, cancel := detach(ctx)
	defer cancel()
	se, err := m.lookup(projectID, id)
	if err != nil {
		return Info{}, err
	}
	if poolSize != nil {
		if err := validPoolSize(*poolSize); err != nil {
			return Info{}, err
		}
		m.mu.Lock()
		snap := se.snap
		m.mu.Unlock()
		if snap.VolumeID == "" {
			missing := *poolSize - m.cfg.Core.Pooled(snap.ID)
			if err := m.cfg.Core.FitsQuota(ctx, snap.ProjectID, snap.CPUs, snap.MemoryMB, missing); err != nil {
				return Info{}, fmt.Errorf("poolSize %d: %w", *poolSize, err)
			}
		}
	}
	m.mu.Lock()
	if poolSize != nil {
		se.snap.PoolSize = *poolSize
	}
	if poolPaused != nil {
		se.snap.PoolPaused = *poolPaused
	}
	snap := se.snap
	m.mu.Unlock()
	if err := m.put(ctx, snap); err != nil {
		return Info{}, err
	}
	m.trimPool(ctx, se)
	m.fillPool(se)
	return m.info(se), nil
}

// Delete releases the pool and removes the image. Sandboxes restored
// from it are independent and keep running.
func (m *Manager) Delete(ctx context.Context, projectID, id string) error {
	ctx, cancel := detach(ctx)
	defer cancel()
	se, err := m.lookup(projectID, id)
	if err != nil {
		return err
	}
	m.mu.Lock()
	poolNode, peers := se.poolNode, m.peers
	elsewhere := !m.poolHereLocked(se)
	m.mu.Unlock()
	if elsewhere && peers != nil {
		// Another node keeps its warm copies: they go first, so that a
		// node that cannot be reached leaves the snapshot whole.
		if err := peers.DropPool(ctx, poolNode, id); err != nil {
			return fmt.Errorf("delete snapshot %s: its warm pool on node %s: %w", id, poolNode, err)
		}
	}
	m.mu.Lock()
	se.gone = true
	delete(m.snapshots, id)
	m.mu.Unlock()
	m.trimPool(ctx, se)
	m.images.Drop(images.SnapshotImageName(id))
	if err := m.cfg.Store.DeleteSnapshot(ctx, id); err != nil {
		return err
	}
	m.log.Info("snapshot deleted", "snapshot", id)
	return os.RemoveAll(m.dir(id))
}

// trimPool destroys warm copies beyond the pool's size (all of them when
// the pool is paused, kept by another node or the snapshot gone).
func (m *Manager) trimPool(ctx context.Context, se *entry) {
	m.mu.Lock()
	keep, id := se.snap.PoolSize, se.snap.ID
	if se.snap.PoolPaused || se.gone || !m.poolHereLocked(se) {
		keep = 0
	}
	m.mu.Unlock()
	m.cfg.Core.TrimPool(ctx, id, keep)
}

// fillPool restores warm copies in the background until the pool is full.
func (m *Manager) fillPool(se *entry) {
	m.mu.Lock()
	if se.filling || m.closed {
		m.mu.Unlock()
		return
	}
	se.filling = true
	m.bg.Add(1)
	m.mu.Unlock()
	m.log.Debug("warm pool: filling", "snapshot", se.snap.ID)
	go func() {
		defer m.bg.Done()
		defer func() {
			m.mu.Lock()
			se.filling = false
			m.mu.Unlock()
			m.log.Debug("warm pool: filled", "snapshot", se.snap.ID)
		}()
		for {
			m.mu.Lock()
			snap, foreign := se.snap, se.foreign
			// A copy of a snapshot with a volume needs the volume: it cannot
			// wait in a pool.
			stop := m.closed || se.gone || snap.PoolPaused || snap.VolumeID != "" || !m.poolHereLocked(se)
			m.mu.Unlock()
			if stop || m.cfg.Core.Pooled(snap.ID) >= snap.PoolSize {
				return
			}
			_, err := m.restore(context.Background(), snap, m.dir(snap.ID), foreign, sandbox.CopyRequest{PoolOf: snap.ID})
			// The snapshot may have been deleted, or its pool shrunk or
			// paused, while this copy was being restored: the copy goes
			// then, it never outlives them (nor holds its place in the
			// project's quota for ever).
			m.trimPool(context.Background(), se)
			if err != nil {
				m.log.Warn("warm pool: restore failed; pool left short", "snapshot", snap.ID, "err", err)
				return
			}
		}
	}()
}

// restore starts a copy of snap (req's From, Dir, SnapshotID and Moved
// filled in) from the image in dir; when dir is the snapshot's own
// directory and holds no image (lost, or taken on another node), the
// image comes from the object store first. moved: the snapshot was taken
// on another node.
func (m *Manager) restore(ctx context.Context, snap Snapshot, dir string, moved bool, req sandbox.CopyRequest) (sandbox.Record, error) {
	if dir == m.dir(snap.ID) {
		if err := m.images.Materialize(ctx, images.SnapshotImageName(snap.ID), dir); err != nil {
			return sandbox.Record{}, fmt.Errorf("restore snapshot %s: %w", snap.ID, err)
		}
	}
	req.From, req.Dir, req.Moved = snap.Saved, dir, moved
	if req.SnapshotID == "" && !strings.HasPrefix(snap.ID, forkPrefix) {
		req.SnapshotID = snap.ID
	}
	rec, err := m.cfg.Core.Copy(ctx, req)
	if err != nil {
		return sandbox.Record{}, fmt.Errorf("snapshot %s: %w", snap.ID, err)
	}
	return rec, nil
}

// UsesRootfs reports whether a snapshot (or a pool's cache) of this node
// restores onto the template root filesystem rootfs, so that a template
// version is kept while it does.
func (m *Manager) UsesRootfs(rootfs string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, se := range m.snapshots {
		if se.snap.Rootfs == rootfs {
			return true
		}
	}
	return false
}

// Restore starts a new sandbox from a snapshot of the project: a warm copy
// when the pool has one, else a fresh restore.
func (m *Manager) Restore(ctx context.Context, projectID, snapID string, timeoutMs int64) (_ sandbox.Record, err error) {
	defer m.observe(opRestore, time.Now(), &err)
	if err := m.checkpointer("restoring snapshots"); err != nil {
		return sandbox.Record{}, err
	}
	if err := sandbox.ValidTimeout(timeoutMs); err != nil {
		return sandbox.Record{}, err
	}
	se, err := m.lookup(projectID, snapID)
	if errors.Is(err, errdefs.ErrNotFound) {
		if snap, ok := m.foreignSnapshot(ctx, projectID, snapID); ok {
			return m.restoreForeign(ctx, snap, timeoutMs)
		}
	}
	if err != nil {
		return sandbox.Record{}, err
	}
	if rec, ok := m.cfg.Core.Claim(ctx, snapID, timeoutMs); ok {
		m.fillPool(se)
		return rec, nil
	}
	m.mu.Lock()
	snap, foreign := se.snap, se.foreign
	m.mu.Unlock()
	return m.restore(ctx, snap, m.dir(snapID), foreign, sandbox.CopyRequest{TimeoutMs: timeoutMs})
}

// ForkResult is one copy of a fork: the new sandbox or why it failed.
type ForkResult struct {
	Sandbox *sandbox.Record
	Err     error
}

// MaxFork is the most copies one fork makes.
const MaxFork = 10

// CheckForkCount refuses a fork's count outside 1 to MaxFork
// (errdefs.ErrInvalid): for APIs that judge a request before looking its
// sandbox up.
func CheckForkCount(count int) error {
	if count < 1 || count > MaxFork {
		return fmt.Errorf("count %d: must be 1 to %d: %w", count, MaxFork, errdefs.ErrInvalid)
	}
	return nil
}

// forkPrefix names a fork's image (its copies are of no snapshot).
const forkPrefix = "fork_"

// Fork saves project's running sandbox id and restores count copies of
// it; the source keeps running. timeoutMs 0 gives each copy the source's
// lifetime. Copies that fail are reported in place, never dropped.
func (m *Manager) Fork(ctx context.Context, projectID, id string, count int, timeoutMs int64) (_ []ForkResult, err error) {
	defer m.observe(opFork, time.Now(), &err)
	if err := m.checkpointer("fork"); err != nil {
		return nil, err
	}
	if err := CheckForkCount(count); err != nil {
		return nil, err
	}
	if err := sandbox.ValidTimeout(timeoutMs); err != nil {
		return nil, err
	}
	src, err := m.cfg.Core.Get(projectID, id)
	if err != nil {
		return nil, err
	}
	if src.VolumeID != "" {
		return nil, errdefs.WithCode("sandbox_has_volume", fmt.Errorf("sandbox %q has volume %s attached; a volume is attached to one sandbox at a time, so it cannot be forked: %w", id, src.VolumeID, errdefs.ErrConflict))
	}
	// All the copies must fit before the checkpoint is made; each then
	// takes its own place as it is restored.
	if err := m.cfg.Core.Admit(ctx, projectID, src.CPUs, src.MemoryMB, count); err != nil {
		return nil, fmt.Errorf("fork of %d: %w", count, err)
	}
	if err := m.cfg.Disk.Check(); err != nil {
		return nil, err
	}
	snap := Snapshot{ID: store.NewID(forkPrefix, 16)}
	dir := filepath.Join(m.cfg.Dir, "forks", snap.ID)
	defer os.RemoveAll(dir)
	if snap.Saved, err = m.cfg.Core.Checkpoint(ctx, projectID, id, dir); err != nil {
		return nil, err
	}
	if timeoutMs == 0 {
		timeoutMs = snap.TimeoutMs
	}
	out := make([]ForkResult, count)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 4)
	for i := range out {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			r, err := m.restore(ctx, snap, dir, false, sandbox.CopyRequest{TimeoutMs: timeoutMs})
			if err != nil {
				out[i].Err = err
				return
			}
			out[i].Sandbox = &r
		}()
	}
	wg.Wait()
	var failed []string
	for _, r := range out {
		if r.Err != nil {
			failed = append(failed, r.Err.Error())
		}
	}
	m.log.Info("sandbox forked", "sandbox", id, "copies", count, "failed", len(failed), "errors", strings.Join(failed, "; "))
	m.cfg.Core.Note(id, "forked: %d copies, %d failed", count, len(failed))
	return out, nil
}

// makeDurable uploads snapshot se's image in the background and records
// when it is durable: in the store first, then in the snapshot the API
// shows, as a pause does (sandbox.makePauseDurable), so that a durableAt a
// caller sees survives the node.
func (m *Manager) makeDurable(se *entry) {
	m.mu.Lock()
	id := se.snap.ID
	m.mu.Unlock()
	m.images.MakeDurable(images.SnapshotImageName(id), m.dir(id), func(at time.Time) {
		m.mu.Lock()
		if se.gone {
			m.mu.Unlock()
			return
		}
		snap := se.snap
		m.mu.Unlock()
		snap.DurableAt = &at
		if err := m.put(context.Background(), snap); err != nil {
			m.log.Error("persist snapshot", "snapshot", id, "err", err)
			return
		}
		m.mu.Lock()
		if !se.gone {
			se.snap.DurableAt = &at
		}
		m.mu.Unlock()
	})
}

// Recover loads the snapshot records (this node's, and those of other
// nodes whose pools it keeps) and removes images that have none, and tells
// the core which warm copies to take back (Core.KeepPools: call it before
// the core's Recover); once the core has judged its sandboxes
// (Core.Recovered), every pool is trimmed and filled, in the background.
func (m *Manager) Recover(ctx context.Context) error {
	if m.cfg.Dir == "" {
		return nil
	}
	recs, err := m.cfg.Store.Snapshots(ctx)
	if err != nil {
		return err
	}
	if p, ok := m.cfg.Store.(Pools); ok {
		adopted, err := p.AdoptedPools(ctx)
		if err != nil {
			return err
		}
		recs = append(recs, adopted...)
	}
	known := map[string]bool{}
	for _, r := range recs {
		var snap Snapshot
		if err := json.Unmarshal(r.Spec, &snap); err != nil || snap.ID != r.ID {
			if r.Node != m.node() {
				continue // another node's record
			}
			m.log.Warn("recover: unreadable snapshot record, removing", "snapshot", r.ID)
			m.cfg.Store.DeleteSnapshot(ctx, r.ID)
			continue
		}
		se, ok := m.load(r, snap)
		if !ok {
			continue
		}
		if se.foreign {
			known[snap.ID] = true // a cache of another node's image
			m.mu.Lock()
			m.snapshots[snap.ID] = se
			m.mu.Unlock()
			continue
		}
		if _, err := os.Stat(filepath.Join(m.dir(snap.ID), runtime.ImageFile)); err != nil && (snap.DurableAt == nil || m.cfg.Images == nil) {
			m.log.Warn("recover: snapshot image missing, removing the snapshot", "snapshot", snap.ID)
			m.cfg.Store.DeleteSnapshot(ctx, r.ID)
			continue
		}
		known[snap.ID] = true
		if snap.Rootfs == "" {
			// A record of an older server: the template's current version.
			if rootfs, release, err := m.cfg.Core.TemplateVersion(snap.ProjectID, snap.Template, "", true); err == nil {
				release()
				snap.Rootfs = rootfs
				m.put(ctx, snap)
				se.snap = snap
			}
		}
		m.mu.Lock()
		m.snapshots[snap.ID] = se
		m.mu.Unlock()
		if snap.DurableAt == nil {
			m.makeDurable(se) // the server stopped before it was
		}
	}
	ents, _ := os.ReadDir(m.cfg.Dir)
	for _, e := range ents {
		if !known[e.Name()] {
			os.RemoveAll(filepath.Join(m.cfg.Dir, e.Name()))
		}
	}
	// The core's recovery takes back the warm copies of these snapshots
	// only; the others go with the sandboxes that did not survive.
	m.cfg.Core.KeepPools(func(poolOf string) bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		_, ok := m.snapshots[poolOf]
		return ok
	})
	m.mu.Lock()
	if !m.closed {
		m.bg.Add(1)
		go func() {
			defer m.bg.Done()
			m.settlePools(ctx)
		}()
	}
	m.mu.Unlock()
	return nil
}

// settlePools waits for the core's recovery, then trims and fills every
// pool.
func (m *Manager) settlePools(ctx context.Context) {
	select {
	case <-m.cfg.Core.Recovered():
	case <-ctx.Done():
		return
	}
	ctx = context.WithoutCancel(ctx)
	m.mu.Lock()
	var ses []*entry
	for _, se := range m.snapshots {
		ses = append(ses, se)
	}
	m.mu.Unlock()
	for _, se := range ses {
		m.trimPool(ctx, se)
		m.fillPool(se)
	}
}

// detach is the context of an operation that must run to its end whatever
// the client does (sandbox's lifecycle timeout).
func detach(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), sandbox.LifecycleTimeout)
}

// WarmPools is metrics.Inventory's pools: each snapshot that keeps a pool
// on this node (in a cluster another node may keep it), with its ready
// copies. A paused pool wants none.
func (m *Manager) WarmPools() []metrics.Pool {
	m.mu.Lock()
	var out []metrics.Pool
	var ids []string
	for id, se := range m.snapshots {
		if se.gone || se.snap.PoolSize == 0 || !m.poolHereLocked(se) {
			continue
		}
		p := metrics.Pool{Target: se.snap.PoolSize}
		if se.snap.PoolPaused {
			p.Target = 0
		}
		out = append(out, p)
		ids = append(ids, id)
	}
	m.mu.Unlock()
	for i, id := range ids {
		out[i].Ready = m.cfg.Core.Pooled(id)
	}
	return out
}
