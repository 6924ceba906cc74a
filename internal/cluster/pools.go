package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
)

// Warm pools across nodes (docs/CLUSTER.md): a snapshot's pool is kept by
// its pool node (store.Snapshot.KeepsPool), the snapshot's node until
// another adopts it. A node drained with --move hands its pools over
// (AdoptElsewhere); the pools of a node declared dead or removed are
// adopted by the node placement chooses for each (KeepPools). Requests
// follow: GET and PATCH of a snapshot go to its pool node, a restore
// claims a warm copy there when it has one, a DELETE goes to the
// snapshot's node, which drops the pool on the pool node (DropPool).

// PoolHost is what a node does for its peers' pools: adopt one here, or
// let one go (sandbox.Service).
type PoolHost interface {
	AdoptPool(ctx context.Context, projectID, id, from string) error
	DropPool(ctx context.Context, id string) error
}

// snapshotRow is the project's snapshot id as the database has it.
func (rt *Router) snapshotRow(ctx context.Context, projectID, id string) (store.Snapshot, bool) {
	sns, err := rt.cfg.Store.Snapshots(ctx)
	if err != nil {
		rt.log.Warn("cluster: cannot look the snapshot's node up; answering here", "err", err)
		return store.Snapshot{}, false
	}
	for _, sn := range sns {
		if sn.ID == id && sn.ProjectID == projectID {
			return sn, true
		}
	}
	return store.Snapshot{}, false
}

// snapshotTarget is the node that answers method on the project's
// snapshot id: its pool node for reads and pool changes, its own node for
// a delete (the image is there; it drops the pool), each falling back to
// the other when it cannot take requests. "" when no node has it.
func (rt *Router) snapshotTarget(ctx context.Context, projectID, id, method string) string {
	sn, ok := rt.snapshotRow(ctx, projectID, id)
	if !ok {
		return ""
	}
	first, then := sn.KeepsPool(), sn.Node
	if method == http.MethodDelete {
		first, then = then, first
	}
	if first == then || first == rt.cfg.Self {
		return first
	}
	if _, err := rt.peer(ctx, first); err != nil {
		return then
	}
	return first
}

// warmOn reports whether node keeps a warm copy of snapshot id ready (a
// sandbox row of its, pooled, of that snapshot).
func (rt *Router) warmOn(ctx context.Context, node, id string) bool {
	on, ok := rt.cfg.Directory.(interface {
		SandboxesOn(ctx context.Context, node string) ([]store.Sandbox, error)
	})
	if !ok {
		return false
	}
	rows, err := on.SandboxesOn(ctx, node)
	if err != nil {
		return false
	}
	for _, r := range rows {
		if r.Status != statusPooled {
			continue
		}
		var spec struct {
			PoolOf string `json:"poolOf"`
		}
		if json.Unmarshal(r.Spec, &spec) == nil && spec.PoolOf == id {
			return true
		}
	}
	return false
}

// statusPooled is the sandbox service's status of a warm copy.
const statusPooled = "pooled"

// poolFirst is the pool node of the project's snapshot id when a restore
// should go there first: another node than the snapshot's keeps the pool,
// takes requests and has a warm copy ready.
func (rt *Router) poolFirst(ctx context.Context, projectID, id string) *store.Node {
	sn, ok := rt.snapshotRow(ctx, projectID, id)
	if !ok || sn.KeepsPool() == sn.Node {
		return nil
	}
	n, err := rt.peer(ctx, sn.KeepsPool())
	if err != nil || !rt.warmOn(ctx, n.Name, id) {
		return nil
	}
	return n
}

// poolSpec is what pool placement reads of a snapshot's record.
type poolSpec struct {
	Template   string     `json:"template"`
	PoolSize   int        `json:"poolSize"`
	PoolPaused bool       `json:"poolPaused"`
	VolumeID   string     `json:"volumeId"`
	DurableAt  *time.Time `json:"durableAt"`
}

// movable reports whether sn has a warm pool that may move to another
// node: it has copies to keep, and its image is durable.
func (p poolSpec) movable() bool {
	return p.PoolSize > 0 && !p.PoolPaused && p.VolumeID == "" && p.DurableAt != nil
}

// poolCandidates orders the nodes that may adopt sn's pool: ready, not
// draining, of build (checkpoints restore only on their own build),
// holding its template, freest first; but skip. The order is the same on
// every node for the same view (seeded by the snapshot's id), so that the
// nodes agree on the adopter.
func poolCandidates(nodes []store.Node, sn store.Snapshot, p poolSpec, build, skip string) []store.Node {
	cands := slices.DeleteFunc(slices.Clone(nodes), func(n store.Node) bool { return n.RunscBuild != build || n.Name == skip })
	slices.SortFunc(cands, func(a, b store.Node) int { return cmpString(a.Name, b.Name) })
	h := fnv.New64a()
	h.Write([]byte(sn.ID))
	return Place(cands, Want{ProjectID: sn.ProjectID, Template: p.Template}, rand.New(rand.NewPCG(h.Sum64(), 0)))
}

// Orphaned pools are those whose pool node is declared dead, removed or
// no member at all.
func orphanedPools(nodes []store.Node, sns []store.Snapshot) []store.Snapshot {
	state := map[string]string{}
	for _, n := range nodes {
		state[n.Name] = n.State
	}
	var out []store.Snapshot
	for _, sn := range sns {
		var p poolSpec
		if json.Unmarshal(sn.Spec, &p) != nil || !p.movable() {
			continue
		}
		if st, ok := state[sn.KeepsPool()]; !ok || st == store.NodeDead || st == store.NodeRemoved {
			out = append(out, sn)
		}
	}
	return out
}

// buildOf is the runsc build of node name, or def when it is not known.
func buildOf(nodes []store.Node, name, def string) string {
	if i := slices.IndexFunc(nodes, func(n store.Node) bool { return n.Name == name }); i >= 0 && nodes[i].RunscBuild != "" {
		return nodes[i].RunscBuild
	}
	return def
}

// KeepPools adopts, every interval until ctx is done, the warm pools whose
// pool node was declared dead or removed and for which placement chooses
// this node (every node computes the same choice; the adoption is fenced,
// so of two nodes that disagree one wins).
func (rt *Router) KeepPools(ctx context.Context, interval time.Duration, host PoolHost) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
		rt.adoptOrphanedPools(ctx, host)
	}
}

// adoptOrphanedPools is one round of KeepPools.
func (rt *Router) adoptOrphanedPools(ctx context.Context, host PoolHost) {
	nodes, err := rt.cfg.Directory.Nodes(ctx)
	if err != nil {
		return
	}
	sns, err := rt.cfg.Store.Snapshots(ctx)
	if err != nil {
		return
	}
	self := buildOf(nodes, rt.cfg.Self, "")
	for _, sn := range orphanedPools(nodes, sns) {
		var p poolSpec
		json.Unmarshal(sn.Spec, &p)
		order := poolCandidates(nodes, sn, p, buildOf(nodes, sn.Node, self), "")
		if len(order) == 0 || order[0].Name != rt.cfg.Self {
			continue
		}
		from := sn.KeepsPool()
		if err := host.AdoptPool(ctx, sn.ProjectID, sn.ID, from); err != nil {
			rt.log.Warn("pools: adopting the warm pool of a lost node failed; retrying", "snapshot", sn.ID, "from", from, "err", err)
			continue
		}
		rt.log.Info("pools: adopted the warm pool of a lost node", "snapshot", sn.ID, "from", from)
	}
}

// AdoptElsewhere has another node adopt the warm pool this node keeps of
// the project's snapshot id (drain --move), chosen as KeepPools chooses;
// a node that answers 503 or cannot be dialled is skipped. It returns the
// adopter's name.
func (rt *Router) AdoptElsewhere(ctx context.Context, projectID, id string) (string, error) {
	sn, ok := rt.snapshotRow(ctx, projectID, id)
	if !ok {
		return "", fmt.Errorf("snapshot %s: %w", id, errdefs.ErrNotFound)
	}
	var p poolSpec
	if err := json.Unmarshal(sn.Spec, &p); err != nil {
		return "", err
	}
	rt.dropNodes()
	nodes, err := rt.nodes(ctx)
	if err != nil {
		return "", err
	}
	build := buildOf(nodes, rt.cfg.Self, "")
	order := poolCandidates(nodes, sn, p, build, rt.cfg.Self)
	if len(order) == 0 {
		return "", fmt.Errorf("snapshot %s: no other node takes its warm pool (ready, not draining, runsc build %s): %w", id, build, errdefs.ErrCapacity)
	}
	q := url.Values{"project": {projectID}, "from": {rt.cfg.Self}}
	var last error
	for _, n := range order {
		last = rt.internalCall(ctx, http.MethodPost, n, "/internal/v1/pools/"+url.PathEscape(id)+"/adopt?"+q.Encode(), createTimeout, nil)
		if last == nil {
			rt.log.Info("pools: warm pool handed over", "snapshot", id, "node", n.Name)
			return n.Name, nil
		}
		if !refused(last) {
			return "", last
		}
		rt.log.Info("pools: node refused the warm pool; trying the next", "snapshot", id, "node", n.Name, "err", last)
	}
	return "", last
}

// DropPool has node let the warm pool of snapshot id go (the snapshot is
// deleted; sandbox.PoolPeers). A node declared dead or removed holds
// nothing any more; one that cannot be reached is ErrUnavailable.
func (rt *Router) DropPool(ctx context.Context, node, id string) error {
	if node == rt.cfg.Self {
		return nil
	}
	n, err := rt.peer(ctx, node)
	if errors.Is(err, errNodeGone) {
		return nil
	}
	if err != nil {
		return err
	}
	return rt.internalCall(ctx, http.MethodPost, *n, "/internal/v1/pools/"+url.PathEscape(id)+"/drop", createTimeout, nil)
}

// servePool serves POST /internal/v1/pools/{id}/{op}: adopt or drop the
// warm pool here for a peer; errors as the API answers them.
func servePool(w http.ResponseWriter, r *http.Request, host PoolHost, log *slog.Logger) {
	if host == nil {
		http.Error(w, "this node keeps no warm pools for its peers", http.StatusNotFound)
		return
	}
	id := r.PathValue("id")
	var err error
	switch r.PathValue("op") {
	case "adopt":
		q := r.URL.Query()
		err = host.AdoptPool(r.Context(), q.Get("project"), id, q.Get("from"))
	case "drop":
		err = host.DropPool(r.Context(), id)
	default:
		http.Error(w, "unknown pool call "+r.PathValue("op"), http.StatusNotFound)
		return
	}
	if err != nil {
		writePeerError(w, r, log, err)
		return
	}
	w.WriteHeader(http.StatusOK)
}
