package api

import (
	"context"
	"net/http"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/sandbox/snapshot"
	"github.com/lizard-build/lizard/internal/sandbox/usage"
	"github.com/lizard-build/lizard/internal/volume"
)

// Cluster routes requests among the nodes of a cluster (internal/cluster
// implements it). Config.Cluster is nil on a single server, which then
// answers exactly as it would without it. The E2B control plane
// (internal/e2b) takes the same.
type Cluster interface {
	// Node is this node's name.
	Node() string
	// Forward answers r on the node that holds what ref names when that
	// is another node, and reports whether it did. It returns false, and
	// answers nothing, for what is on this node, unknown or another
	// project's (the handler answers as usual), and for a request a peer
	// forwarded. Its errors are for the caller to answer, classed for
	// StatusOf: a sandbox lost with its node is ErrNotFound with code
	// sandbox_lost naming the node; an owner that cannot be reached is
	// ErrUnavailable, with Retry-After set on w.
	Forward(w http.ResponseWriter, r *http.Request, projectID string, ref Ref) (bool, error)
	// Create runs a create on the node placement chooses: local() when
	// that is this node (local answers, or returns its error), else r
	// with body forwarded and its answer relayed. A node that refuses
	// with 503 (capacity, unavailable), or cannot be reached, is skipped
	// for the next candidate; when all refuse, the last refusal is the
	// answer. A request a peer forwarded is always local().
	Create(w http.ResponseWriter, r *http.Request, projectID string, want Placement, body []byte, local func() error) error
	// Sandboxes, Snapshots and Volumes list the project's on every node
	// that answers, each in the order a single server lists them.
	Sandboxes(ctx context.Context, projectID string) ([]NodeSandbox, error)
	Snapshots(ctx context.Context, projectID string) ([]snapshot.Info, error)
	Volumes(ctx context.Context, projectID string) ([]volume.Volume, error)
}

// RefKind is what a request's path names.
type RefKind int

const (
	RefNone     RefKind = iota
	RefSandbox          // {id}
	RefSnapshot         // {sid}
	RefVolume           // {vid}: an id or a name
)

// SandboxMissingHeader marks an answer that is a 404 because this node
// does not hold the sandbox (code sandbox_not_found), not because of
// something inside it: a node that forwarded the request to a cached owner
// follows the sandbox to its new owner (cluster.Router.Forward).
const SandboxMissingHeader = "X-Lizard-Sandbox-Missing"

// MarkMissing sets SandboxMissingHeader on w when err is a sandbox this
// node does not hold.
func MarkMissing(w http.ResponseWriter, err error) {
	if errdefs.Code(err) == "sandbox_not_found" {
		w.Header().Set(SandboxMissingHeader, "1")
	}
}

// Ref is the sandbox, snapshot or volume a request is about.
type Ref struct {
	Kind RefKind
	ID   string
}

// RefOf is what the matched route of r names: its {id} (a sandbox), {sid}
// (a snapshot) or {vid} (a volume).
func RefOf(r *http.Request) Ref {
	for _, p := range []struct {
		name string
		kind RefKind
	}{{"id", RefSandbox}, {"sid", RefSnapshot}, {"vid", RefVolume}} {
		if v := r.PathValue(p.name); v != "" {
			return Ref{Kind: p.kind, ID: v}
		}
	}
	return Ref{}
}

// Placement is what a create needs of the node it lands on.
type Placement struct {
	Template string // "" when restoring
	Snapshot string // restore: the snapshot's node
	Volume   string // id or name: the volume's node
}

// NodeSandbox is a sandbox of some node as a cluster-wide list has it,
// with its latest usage sample (nil before the first).
type NodeSandbox struct {
	Node   string
	Record sandbox.Record
	Usage  *usage.Sample
}

// forward routes r to another node in cluster mode when what it names is
// there; see Cluster.Forward.
func (s *server) forward(w http.ResponseWriter, r *http.Request, projectID string) (bool, error) {
	if s.cluster == nil {
		return false, nil
	}
	ref := RefOf(r)
	if ref.Kind == RefNone {
		return false, nil
	}
	return s.cluster.Forward(w, r, projectID, ref)
}

// localInfo is infoOf a sandbox of this node, naming the node in cluster
// mode.
func (s *server) localInfo(rec sandbox.Record) sandboxInfo {
	info := infoOf(rec)
	if s.cluster != nil {
		info.Node = s.cluster.Node()
	}
	return info
}
