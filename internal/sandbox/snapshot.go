package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/network"
	"github.com/lizard-build/lizard/internal/runtime"
	"github.com/lizard-build/lizard/internal/store"
)

// Snapshot is a saved sandbox — memory, processes, files — that new
// sandboxes start from.
type Snapshot struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	ProjectID string    `json:"projectId"`
	Region    string    `json:"region,omitempty"`
	SourceID  string    `json:"sourceId"`
	Template  string    `json:"template"`
	Size      string    `json:"size"`
	CPUs      float64   `json:"cpus"`
	MemoryMB  int64     `json:"memoryMb"`
	TimeoutMs int64     `json:"timeoutMs"`
	CreatedAt time.Time `json:"createdAt"`
	// PoolSize warm copies are kept restored, so that a restore is a claim.
	PoolSize   int  `json:"poolSize"`
	PoolPaused bool `json:"poolPaused,omitempty"`
	// AgentToken is the source's: every copy wakes up answering to it, until
	// it is given its own.
	AgentToken string            `json:"agentToken"`
	Envs       map[string]string `json:"envs,omitempty"`
	Metadata   map[string]string `json:"metadata,omitempty"`
	// Egress is the source's: copies may reach what it could.
	Egress network.Egress `json:"egress,omitempty"`
	// VolumeID is the volume the source had at /workspace; a restore
	// attaches it, and so needs it free.
	VolumeID string `json:"volumeId,omitempty"`
	// User and Workdir are the source's command defaults.
	User    string `json:"user,omitempty"`
	Workdir string `json:"workdir,omitempty"`
	// Rootfs is the template version the source ran on ("" from older
	// servers: the template's current version).
	Rootfs string `json:"rootfs,omitempty"`
	// E2B, Secure and PrivateTraffic are the source's E2B options: copies
	// get them with tokens of their own.
	E2B            bool `json:"e2b,omitempty"`
	Secure         bool `json:"secure,omitempty"`
	PrivateTraffic bool `json:"privateTraffic,omitempty"`
	// MaskHost is the source's E2B maskRequestHost (Record.MaskHost).
	MaskHost string `json:"maskRequestHost,omitempty"`
	// DurableAt is when the image was made durable in the object store
	// (nil: only on this node's disk).
	DurableAt *time.Time `json:"durableAt,omitempty"`
}

// SnapshotInfo is a snapshot with its pool's state.
type SnapshotInfo struct {
	Snapshot
	ReadyCount int
}

// MaxPoolSize caps a snapshot's warm pool.
const MaxPoolSize = 10

// snapEntry is a live snapshot; the fields are guarded by Service.mu.
type snapEntry struct {
	snap    Snapshot
	filling bool
	gone    bool
	// poolNode keeps the warm copies ("" on a single server); foreign:
	// the snapshot is another node's, this one keeps its pool (pools.go).
	poolNode string
	foreign  bool
}

func (s *Service) snapshotDir(id string) string { return filepath.Join(s.cfg.SnapshotDir, id) }

func snapNotFound(id string) error {
	return errdefs.WithCode("snapshot_not_found", fmt.Errorf("snapshot %q: %w", id, errdefs.ErrNotFound))
}

func validPoolSize(n int) error {
	if n < 0 || n > MaxPoolSize {
		return fmt.Errorf("poolSize %d: must be 0 to %d: %w", n, MaxPoolSize, errdefs.ErrInvalid)
	}
	return nil
}

// TakeSnapshot saves a running sandbox as a snapshot; the sandbox keeps
// running (frozen for the moment of the save). The snapshot is ready when
// this returns.
func (s *Service) TakeSnapshot(ctx context.Context, projectID, id, name string, poolSize int) (_ SnapshotInfo, err error) {
	defer s.observe(opSnapshot, time.Now(), &err)
	if err := s.checkpointer("snapshots"); err != nil {
		return SnapshotInfo{}, err
	}
	if err := validPoolSize(poolSize); err != nil {
		return SnapshotInfo{}, err
	}
	e, err := s.lookup(projectID, id)
	if err != nil {
		return SnapshotInfo{}, err
	}
	if err := s.cfg.Disk.Check(); err != nil {
		return SnapshotInfo{}, err
	}
	s.mu.Lock()
	// The pool's copies will be of this sandbox: they must fit first.
	like := Snapshot{ProjectID: e.rec.ProjectID, CPUs: e.rec.CPUs, MemoryMB: e.rec.MemoryMB, VolumeID: e.rec.VolumeID}
	s.mu.Unlock()
	if err := s.checkPool(ctx, like, poolSize); err != nil {
		return SnapshotInfo{}, err
	}
	release, err := s.reserveSnapshot(ctx, projectID)
	if err != nil {
		return SnapshotInfo{}, err
	}
	defer release()
	snap, err := s.save(ctx, e, s.snapshotDir, "snap_")
	if err != nil {
		return SnapshotInfo{}, err
	}
	if name == "" {
		name = "Snapshot " + id
	}
	snap.Name, snap.PoolSize = name, poolSize
	if err := s.putSnapshot(context.WithoutCancel(ctx), snap); err != nil {
		os.RemoveAll(s.snapshotDir(snap.ID))
		return SnapshotInfo{}, err
	}
	se := &snapEntry{snap: snap, poolNode: s.node()}
	s.mu.Lock()
	s.snapshots[snap.ID] = se
	s.mu.Unlock()
	release()
	s.log.Info("snapshot taken", "snapshot", snap.ID, "sandbox", id)
	s.logs.event(id, "snapshot %s taken", snap.ID)
	s.makeSnapshotDurable(se)
	s.fillPool(se)
	return s.snapshotInfo(se), nil
}

// save checkpoints e into dirOf(newID) and returns the snapshot's record
// (not yet stored).
func (s *Service) save(ctx context.Context, e *entry, dirOf func(string) string, prefix string) (Snapshot, error) {
	ctx, cancel := detach(ctx)
	defer cancel()
	e.mu.Lock()
	defer e.mu.Unlock()
	s.mu.Lock()
	rec, gone := e.rec, e.gone
	s.mu.Unlock()
	if gone {
		return Snapshot{}, NotFound(rec.ID)
	}
	if rec.Status != StatusRunning {
		return Snapshot{}, fmt.Errorf("sandbox %q is %s; only a running sandbox can be snapshotted: %w", rec.ID, rec.Status, errdefs.ErrConflict)
	}
	snap := Snapshot{
		ID: store.NewID(prefix, 16), ProjectID: rec.ProjectID, Region: rec.Region, SourceID: rec.ID,
		Template: rec.Template, Size: rec.Size, CPUs: rec.CPUs, MemoryMB: rec.MemoryMB,
		TimeoutMs: rec.TimeoutMs, CreatedAt: time.Now().UTC(), AgentToken: rec.AgentToken,
		Envs: rec.Envs, Metadata: rec.Metadata, Egress: rec.Egress, VolumeID: rec.VolumeID,
		User: rec.User, Workdir: rec.Workdir, Rootfs: rec.Rootfs,
		E2B: rec.E2B, Secure: rec.Secure, PrivateTraffic: rec.TrafficToken != "", MaskHost: rec.MaskHost,
	}
	start := time.Now()
	if err := s.cp.Snapshot(ctx, rec.ID, dirOf(snap.ID)); err != nil {
		return Snapshot{}, fmt.Errorf("snapshot sandbox %q: %w", rec.ID, err)
	}
	s.log.Debug("checkpoint written", "sandbox", rec.ID, "dir", dirOf(snap.ID), "took", time.Since(start))
	return snap, nil
}

func (s *Service) putSnapshot(ctx context.Context, snap Snapshot) error {
	spec, err := json.Marshal(snap)
	if err != nil {
		return err
	}
	return s.cfg.Store.PutSnapshot(ctx, store.Snapshot{ID: snap.ID, ProjectID: snap.ProjectID, Spec: spec, CreatedAt: snap.CreatedAt})
}

func (s *Service) snapshotInfo(se *snapEntry) SnapshotInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	info := SnapshotInfo{Snapshot: se.snap}
	for _, e := range s.sandboxes {
		if e.rec.PoolOf == se.snap.ID && e.rec.Status == StatusPooled && !e.gone {
			info.ReadyCount++
		}
	}
	return info
}

func (s *Service) lookupSnapshot(projectID, id string) (*snapEntry, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	se, ok := s.snapshots[id]
	if !ok || se.gone || se.snap.ProjectID != projectID {
		return nil, snapNotFound(id)
	}
	return se, nil
}

// GetSnapshot returns a snapshot of the project.
func (s *Service) GetSnapshot(projectID, id string) (SnapshotInfo, error) {
	se, err := s.lookupSnapshot(projectID, id)
	if err != nil {
		return SnapshotInfo{}, err
	}
	return s.snapshotInfo(se), nil
}

// Snapshots lists the project's snapshots, oldest first.
func (s *Service) Snapshots(projectID string) []SnapshotInfo {
	s.mu.Lock()
	var ses []*snapEntry
	for _, se := range s.snapshots {
		if se.snap.ProjectID == projectID && !se.gone {
			ses = append(ses, se)
		}
	}
	s.mu.Unlock()
	sort.Slice(ses, func(i, j int) bool { return ses[i].snap.CreatedAt.Before(ses[j].snap.CreatedAt) })
	out := []SnapshotInfo{}
	for _, se := range ses {
		out = append(out, s.snapshotInfo(se))
	}
	return out
}

// UpdateSnapshot changes the warm pool: its size, or whether it is paused
// (a paused pool releases its copies; the saved state stays).
func (s *Service) UpdateSnapshot(ctx context.Context, projectID, id string, poolSize *int, poolPaused *bool) (SnapshotInfo, error) {
	ctx, cancel := detach(ctx)
	defer cancel()
	se, err := s.lookupSnapshot(projectID, id)
	if err != nil {
		return SnapshotInfo{}, err
	}
	if poolSize != nil {
		if err := validPoolSize(*poolSize); err != nil {
			return SnapshotInfo{}, err
		}
		s.mu.Lock()
		snap := se.snap
		s.mu.Unlock()
		if err := s.checkPool(ctx, snap, *poolSize); err != nil {
			return SnapshotInfo{}, err
		}
	}
	s.mu.Lock()
	if poolSize != nil {
		se.snap.PoolSize = *poolSize
	}
	if poolPaused != nil {
		se.snap.PoolPaused = *poolPaused
	}
	snap := se.snap
	s.mu.Unlock()
	if err := s.putSnapshot(ctx, snap); err != nil {
		return SnapshotInfo{}, err
	}
	s.trimPool(ctx, se)
	s.fillPool(se)
	return s.snapshotInfo(se), nil
}

// DeleteSnapshot releases the pool and removes the image. Sandboxes
// restored from it are independent and keep running.
func (s *Service) DeleteSnapshot(ctx context.Context, projectID, id string) error {
	ctx, cancel := detach(ctx)
	defer cancel()
	se, err := s.lookupSnapshot(projectID, id)
	if err != nil {
		return err
	}
	s.mu.Lock()
	poolNode, peers := se.poolNode, s.poolPeers
	elsewhere := !s.poolHereLocked(se)
	s.mu.Unlock()
	if elsewhere && peers != nil {
		// Another node keeps its warm copies: they go first, so that a
		// node that cannot be reached leaves the snapshot whole.
		if err := peers.DropPool(ctx, poolNode, id); err != nil {
			return fmt.Errorf("delete snapshot %s: its warm pool on node %s: %w", id, poolNode, err)
		}
	}
	s.mu.Lock()
	se.gone = true
	delete(s.snapshots, id)
	s.mu.Unlock()
	s.trimPool(ctx, se)
	s.images.Drop(SnapshotImageName(id))
	if err := s.cfg.Store.DeleteSnapshot(ctx, id); err != nil {
		return err
	}
	s.log.Info("snapshot deleted", "snapshot", id)
	return os.RemoveAll(s.snapshotDir(id))
}

// pooled returns the ready warm copies of a snapshot.
func (s *Service) pooledLocked(snapID string) []*entry {
	var out []*entry
	for _, e := range s.sandboxes {
		if e.rec.PoolOf == snapID && e.rec.Status == StatusPooled && !e.gone {
			out = append(out, e)
		}
	}
	return out
}

// trimPool destroys warm copies beyond the pool's size (all of them when
// the pool is paused or the snapshot gone).
func (s *Service) trimPool(ctx context.Context, se *snapEntry) {
	s.mu.Lock()
	keep := se.snap.PoolSize
	if se.snap.PoolPaused || se.gone || !s.poolHereLocked(se) {
		keep = 0
	}
	extra := s.pooledLocked(se.snap.ID)
	if len(extra) > keep {
		extra = extra[keep:]
	} else {
		extra = nil
	}
	s.mu.Unlock()
	for _, e := range extra {
		e.mu.Lock()
		if s.take(e) {
			s.destroy(ctx, e.rec.ID)
		}
		e.mu.Unlock()
	}
}

// fillPool restores warm copies in the background until the pool is full.
func (s *Service) fillPool(se *snapEntry) {
	s.mu.Lock()
	if se.filling || s.closed {
		s.mu.Unlock()
		return
	}
	se.filling = true
	s.bg.Add(1)
	s.mu.Unlock()
	s.log.Debug("warm pool: filling", "snapshot", se.snap.ID)
	go func() {
		defer s.bg.Done()
		defer func() {
			s.mu.Lock()
			se.filling = false
			s.mu.Unlock()
			s.log.Debug("warm pool: filled", "snapshot", se.snap.ID)
		}()
		for {
			s.mu.Lock()
			snap, n := se.snap, len(s.pooledLocked(se.snap.ID))
			// A copy of a snapshot with a volume needs the volume: it cannot
			// wait in a pool.
			stop := s.closed || se.gone || snap.PoolPaused || n >= snap.PoolSize || snap.VolumeID != "" || !s.poolHereLocked(se)
			s.mu.Unlock()
			if stop {
				return
			}
			rec := s.copyRecord(snap, 0)
			rec.Status, rec.PoolOf = StatusPooled, snap.ID
			_, err := s.restoreCopy(context.Background(), rec, snap, s.snapshotDir(snap.ID), se.foreign)
			// The snapshot may have been deleted, or its pool shrunk or
			// paused, while this copy was being restored: the copy goes
			// then, it never outlives them (nor holds its place in the
			// project's quota for ever).
			s.trimPool(context.Background(), se)
			if err != nil {
				s.log.Warn("warm pool: restore failed; pool left short", "snapshot", snap.ID, "err", err)
				return
			}
		}
	}()
}

// copyRecord is the record of a new sandbox restored from snap.
func (s *Service) copyRecord(snap Snapshot, timeoutMs int64) Record {
	size, _ := LookupSize(snap.Size)
	rec := s.newRecord(snap.ProjectID, snap.Template, size, timeoutMs)
	rec.Envs, rec.Metadata, rec.SnapshotID, rec.Egress = snap.Envs, snap.Metadata, snap.ID, snap.Egress
	rec.User, rec.Workdir, rec.Rootfs = snap.User, snap.Workdir, snap.Rootfs
	rec.E2B, rec.Secure, rec.MaskHost = snap.E2B, snap.Secure, snap.MaskHost
	if snap.Secure {
		rec.EnvdToken = randomToken()
	}
	if snap.PrivateTraffic {
		rec.TrafficToken = randomToken()
	}
	return rec
}

// restoreCopy starts rec as a copy of the image in dir, on the template
// version the snapshot was taken on; moved: the snapshot was taken on
// another node (see hereRootfs).
func (s *Service) restoreCopy(ctx context.Context, rec Record, snap Snapshot, dir string, moved bool) (Record, error) {
	rootfs, release, err := s.hereRootfs(snap.ProjectID, snap.Template, snap.Rootfs, moved)
	if err != nil {
		return Record{}, fmt.Errorf("snapshot %s: %w", snap.ID, err)
	}
	defer release()
	rec.Rootfs = rootfs
	if dir == s.snapshotDir(snap.ID) {
		// Not on this node's disk (lost, or taken on another node): from
		// the object store.
		if err := s.images.Materialize(ctx, SnapshotImageName(snap.ID), dir); err != nil {
			return Record{}, fmt.Errorf("restore snapshot %s: %w", snap.ID, err)
		}
	}
	size, err := LookupSize(snap.Size)
	if err != nil {
		return Record{}, err
	}
	return s.launch(ctx, rec, func(ctx context.Context, rec *Record) (runtime.Sandbox, error) {
		mounts, err := s.attachVolume(ctx, rec, snap.VolumeID)
		if err != nil {
			return runtime.Sandbox{}, err
		}
		return s.cp.Restore(ctx, runtime.Spec{ID: rec.ID, Rootfs: rootfs, AgentToken: rec.AgentToken, Resources: size.resources(),
			Egress: rec.Egress, Mounts: s.mounts(snap.Template, mounts)}, dir)
	}, snap.AgentToken)
}

// UsesRootfs reports whether a sandbox or snapshot of the server runs on
// (or restores onto) the template root filesystem rootfs, so that a
// template version is kept while it does.
func (s *Service) UsesRootfs(rootfs string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.sandboxes {
		if e.rec.Rootfs == rootfs {
			return true
		}
	}
	for _, r := range s.launching {
		if r == rootfs {
			return true
		}
	}
	for _, rec := range s.recovering {
		if rec.Rootfs == rootfs {
			return true
		}
	}
	for _, se := range s.snapshots {
		if se.snap.Rootfs == rootfs {
			return true
		}
	}
	return s.pinned[filepath.Base(filepath.Dir(rootfs))] > 0
}

// Restore starts a new sandbox from a snapshot of the project: a warm copy
// when the pool has one, else a fresh restore.
func (s *Service) Restore(ctx context.Context, projectID, snapID string, timeoutMs int64) (_ Record, err error) {
	defer s.observe(opRestore, time.Now(), &err)
	if err := s.checkpointer("restoring snapshots"); err != nil {
		return Record{}, err
	}
	if err := validTimeout(timeoutMs); err != nil {
		return Record{}, err
	}
	se, err := s.lookupSnapshot(projectID, snapID)
	if errors.Is(err, errdefs.ErrNotFound) {
		if snap, ok := s.foreignSnapshot(ctx, projectID, snapID); ok {
			return s.restoreForeign(ctx, snap, timeoutMs)
		}
	}
	if err != nil {
		return Record{}, err
	}
	if rec, ok := s.claim(ctx, se, timeoutMs); ok {
		return rec, nil
	}
	s.mu.Lock()
	snap := se.snap
	s.mu.Unlock()
	return s.restoreCopy(ctx, s.copyRecord(snap, timeoutMs), snap, s.snapshotDir(snapID), se.foreign)
}

// claim hands out a warm copy, if the pool has one, and refills the pool.
func (s *Service) claim(ctx context.Context, se *snapEntry, timeoutMs int64) (Record, bool) {
	s.mu.Lock()
	pool := s.pooledLocked(se.snap.ID)
	s.mu.Unlock()
	for _, e := range pool {
		if !e.mu.TryLock() {
			continue
		}
		s.mu.Lock()
		if e.gone || e.rec.Status != StatusPooled {
			s.mu.Unlock()
			e.mu.Unlock()
			continue
		}
		now := time.Now().UTC()
		e.rec.Status, e.rec.PoolOf = StatusRunning, ""
		e.rec.StartedAt, e.rec.TimeoutMs, e.rec.EndAt = now, timeoutMs, deadline(now, timeoutMs)
		s.armLocked(e)
		rec := e.rec
		s.mu.Unlock()
		err := s.persist(ctx, rec)
		e.mu.Unlock()
		if err != nil {
			s.log.Error("persist claimed copy", "sandbox", rec.ID, "err", err)
		}
		s.emit(EventCreated, rec, causeOf(ctx), "snapshot "+se.snap.ID+" (a warm copy)")
		s.fillPool(se)
		return rec, true
	}
	return Record{}, false
}

// ForkResult is one copy of a fork: the new sandbox or why it failed.
type ForkResult struct {
	Sandbox *Record
	Err     error
}

// MaxFork is the most copies one fork makes.
const MaxFork = 10

// Fork snapshots a running sandbox and restores count copies of it; the
// source keeps running. timeoutMs 0 gives each copy the source's lifetime.
// Copies that fail are reported in place, never dropped.
func (s *Service) Fork(ctx context.Context, projectID, id string, count int, timeoutMs int64) (_ []ForkResult, err error) {
	defer s.observe(opFork, time.Now(), &err)
	if err := s.checkpointer("fork"); err != nil {
		return nil, err
	}
	if count < 1 || count > MaxFork {
		return nil, fmt.Errorf("count %d: must be 1 to %d: %w", count, MaxFork, errdefs.ErrInvalid)
	}
	if err := validTimeout(timeoutMs); err != nil {
		return nil, err
	}
	e, err := s.lookup(projectID, id)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	vol, need := e.rec.VolumeID, holds(StatusRunning, e.rec.CPUs, e.rec.MemoryMB).times(count)
	s.mu.Unlock()
	if vol != "" {
		return nil, errdefs.WithCode("sandbox_has_volume", fmt.Errorf("sandbox %q has volume %s attached; a volume is attached to one sandbox at a time, so it cannot be forked: %w", id, vol, errdefs.ErrConflict))
	}
	// All the copies must fit before the checkpoint is made; each then
	// takes its own place as it is restored (see launch).
	if err := s.admit(ctx, projectID, need); err != nil {
		return nil, fmt.Errorf("fork of %d: %w", count, err)
	}
	if err := s.cfg.Disk.Check(); err != nil {
		return nil, err
	}
	forkDir := func(snapID string) string { return filepath.Join(s.cfg.SnapshotDir, "forks", snapID) }
	snap, err := s.save(ctx, e, forkDir, "fork_")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(forkDir(snap.ID))
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
			rec := s.copyRecord(snap, timeoutMs)
			rec.SnapshotID = ""
			r, err := s.restoreCopy(ctx, rec, snap, forkDir(snap.ID), false)
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
	s.log.Info("sandbox forked", "sandbox", id, "copies", count, "failed", len(failed), "errors", strings.Join(failed, "; "))
	s.logs.event(id, "forked: %d copies, %d failed", count, len(failed))
	return out, nil
}
