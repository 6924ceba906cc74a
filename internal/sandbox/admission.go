package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/tracing"
	"github.com/lizard-build/lizard/internal/volume"
)

// Admission: every sandbox that comes into being (create, restore, fork
// copy, warm pool copy) and every resume is decided under s.mu against what
// the live sandboxes and the reservations of those being made hold, and
// the new one's reservation is recorded in the same critical section, so
// concurrent requests never overshoot a limit. What is held is derived
// from the live set (see holds): a sandbox that goes (kill, expiry, failed
// launch, death) or pauses frees its share at once, with no count to keep
// in step.

// Capacity is what the node admits: the vCPUs and memory that sandboxes
// that are not paused may reserve together (cores and RAM times the
// overcommit factors). 0 is no limit.
type Capacity struct {
	VCPUs    float64
	MemoryMB int64
}

// usage is what a set of sandboxes holds.
type usage struct {
	Sandboxes int
	VCPUs     float64
	MemoryMB  int64
}

func (u *usage) add(v usage) {
	u.Sandboxes += v.Sandboxes
	u.VCPUs += v.VCPUs
	u.MemoryMB += v.MemoryMB
}

func (u *usage) sub(v usage) {
	u.Sandboxes -= v.Sandboxes
	u.VCPUs -= v.VCPUs
	u.MemoryMB -= v.MemoryMB
}

// times is n sandboxes of u's size.
func (u usage) times(n int) usage {
	return usage{Sandboxes: u.Sandboxes * n, VCPUs: u.VCPUs * float64(n), MemoryMB: u.MemoryMB * int64(n)}
}

// holds is what a sandbox in status holds: every live sandbox counts
// toward the number of sandboxes (it keeps its disk, address and record);
// a paused one holds no CPU or memory until it resumes.
func holds(status string, cpus float64, memoryMB int64) usage {
	if status == StatusPaused {
		return usage{Sandboxes: 1}
	}
	return usage{Sandboxes: 1, VCPUs: cpus, MemoryMB: memoryMB}
}

// reservation is a sandbox being made: admitted, not yet live.
type reservation struct {
	project string
	need    usage
}

// usageLocked sums what the node and project hold. Caller holds s.mu.
func (s *Service) usageLocked(project string) (node, proj usage) {
	for _, e := range s.sandboxes {
		if e.gone {
			continue
		}
		u := holds(e.rec.Status, e.rec.CPUs, e.rec.MemoryMB)
		node.add(u)
		if e.rec.ProjectID == project {
			proj.add(u)
		}
	}
	for _, r := range s.pending {
		node.add(r.need)
		if r.project == project {
			proj.add(r.need)
		}
	}
	// Sandboxes recovery has yet to judge hold what their records say:
	// most of them come back.
	for _, rec := range s.recovering {
		u := holds(rec.Status, rec.CPUs, rec.MemoryMB)
		node.add(u)
		if rec.ProjectID == project {
			proj.add(u)
		}
	}
	return node, proj
}

// limits returns the project's limits; none without a Limits source, and
// none for no project (a template's warm copy: only the node's capacity
// admits it).
func (s *Service) limits(ctx context.Context, project string) (store.Limits, error) {
	if s.cfg.Limits == nil || project == "" {
		return store.Limits{}, nil
	}
	l, err := s.cfg.Limits(ctx, project)
	if err != nil {
		return store.Limits{}, fmt.Errorf("limits of project %s: %w", project, err)
	}
	return l, nil
}

// checkAdmit decides whether need fits: the project's quota first (429
// quota_exceeded), then the node's capacity (503 capacity). Cluster
// admission (store.Cluster.PutSandboxFenced) decides by the same rules.
func checkAdmit(lim store.Limits, node Capacity, maxSandboxes int, nodeUse, projUse, need usage) error {
	a := store.Admission{NodeVCPUs: node.VCPUs, NodeMemoryMB: node.MemoryMB, MaxSandboxes: maxSandboxes, Limits: lim}
	return a.Check(store.Usage(nodeUse), store.Usage(projUse), store.Usage(need))
}

// checkQuota decides whether need fits the project's limits.
func checkQuota(lim store.Limits, projUse, need usage) error {
	a := store.Admission{Limits: lim}
	return a.Check(store.Usage{}, store.Usage(projUse), store.Usage(need))
}

// quotaError is the refusal of needed more of limit to a project that
// uses used of max.
func quotaError(limit store.Limit, used, max, needed float64) error {
	return limit.Exceeded(used, max, needed)
}

func gib(mb int64) float64 { return float64(mb) / 1024 }

func fmtCPU(v float64) string { return store.FormatAmount(v) }

func fmtGiB(gb float64) string { return store.FormatGiB(gb) }

// admit decides, without reserving, whether n more sandboxes of rec's size
// would fit now: the early refusal of work that reserves later (a fork's
// copies, a start from a ready state).
func (s *Service) admit(ctx context.Context, project string, need usage) (err error) {
	ctx, span := tracing.Start(ctx, "admission", tracing.ProjectID.String(project))
	defer func() { tracing.End(span, err) }()
	lim, err := s.limits(ctx, project)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("server is shutting down: %w", errdefs.ErrUnavailable)
	}
	nodeUse, projUse := s.usageLocked(project)
	return checkAdmit(lim, s.cfg.Capacity, s.cfg.MaxSandboxes, nodeUse, projUse, need)
}

// reserve admits the sandbox rec is about to become and holds its share
// until release is called, which the launch does once the sandbox is live
// (or gone). The decision and the reservation are one critical section.
func (s *Service) reserve(ctx context.Context, rec Record) (release func(), err error) {
	ctx, span := tracing.Start(ctx, "admission", tracing.SandboxID.String(rec.ID), tracing.ProjectID.String(rec.ProjectID))
	defer func() { tracing.End(span, err) }()
	lim, err := s.limits(ctx, rec.ProjectID)
	if err != nil {
		return nil, err
	}
	need := holds(StatusRunning, rec.CPUs, rec.MemoryMB)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("server is shutting down: %w", errdefs.ErrUnavailable)
	}
	nodeUse, projUse := s.usageLocked(rec.ProjectID)
	if IsWarmKey(rec.PoolOf) {
		// A warm copy does not take the room a create made a copy
		// yield for (Create).
		nodeUse.add(s.yielding)
	}
	if err := checkAdmit(lim, s.cfg.Capacity, s.cfg.MaxSandboxes, nodeUse, projUse, need); err != nil {
		return nil, err
	}
	s.pending[rec.ID] = reservation{project: rec.ProjectID, need: need}
	return func() {
		s.mu.Lock()
		delete(s.pending, rec.ID)
		s.mu.Unlock()
	}, nil
}

// beginResume admits the CPU and memory a paused sandbox takes back and
// marks it resuming (which holds them) in the same critical section. The
// caller holds e.mu; a failed resume sets it paused again, which frees
// them.
func (s *Service) beginResume(ctx context.Context, e *entry) error {
	s.mu.Lock()
	project := e.rec.ProjectID
	s.mu.Unlock()
	lim, err := s.limits(ctx, project)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	nodeUse, projUse := s.usageLocked(project)
	need := holds(StatusRunning, e.rec.CPUs, e.rec.MemoryMB)
	need.Sandboxes = 0 // it is one already
	if err := checkAdmit(lim, s.cfg.Capacity, s.cfg.MaxSandboxes, nodeUse, projUse, need); err != nil {
		return fmt.Errorf("resume sandbox %q: %w", e.rec.ID, err)
	}
	e.rec.Status = StatusResuming
	return nil
}

// Usage is what a project holds, for the operator.
type Usage struct {
	Sandboxes int     `json:"sandboxes"`
	VCPUs     float64 `json:"vcpus"`
	MemoryMB  int64   `json:"memoryMb"`
	VolumeGB  int     `json:"volumeGb"`
	Snapshots int     `json:"snapshots"`
}

// StoredUsage computes each project's usage from the records in the store
// (what `lizard projects ls` shows without a server to ask), by the same
// rules as admission.
func StoredUsage(ctx context.Context, st store.Store) (map[string]Usage, error) {
	out := map[string]Usage{}
	sbs, err := st.Sandboxes(ctx)
	if err != nil {
		return nil, err
	}
	for _, sb := range sbs {
		var rec Record
		if sb.Status == store.SandboxLost || json.Unmarshal(sb.Spec, &rec) != nil {
			continue // lost with its cluster node: holds nothing
		}
		h := holds(sb.Status, rec.CPUs, rec.MemoryMB)
		u := out[sb.ProjectID]
		u.Sandboxes += h.Sandboxes
		u.VCPUs += h.VCPUs
		u.MemoryMB += h.MemoryMB
		out[sb.ProjectID] = u
	}
	sns, err := st.Snapshots(ctx)
	if err != nil {
		return nil, err
	}
	for _, sn := range sns {
		u := out[sn.ProjectID]
		u.Snapshots++
		out[sn.ProjectID] = u
	}
	vols, err := st.Volumes(ctx)
	if err != nil {
		return nil, err
	}
	for _, r := range vols {
		var v volume.Volume
		if err := json.Unmarshal(r.Spec, &v); err != nil {
			continue
		}
		u := out[r.ProjectID]
		u.VolumeGB += v.SizeGB
		out[r.ProjectID] = u
	}
	return out, nil
}

// refused reports whether err is an admission's refusal (quota, capacity,
// disk) rather than a failure of the work.
func refused(err error) bool {
	return errors.Is(err, errdefs.ErrQuota) || errors.Is(err, errdefs.ErrCapacity) || errors.Is(err, errdefs.ErrNoSpace)
}

// Reserved is what the node's sandboxes hold now, those being made
// included: the vCPUs and memory admission counts (metrics.Reservations).
func (s *Service) Reserved() (cpus float64, memoryMB int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	node, _ := s.usageLocked("")
	return node.VCPUs, node.MemoryMB
}
