package sandbox

import (
	"context"
	"fmt"
	"maps"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/network"
	"github.com/lizard-build/lizard/internal/runtime"
)

// Copies: the seam of the features that save sandboxes and start new ones
// from what they saved (internal/sandbox/snapshot: snapshots, their warm
// pools and forks). The core checkpoints a running sandbox into a
// directory the feature names (Checkpoint) and starts a copy from such a
// directory (Copy); warm copies waiting in a pool are live sandboxes of
// status pooled, which the core keeps in its table (admission counts them,
// recovery reattaches them) and hands out (Claim) or destroys (TrimPool)
// when the feature says. What a feature keeps of its own (the snapshot
// records, the images, the pools' sizes) it keeps itself.

// Saved is what a checkpoint of a sandbox keeps besides its files: the
// settings every copy of it starts with. Its JSON is the snapshot
// record's (internal/sandbox/snapshot embeds it).
type Saved struct {
	ProjectID string  `json:"projectId"`
	Region    string  `json:"region,omitempty"`
	SourceID  string  `json:"sourceId"`
	Template  string  `json:"template"`
	Size      string  `json:"size"`
	CPUs      float64 `json:"cpus"`
	MemoryMB  int64   `json:"memoryMb"`
	TimeoutMs int64   `json:"timeoutMs"`
	// AgentToken is the source's: every copy wakes up answering to it, until
	// it is given its own.
	AgentToken string            `json:"agentToken"`
	Envs       map[string]string `json:"envs,omitempty"`
	Metadata   map[string]string `json:"metadata,omitempty"`
	// Egress is the source's: copies may reach what it could.
	Egress network.Egress `json:"egress,omitempty"`
	// VolumeID is the volume the source had at /workspace; a copy
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
}

// Checkpoint saves project's running sandbox id — memory, processes, files
// — into dir, under its lifecycle lock; the sandbox keeps running (frozen
// for the moment of the save). Only a running sandbox can be saved
// (ErrConflict otherwise).
func (s *Service) Checkpoint(ctx context.Context, projectID, id, dir string) (Saved, error) {
	if err := s.checkpointer("snapshots"); err != nil {
		return Saved{}, err
	}
	e, err := s.lookup(projectID, id)
	if err != nil {
		return Saved{}, err
	}
	ctx, cancel := detach(ctx)
	defer cancel()
	e.mu.Lock()
	defer e.mu.Unlock()
	s.mu.Lock()
	rec, gone := e.rec.clone(), e.gone
	s.mu.Unlock()
	if gone {
		return Saved{}, NotFound(rec.ID)
	}
	if rec.Status != StatusRunning {
		return Saved{}, fmt.Errorf("sandbox %q is %s; only a running sandbox can be snapshotted: %w", rec.ID, rec.Status, errdefs.ErrConflict)
	}
	start := time.Now()
	if err := s.cp.Snapshot(ctx, rec.ID, dir); err != nil {
		return Saved{}, fmt.Errorf("snapshot sandbox %q: %w", rec.ID, err)
	}
	s.log.Debug("checkpoint written", "sandbox", rec.ID, "dir", dir, "took", time.Since(start))
	return Saved{
		ProjectID: rec.ProjectID, Region: rec.Region, SourceID: rec.ID,
		Template: rec.Template, Size: rec.Size, CPUs: rec.CPUs, MemoryMB: rec.MemoryMB,
		TimeoutMs: rec.TimeoutMs, AgentToken: rec.AgentToken,
		Envs: rec.Envs, Metadata: rec.Metadata, Egress: rec.Egress, VolumeID: rec.VolumeID,
		User: rec.User, Workdir: rec.Workdir, Rootfs: rec.Rootfs,
		E2B: rec.E2B, Secure: rec.Secure, PrivateTraffic: rec.TrafficToken != "", MaskHost: rec.MaskHost,
	}, nil
}

// CopyRequest is a new sandbox started from a checkpoint.
type CopyRequest struct {
	From Saved
	// Dir holds the checkpoint's files (on this node's disk).
	Dir string
	// Moved: the checkpoint was made on another node, so the template
	// version it ran on may have to be brought here (see hereRootfs).
	Moved bool
	// TimeoutMs is the copy's lifetime (0: none).
	TimeoutMs int64
	// SnapshotID names the snapshot the copy is of ("" for a fork);
	// PoolOf makes it a warm copy of that snapshot (status pooled) that
	// waits for Claim.
	SnapshotID, PoolOf string
}

// Copy starts a new sandbox from the checkpoint in req.Dir: a new id,
// agent token and address, the source's settings, on the template version
// the source ran on. It is admitted as any new sandbox, and made live or
// removed whole.
func (s *Service) Copy(ctx context.Context, req CopyRequest) (Record, error) {
	if err := s.checkpointer("restoring snapshots"); err != nil {
		return Record{}, err
	}
	if err := ValidTimeout(req.TimeoutMs); err != nil {
		return Record{}, err
	}
	from := req.From
	size, err := LookupSize(from.Size)
	if err != nil {
		return Record{}, err
	}
	rootfs, release, err := s.hereRootfs(from.ProjectID, from.Template, from.Rootfs, req.Moved)
	if err != nil {
		return Record{}, err
	}
	defer release()
	rec := s.newRecord(from.ProjectID, from.Template, size, req.TimeoutMs)
	rec.Envs, rec.Metadata, rec.Egress = maps.Clone(from.Envs), maps.Clone(from.Metadata), from.Egress
	rec.User, rec.Workdir, rec.Rootfs = from.User, from.Workdir, rootfs
	rec.E2B, rec.Secure, rec.MaskHost = from.E2B, from.Secure, from.MaskHost
	rec.SnapshotID = req.SnapshotID
	if req.PoolOf != "" {
		rec.Status, rec.PoolOf = StatusPooled, req.PoolOf
	}
	if from.Secure {
		rec.EnvdToken = randomToken()
	}
	if from.PrivateTraffic {
		rec.TrafficToken = randomToken()
	}
	return s.launch(ctx, rec, func(ctx context.Context, rec *Record) (runtime.Sandbox, error) {
		mounts, err := s.attachVolume(ctx, rec, from.VolumeID)
		if err != nil {
			return runtime.Sandbox{}, err
		}
		return s.cp.Restore(ctx, runtime.Spec{ID: rec.ID, Rootfs: rootfs, AgentToken: rec.AgentToken, Resources: size.resources(),
			Egress: rec.Egress, Mounts: s.mounts(from.Template, mounts)}, req.Dir)
	}, from.AgentToken)
}

// Claim hands out a warm copy of poolOf, if one waits: it becomes the
// project's running sandbox with a deadline of timeoutMs from now.
func (s *Service) Claim(ctx context.Context, poolOf string, timeoutMs int64) (Record, bool) {
	s.mu.Lock()
	pool := s.pooledLocked(poolOf)
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
		rec := e.rec.clone()
		s.mu.Unlock()
		err := s.persist(ctx, rec)
		e.mu.Unlock()
		if err != nil {
			s.log.Error("persist claimed copy", "sandbox", rec.ID, "err", err)
		}
		s.emit(EventCreated, rec, causeOf(ctx), "snapshot "+poolOf+" (a warm copy)")
		return rec, true
	}
	return Record{}, false
}

// Pooled counts the warm copies of poolOf that wait.
func (s *Service) Pooled(poolOf string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pooledLocked(poolOf))
}

// Pools counts the warm copies that wait, by what they are copies of.
func (s *Service) Pools() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int{}
	for _, e := range s.sandboxes {
		// PoolOf "": a copy being claimed.
		if e.rec.Status == StatusPooled && !e.gone && e.rec.PoolOf != "" {
			out[e.rec.PoolOf]++
		}
	}
	return out
}

// pooledLocked returns the warm copies of poolOf that wait. Caller holds
// s.mu.
func (s *Service) pooledLocked(poolOf string) []*entry {
	var out []*entry
	for _, e := range s.sandboxes {
		if e.rec.PoolOf == poolOf && e.rec.Status == StatusPooled && !e.gone {
			out = append(out, e)
		}
	}
	return out
}

// TrimPool destroys the warm copies of poolOf beyond keep (all of them
// for 0).
func (s *Service) TrimPool(ctx context.Context, poolOf string, keep int) {
	s.mu.Lock()
	extra := s.pooledLocked(poolOf)
	if len(extra) > keep {
		extra = extra[max(keep, 0):]
	} else {
		extra = nil
	}
	s.mu.Unlock()
	for _, e := range extra {
		e.mu.Lock()
		// A create or restore may have claimed it while this waited.
		s.mu.Lock()
		still, id := e.rec.Status == StatusPooled && e.rec.PoolOf == poolOf, e.rec.ID
		s.mu.Unlock()
		if still && s.take(e) {
			s.destroy(ctx, id)
		}
		e.mu.Unlock()
	}
}

// Admit decides, without reserving, whether n more running sandboxes of
// cpus and memoryMB would fit the project's limits and the node now: the
// early refusal of work that reserves each later (a fork's copies).
func (s *Service) Admit(ctx context.Context, projectID string, cpus float64, memoryMB int64, n int) error {
	return s.admit(ctx, projectID, holds(StatusRunning, cpus, memoryMB).times(n))
}

// FitsQuota refuses n more warm copies of cpus and memoryMB that would take
// the project over its limits: copies count as the sandboxes they are.
func (s *Service) FitsQuota(ctx context.Context, projectID string, cpus float64, memoryMB int64, n int) error {
	if n <= 0 {
		return nil
	}
	lim, err := s.limits(ctx, projectID)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, projUse := s.usageLocked(projectID)
	return checkQuota(lim, projUse, holds(StatusPooled, cpus, memoryMB).times(n))
}

// Note adds a lifecycle line to sandbox id's log.
func (s *Service) Note(id, format string, args ...any) { s.logs.event(id, format, args...) }

// TemplateVersion returns this node's path of the template version
// recorded as rootfs for project's template tplName, brought here if need
// be and kept from pruning until release (see hereRootfs); fallback takes
// the template's current version when no node has the recorded one.
func (s *Service) TemplateVersion(projectID, tplName, recorded string, fallback bool) (rootfs string, release func(), err error) {
	return s.hereRootfs(projectID, tplName, recorded, fallback)
}

// KeepPools tells recovery which warm copies to take back: those of a
// pool keep answers true for (called with the table unlocked); the others
// are destroyed with the sandboxes that did not survive. A feature that
// keeps pools sets it before Recover; without it every warm copy is taken
// back.
func (s *Service) KeepPools(keep func(poolOf string) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keepPool = keep
}

// Recovered is closed once Recover has judged every sandbox it found
// (reattached or destroyed; unresponsive ones are kept and judged later):
// features that keep warm copies settle their pools then.
func (s *Service) Recovered() <-chan struct{} { return s.recovered }
