package store

import (
	"fmt"
	"slices"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// Usage is what a set of sandbox rows holds: every live row counts toward
// the number of sandboxes; only rows in a holding status count their vCPUs
// and memory.
type Usage struct {
	Sandboxes int
	VCPUs     float64
	MemoryMB  int64
}

// Need is what writing sb adds to what is held, under a: a new row (old
// nil, or an old row that was lost or orphaned) is one more sandbox, and a row that
// enters a holding status from one that is not adds its vCPUs and memory.
func (a *Admission) Need(old *Sandbox, sb Sandbox) Usage {
	var u Usage
	fresh := old == nil || old.Status == SandboxLost || old.Node == Orphan
	if fresh {
		u.Sandboxes = 1
	}
	if a.holds(sb.Status) && (fresh || !a.holds(old.Status)) {
		u.VCPUs, u.MemoryMB = sb.CPUs, sb.MemoryMB
	}
	return u
}

func (a *Admission) holds(status string) bool { return slices.Contains(a.Holding, status) }

// Check decides whether need fits the node (which holds node) and the
// project (which holds proj cluster-wide): the project's limits first,
// then the node's capacity, with the refusals the single-node admission
// makes (internal/sandbox/admission.go).
func (a *Admission) Check(node, proj, need Usage) error {
	lim := a.Limits
	switch {
	case need.Sandboxes > 0 && lim.Sandboxes > 0 && proj.Sandboxes+need.Sandboxes > lim.Sandboxes:
		return LimitSandboxes.Exceeded(float64(proj.Sandboxes), float64(lim.Sandboxes), float64(need.Sandboxes))
	case need.VCPUs > 0 && lim.VCPUs > 0 && proj.VCPUs+need.VCPUs > float64(lim.VCPUs)+1e-9:
		return LimitVCPUs.Exceeded(proj.VCPUs, float64(lim.VCPUs), need.VCPUs)
	case need.MemoryMB > 0 && lim.MemoryGB > 0 && proj.MemoryMB+need.MemoryMB > int64(lim.MemoryGB)<<10:
		return LimitMemoryGB.Exceeded(gib(proj.MemoryMB), float64(lim.MemoryGB), gib(need.MemoryMB))
	}
	full := func(unit string, used, capacity, needs float64, show func(float64) string) error {
		return &errdefs.Exceeded{Unit: unit, Limit: capacity, InUse: used, Needed: needs,
			Err: fmt.Errorf("node capacity: %s %s of %s reserved, this needs %s; retry later: %w",
				unit, show(used), show(capacity), show(needs), errdefs.ErrCapacity)}
	}
	switch {
	case need.Sandboxes > 0 && a.MaxSandboxes > 0 && node.Sandboxes+need.Sandboxes > a.MaxSandboxes:
		return full("sandboxes", float64(node.Sandboxes), float64(a.MaxSandboxes), float64(need.Sandboxes), FormatAmount)
	case need.VCPUs > 0 && a.NodeVCPUs > 0 && node.VCPUs+need.VCPUs > a.NodeVCPUs+1e-9:
		return full("vcpu", node.VCPUs, a.NodeVCPUs, need.VCPUs, FormatAmount)
	case need.MemoryMB > 0 && a.NodeMemoryMB > 0 && node.MemoryMB+need.MemoryMB > a.NodeMemoryMB:
		return full("memory-gb", gib(node.MemoryMB), gib(a.NodeMemoryMB), gib(need.MemoryMB), FormatGiB)
	}
	return nil
}

func gib(mb int64) float64 { return float64(mb) / 1024 }

// FormatGiB shows an amount of GiB: "1.5 GiB".
func FormatGiB(gb float64) string { return FormatAmount(gb) + " GiB" }

// NodeState is the state Nodes reports for a node row: gone is "" or
// NodeDead or NodeRemoved, leaseLeft what its lease has left on the
// database's clock.
func NodeState(gone string, draining bool, leaseLeft time.Duration) string {
	switch {
	case gone != "":
		return gone
	case leaseLeft <= 0:
		return NodeSuspect
	case draining:
		return NodeDraining
	}
	return NodeReady
}

// NodeNotFound is the error for an unknown node name.
func NodeNotFound(name string) error { return fmt.Errorf("node %q: %w", name, errdefs.ErrNotFound) }

// Fenced is the error for a write by an incarnation that is not current.
func Fenced(f Fence) error {
	return fmt.Errorf("node %s incarnation %d: %w", f.Node, f.Incarnation, ErrFenced)
}

// SandboxElsewhere is the error for a fenced write of a sandbox whose row
// belongs to another node.
func SandboxElsewhere(id, node string) error {
	return fmt.Errorf("sandbox %s belongs to node %q: %w", id, node, errdefs.ErrConflict)
}

// NotReleasable is the error of a release of a sandbox that is not a
// paused, durable one of node.
func NotReleasable(id, node string) error {
	return fmt.Errorf("sandbox %s is not a paused sandbox of node %q whose image is durable: %w", id, node, errdefs.ErrConflict)
}

// NotAdoptable is the error of a pool adoption whose snapshot is gone or
// whose pool another node keeps than the adopter saw.
func NotAdoptable(id, from string) error {
	return fmt.Errorf("the warm pool of snapshot %s is not kept by node %q (any more): %w", id, from, errdefs.ErrConflict)
}

// SandboxNotFound is the error for an unknown sandbox id.
func SandboxNotFound(id string) error { return fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound) }

// Plus is u and v together.
func (u Usage) Plus(v Usage) Usage {
	return Usage{Sandboxes: u.Sandboxes + v.Sandboxes, VCPUs: u.VCPUs + v.VCPUs, MemoryMB: u.MemoryMB + v.MemoryMB}
}

// OldRow is what a fenced write under f of a sandbox replaces, from got
// (the zero or one rows of its id): nil for a new one, ErrConflict when the
// row belongs to another node. An orphaned row is taken over.
func OldRow(got []Sandbox, f Fence) (*Sandbox, error) {
	if len(got) == 0 {
		return nil, nil
	}
	if got[0].Node != f.Node && !(got[0].Node == Orphan && got[0].Status == SandboxPaused) {
		return nil, SandboxElsewhere(got[0].ID, got[0].Node)
	}
	return &got[0], nil
}
