package store

import (
	"context"
	"errors"
	"time"
)

// Cluster is the part of the store that lets several servers on one
// database act as one service (cluster mode, docs/CLUSTER.md). The database
// is the coordination service: each node owns a row with a lease on the
// database's clock and an incarnation number, and every write a node makes
// about its sandboxes is fenced by that incarnation, so a node declared dead
// cannot overwrite anything when it comes back.
//
// Both backends implement it and pass the same conformance suite
// (storetest.RunCluster); only PostgreSQL is shared by several servers in
// practice.
type Cluster interface {
	// RegisterNode inserts node info.Name, or takes over its row (a
	// restart, or a dead or removed node rejoining), with a new
	// incarnation, a lease of lease from the database's now, state ready
	// (draining is kept across a restart) and info. It returns the fence
	// every later write of this incarnation carries.
	RegisterNode(ctx context.Context, info NodeInfo, lease time.Duration) (Fence, error)
	// Heartbeat renews f's lease to the database's now + lease and
	// records info. It is ErrFenced when f.Incarnation is no longer the
	// node's (another process registered the name) or the node was
	// declared dead or removed.
	Heartbeat(ctx context.Context, f Fence, info NodeInfo, lease time.Duration) error
	// Nodes lists every node, by name, with its state derived from the
	// lease on the database's clock and its reservations summed from
	// its sandbox rows.
	Nodes(ctx context.Context) ([]Node, error)
	// SetDraining sets or clears a node's draining flag (no new
	// placements); clearing it clears Moving too. An unknown node is
	// ErrNotFound.
	SetDraining(ctx context.Context, name string, draining bool) error
	// SetMoving asks node name to move its sandboxes to other nodes
	// (move true: draining too), or says it is done (false: draining
	// stays). An unknown node is ErrNotFound.
	SetMoving(ctx context.Context, name string, move bool) error
	// ReleaseSandbox orphans a paused sandbox of node f.Node whose image
	// is durable, so that another node may take it over (a move). A row
	// of another node, not paused or not durable is ErrConflict; f no
	// longer current, ErrFenced.
	ReleaseSandbox(ctx context.Context, f Fence, id string) error
	// AdoptPool makes node f.Node keep the warm copies of snapshot id
	// (its pool node), if f is current (else ErrFenced) and the node
	// that keeps them now (Snapshot.KeepsPool) is from: of two nodes
	// adopting a pool at once one wins, the other gets ErrConflict, as
	// does an unknown snapshot.
	AdoptPool(ctx context.Context, f Fence, id, from string) error
	// DeclareDead marks a node dead when its lease has lapsed for at
	// least after on the database's clock, and marks every sandbox row on
	// it lost but the durable paused ones, which it orphans (Orphan), in
	// one transaction. It reports whether it did.
	DeclareDead(ctx context.Context, name string, after time.Duration) (bool, error)
	// RemoveNode marks a node removed (dead for good, whatever its lease)
	// and its sandboxes lost but the durable paused ones, which it
	// orphans, in one transaction. An unknown node is ErrNotFound.
	RemoveNode(ctx context.Context, name string) error

	// PutSandboxFenced inserts or updates sb on node f.Node (sb.Node is
	// set to it) if f is still the node's current incarnation and the
	// node is neither dead nor removed (else ErrFenced); a row of the same
	// id on another node is ErrConflict. An orphaned row (node "") is
	// taken over: it moves to f's node and is admitted there as a new
	// sandbox; of two nodes taking it at once one wins, the other gets
	// ErrConflict. With admit non-nil and a row that
	// newly holds resources (new, or its old status not in admit.Holding
	// and its new one in it), the node's capacity and the project's
	// limits are checked cluster-wide in the same transaction, with the
	// node and project rows locked. Refusals are *errdefs.Exceeded, as the
	// single-node admission (internal/sandbox/admission.go) makes them:
	// over a project limit wraps errdefs.ErrQuota (Limit.Exceeded), over
	// the node's capacity errdefs.ErrCapacity.
	PutSandboxFenced(ctx context.Context, f Fence, sb Sandbox, admit *Admission) error
	// DeleteSandboxFenced removes a sandbox row of node f.Node if f is
	// current (else ErrFenced); a missing row is not an error.
	DeleteSandboxFenced(ctx context.Context, f Fence, id string) error
	// SandboxesOn lists the sandbox rows of one node, lost ones included.
	SandboxesOn(ctx context.Context, node string) ([]Sandbox, error)
	// SandboxOwner says which node holds a sandbox and whether it was
	// lost with it. An unknown id is ErrNotFound.
	SandboxOwner(ctx context.Context, id string) (Owner, error)
}

// Node states as Nodes reports them.
const (
	NodeReady    = "ready"    // lease current, takes new sandboxes
	NodeDraining = "draining" // lease current, takes no new sandboxes
	NodeSuspect  = "suspect"  // lease lapsed: no new work, its sandboxes answer a retryable 503
	NodeDead     = "dead"     // declared dead: its sandboxes were lost
	NodeRemoved  = "removed"  // removed by an operator: its sandboxes were lost
)

// SandboxLost is the status of a sandbox row whose node was declared dead
// or removed while it ran.
const SandboxLost = "lost"

// A paused sandbox whose image is durable in the object store (its spec
// has DurableKey) survives its node: when the node is declared dead or
// removed its row stays paused and is orphaned, its node set to Orphan, and
// whichever node resumes it takes the row over (PutSandboxFenced).
const (
	Orphan     = ""
	DurableKey = "durableAt"
)

// NotReserving are the statuses of live sandbox rows that hold no vCPUs or
// memory (what Nodes sums as reserved skips them, with lost rows): paused,
// as the single-node admission counts (a sandbox being paused still holds
// its memory until it is paused).
var NotReserving = []string{SandboxPaused}

// SandboxPaused is the status of a paused sandbox's row (the sandbox
// service's own word).
const SandboxPaused = "paused"

// NodeInfo is what a node reports of itself when it registers and on each
// heartbeat.
type NodeInfo struct {
	Name string
	// Address is host:port of the node's internal listener as its peers
	// dial it (--advertise).
	Address string
	// RunscBuild names the runtime build; checkpoints restore only on
	// nodes of the same build.
	RunscBuild string
	// VCPUs and MemoryMB are what the node's sandboxes may reserve (its
	// capacity after overcommit; 0: no limit).
	VCPUs    float64
	MemoryMB int64
	// MaxSandboxes caps the live sandboxes on the node.
	MaxSandboxes int
	// Templates are the templates the node can start sandboxes from, as
	// "project/name" for a project's own and "name" for built-ins.
	Templates []string
}

// Node is a member of the cluster as Nodes lists it.
type Node struct {
	NodeInfo
	Incarnation int64
	State       string // one of the Node* states
	Draining    bool
	// Moving: asked to move its sandboxes away (drain --move), not done.
	Moving bool
	// Reserved by its sandbox rows that hold resources (not paused, not
	// lost), and how many live sandbox rows it has.
	ReservedVCPUs    float64
	ReservedMemoryMB int64
	Sandboxes        int
	// Heartbeat is when the lease was last renewed; LeaseLeft is how long
	// it has left on the database's clock (negative once lapsed).
	Heartbeat time.Time
	LeaseLeft time.Duration
	JoinedAt  time.Time
}

// Fence identifies one incarnation of a node: the proof a write is made by
// the node's current process.
type Fence struct {
	Node        string
	Incarnation int64
}

// Owner is where a sandbox lives.
type Owner struct {
	Node      string
	ProjectID string
	Status    string
	Template  string // what a node resuming it must hold
	Lost      bool   // its node was declared dead or removed while it lived
}

// Orphaned reports whether the sandbox has no node: it is paused, durable,
// and any node may resume it.
func (o Owner) Orphaned() bool { return o.Node == Orphan && o.Status == SandboxPaused }

// Admission is what PutSandboxFenced checks a sandbox that newly holds
// resources against.
type Admission struct {
	// Holding are the statuses whose sandboxes hold their vCPUs and
	// memory (a paused one holds neither).
	Holding []string
	// Node's capacity: 0 is no limit.
	NodeVCPUs    float64
	NodeMemoryMB int64
	MaxSandboxes int
	// Project's limits, cluster-wide; a 0 field is no limit.
	Limits Limits
}

// ErrFenced is returned for a write by a node incarnation that is no longer
// current: the node was declared dead or another process took its name.
var ErrFenced = errors.New("node incarnation is no longer current")
