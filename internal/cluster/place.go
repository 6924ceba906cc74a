package cluster

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/lizard-build/lizard/internal/api"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/template"
	"github.com/lizard-build/lizard/internal/tracing"
)

// K is how many candidates placement samples before taking the freest
// (best-of-K: near the best choice, without every create going to the
// same node between two refreshes of the reservations).
const K = 2

// Want is what a new sandbox needs of its node.
type Want struct {
	ProjectID string
	Template  string // "": the default template, on every node
	// Near is the node that holds what the sandbox starts from (a durable
	// snapshot's image, which any other node downloads first): it is
	// always among the sampled candidates, and counts LocalityWeight
	// freer than it is.
	Near string
}

// LocalityWeight is what starting where the data is is worth against
// free capacity: a restore goes to the snapshot's node unless another
// node sampled has more than this fraction of its capacity more free (a
// download of the image then costs less than crowding the node: six
// restores of one snapshot spread over a cluster's idle nodes).
const LocalityWeight = 0.25

// Place orders the nodes a create may go to: those ready (lease current,
// not draining) that hold the template (all ready ones when none lists
// it: the chosen node then answers for the name), the
// freest of K sampled at random (and want.Near, weighted) first, then the
// other sampled, then the rest, freest first. Nodes at or over their capacity come last: they
// refuse, and the next is tried.
func Place(nodes []store.Node, want Want, rnd *rand.Rand) []store.Node {
	var ready, holding []store.Node
	for _, n := range nodes {
		if n.State != store.NodeReady || n.Draining {
			continue
		}
		ready = append(ready, n)
		if holds(n, want) {
			holding = append(holding, n)
		}
	}
	cands := holding
	if len(cands) == 0 {
		cands = ready
	}
	if len(cands) == 0 {
		return nil
	}
	rnd.Shuffle(len(cands), func(i, j int) { cands[i], cands[j] = cands[j], cands[i] })
	k := min(K, len(cands))
	if i := slices.IndexFunc(cands, func(n store.Node) bool { return n.Name == want.Near }); i >= 0 {
		// The near node competes with K others.
		cands[0], cands[i] = cands[i], cands[0]
		k = min(K+1, len(cands))
	}
	score := func(n store.Node) float64 {
		if n.Name == want.Near {
			return free(n) + LocalityWeight
		}
		return free(n)
	}
	byFree := func(a, b store.Node) int { return cmp.Compare(score(b), score(a)) }
	// Stable sorts keep the random order among equals.
	slices.SortStableFunc(cands[:k], byFree)
	slices.SortStableFunc(cands[k:], byFree)
	return cands
}

// holds reports whether n has the template want names: the project's
// own of that name, or the built-in one (aliases resolved).
func holds(n store.Node, want Want) bool {
	if want.Template == "" {
		return true
	}
	return slices.Contains(n.Templates, want.ProjectID+"/"+want.Template) || slices.Contains(n.Templates, template.Resolve(want.Template))
}

// free is the fraction of n's capacity left: the least of its vCPUs,
// memory and sandbox slots (a capacity of 0 is no limit).
func free(n store.Node) float64 {
	f := 1.0
	if n.VCPUs > 0 {
		f = min(f, 1-n.ReservedVCPUs/n.VCPUs)
	}
	if n.MemoryMB > 0 {
		f = min(f, 1-float64(n.ReservedMemoryMB)/float64(n.MemoryMB))
	}
	if n.MaxSandboxes > 0 {
		f = min(f, 1-float64(n.Sandboxes)/float64(n.MaxSandboxes))
	}
	return f
}

// createTimeout bounds a create sent to a peer: a boot, or a restore of a
// large image, with room to spare.
const createTimeout = 5 * time.Minute

// maxRefusal bounds the body of a refusal kept to answer when every node
// refuses.
const maxRefusal = 64 << 10

// refusal is a peer's 503 to a create.
type refusal struct {
	status int
	header http.Header
	body   []byte
}

// Create runs a create on the node placement chooses (see api.Cluster):
// a restore on the snapshot's node, a create with a volume on the
// volume's (draining or not: its freshest copy is there; with an object
// store, any node once that node is gone: its last sync is fetched), others
// on the nodes Place orders. A node that answers 503 (no capacity, lease
// lapsed, database unreachable) or cannot be dialled is skipped; any other
// answer is the client's.
func (rt *Router) Create(w http.ResponseWriter, r *http.Request, projectID string, want api.Placement, body []byte, local func() error) error {
	ctx := r.Context()
	if Forwarded(ctx) {
		return local()
	}
	nodes, err := rt.nodes(ctx)
	if err != nil {
		// The database is unreachable: this node answers (a create
		// needs the database; it says so).
		rt.log.Warn("placement: nodes unknown; creating here", "err", err)
		return local()
	}
	order, err := rt.candidates(ctx, nodes, projectID, want)
	if err != nil {
		if errdefs.Code(err) == codeNodeUnavailable {
			w.Header().Set("Retry-After", fmt.Sprint(retryAfterSecs))
		}
		return err
	}
	if order == nil {
		// The snapshot or volume is unknown, or this node holds it.
		return local()
	}
	var (
		last    *refusal
		lastErr error
	)
	for _, n := range order {
		if n.Name == rt.cfg.Self {
			err := local()
			if err == nil || !refused(err) {
				return err
			}
			rt.log.Info("placement: this node refused; trying the next", "err", err)
			last, lastErr = nil, err
			continue
		}
		ref, err := rt.createOn(w, r, n, body)
		if err != nil {
			rt.log.Warn("placement: node unreachable; trying the next", "node", n.Name, "err", err)
			last, lastErr = nil, errdefs.WithCode(codeNodeUnavailable, fmt.Errorf("node %q cannot be reached: %w", n.Name, errdefs.ErrUnavailable))
			continue
		}
		if ref == nil {
			return nil // answered
		}
		rt.log.Info("placement: node refused; trying the next", "node", n.Name, "status", ref.status)
		last, lastErr = ref, nil
	}
	if last != nil {
		copyHeader(w.Header(), last.header)
		w.WriteHeader(last.status)
		w.Write(last.body)
		return nil
	}
	if errdefs.Code(lastErr) == codeNodeUnavailable {
		w.Header().Set("Retry-After", fmt.Sprint(retryAfterSecs))
	}
	return lastErr
}

// candidates orders the nodes for a create; nil (no error) leaves it to
// this node.
func (rt *Router) candidates(ctx context.Context, nodes []store.Node, projectID string, want api.Placement) ([]store.Node, error) {
	pinned := ""
	switch {
	case want.Snapshot != "":
		if pinned = rt.snapshotNode(ctx, projectID, want.Snapshot); pinned == "" {
			return nil, nil
		}
	case want.Volume != "":
		if pinned = rt.volumeNode(ctx, projectID, want.Volume); pinned == "" {
			return nil, nil
		}
		if rt.movable(ctx, pinned) {
			pinned = "" // its last sync, in the object store: any node
		}
	}
	var warm []store.Node
	if want.Snapshot != "" {
		// A warm copy on the node that keeps the pool is claimed there;
		// else the restore is cold, as below.
		if n := rt.poolFirst(ctx, projectID, want.Snapshot); n != nil {
			warm = []store.Node{*n}
		}
	}
	if want.Snapshot != "" && pinned != "" && rt.spreads(ctx, projectID, want.Snapshot) {
		if warm == nil && rt.warmOn(ctx, pinned, want.Snapshot) {
			// The snapshot's node keeps its pool: a warm copy there.
			if n, err := rt.peer(ctx, pinned); err == nil && n.State == store.NodeReady && !n.Draining {
				warm = []store.Node{*n}
			}
		}
		return rt.spread(nodes, projectID, want, pinned, warm)
	}
	if pinned == rt.cfg.Self && warm == nil {
		return nil, nil
	}
	cands := slices.Clone(nodes)
	if pinned != "" {
		n, err := rt.peer(ctx, pinned)
		if err == nil {
			return append(warm, *n), nil
		}
		if want.Snapshot == "" || !rt.snapshotDurable(ctx, projectID, want.Snapshot) {
			return nil, err
		}
		// A durable snapshot whose node cannot take it restores on any
		// node of that node's runsc build.
		i := slices.IndexFunc(nodes, func(n store.Node) bool { return n.Name == pinned })
		if i < 0 {
			return nil, err
		}
		build := nodes[i].RunscBuild
		cands = slices.DeleteFunc(cands, func(n store.Node) bool { return n.RunscBuild != build })
		rt.log.Info("placement: the snapshot's node cannot take it; restoring from the object store elsewhere", "snapshot", want.Snapshot, "node", pinned, "why", err)
	}
	rt.mu.Lock()
	order := Place(cands, Want{ProjectID: projectID, Template: want.Template}, rt.rnd)
	rt.mu.Unlock()
	if len(order) == 0 && warm == nil {
		return nil, fmt.Errorf("no node of the cluster takes new sandboxes now (none ready and not draining): %w", errdefs.ErrCapacity)
	}
	return append(warm, slices.DeleteFunc(order, func(n store.Node) bool { return warm != nil && n.Name == warm[0].Name })...), nil
}

// spreads reports whether a restore of the project's snapshot id may go
// to any node: its image is durable and it holds no volume (whose copy
// needs the volume where it is).
func (rt *Router) spreads(ctx context.Context, projectID, id string) bool {
	sn, ok := rt.snapshotRow(ctx, projectID, id)
	if !ok {
		return false
	}
	var spec poolSpec
	if json.Unmarshal(sn.Spec, &spec) != nil {
		return false
	}
	return spec.DurableAt != nil && spec.VolumeID == ""
}

// spread orders the nodes for a restore of a durable snapshot of node
// near: a warm copy first, then the ready nodes of near's runsc build (a
// checkpoint restores only on its own build), near weighted for its
// locality (Want.Near), so that restores of one snapshot spread by load.
func (rt *Router) spread(nodes []store.Node, projectID string, want api.Placement, near string, warm []store.Node) ([]store.Node, error) {
	i := slices.IndexFunc(nodes, func(n store.Node) bool { return n.Name == near })
	cands := slices.Clone(nodes)
	if i >= 0 {
		build := nodes[i].RunscBuild
		cands = slices.DeleteFunc(cands, func(n store.Node) bool { return n.RunscBuild != build })
	}
	rt.mu.Lock()
	order := Place(cands, Want{ProjectID: projectID, Template: want.Template, Near: near}, rt.rnd)
	rt.mu.Unlock()
	if len(order) == 0 && warm == nil {
		return nil, fmt.Errorf("no node of the cluster takes new sandboxes now (none ready and not draining): %w", errdefs.ErrCapacity)
	}
	if len(order) > 0 && order[0].Name != near {
		rt.log.Info("placement: restoring a durable snapshot on a freer node than its own", "snapshot", want.Snapshot, "node", order[0].Name, "snapshotNode", near)
	}
	return append(warm, slices.DeleteFunc(order, func(n store.Node) bool { return warm != nil && n.Name == warm[0].Name })...), nil
}

// createOn sends the create to node n. It answers the client and returns
// nil unless n refused with 503 (the refusal is returned, nothing is
// answered) or could not be dialled (an error: nothing reached n). Any
// other failure after the request went out is answered as a 503: the
// node may have made the sandbox, so no other node is tried.
func (rt *Router) createOn(w http.ResponseWriter, r *http.Request, n store.Node, body []byte) (*refusal, error) {
	ctx, cancel := context.WithTimeout(r.Context(), createTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, r.Method, "http://"+n.Address+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	copyHeader(req.Header, r.Header)
	req.Host = r.Host
	if id := w.Header().Get(api.RequestIDHeader); id != "" {
		req.Header.Set(api.RequestIDHeader, id)
	}
	ctx, span := tracing.StartClient(ctx, "forward create", tracing.Node.String(n.Name), semconv.ServerAddress(n.Address))
	req = req.WithContext(ctx)
	tracing.Inject(ctx, req.Header)
	rt.cfg.Signer.sign(req, kindAPI)
	resp, err := rt.client.Do(req)
	if err == nil {
		span.SetAttributes(semconv.HTTPResponseStatusCode(resp.StatusCode))
	}
	defer tracing.End(span, err)
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			return nil, err
		}
		rt.log.Warn("placement: create sent, answer lost", "node", n.Name, "err", err)
		w.Header().Set("Retry-After", fmt.Sprint(retryAfterSecs))
		http.Error(w, "the node chosen for this sandbox did not answer", http.StatusServiceUnavailable)
		return nil, nil
	}
	defer resp.Body.Close()
	resp.Header.Del(api.RequestIDHeader)
	if resp.StatusCode == http.StatusServiceUnavailable {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, maxRefusal))
		resp.Header.Del("Content-Length")
		return &refusal{status: resp.StatusCode, header: resp.Header, body: b}, nil
	}
	copyHeader(w.Header(), resp.Header)
	w.WriteHeader(resp.StatusCode)
	io.Copy(w, resp.Body)
	return nil, nil
}

// hopHeaders are the headers of one connection, not copied between the
// client's and the peer's.
var hopHeaders = []string{"Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Proxy-Connection",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// copyHeader adds src's end-to-end headers to dst.
func copyHeader(dst, src http.Header) {
	for k, vs := range src {
		if slices.Contains(hopHeaders, k) {
			continue
		}
		for _, v := range vs {
			dst.Add(k, v)
		}
	}
}

// placeOrphan chooses the node for a change (a POST: resume, connect) of
// an orphaned sandbox of the project — paused, durable, its node gone — as
// a create is placed: among the ready nodes of this node's runsc build (a
// checkpoint restores only on its own build) that hold its template. It
// returns nil when this node is the choice, or for anything else (reads
// and deletes of an orphan are answered by any node from its row).
func (rt *Router) placeOrphan(r *http.Request, projectID string, ref api.Ref) *store.Node {
	if ref.Kind != api.RefSandbox || r.Method != http.MethodPost {
		return nil
	}
	ctx := r.Context()
	if strings.HasSuffix(r.URL.Path, "/resume") || strings.HasSuffix(r.URL.Path, "/connect") {
		// The sandbox may have been let go (drain --move) since its
		// owner was cached: sent to that node, draining, the resume
		// would take it back there. Ask the database.
		rt.dropOwner(ref.ID)
	}
	o, err := rt.owner(ctx, ref.ID) // an orphan is never cached
	if err != nil || !o.Orphaned() || o.ProjectID != projectID {
		return nil
	}
	nodes, err := rt.nodes(ctx)
	if err != nil {
		return nil
	}
	build := ""
	for _, n := range nodes {
		if n.Name == rt.cfg.Self {
			build = n.RunscBuild
		}
	}
	same := nodes[:0:0]
	for _, n := range nodes {
		if n.RunscBuild == build {
			same = append(same, n)
		}
	}
	rt.mu.Lock()
	order := Place(same, Want{ProjectID: projectID, Template: o.Template}, rt.rnd)
	rt.mu.Unlock()
	if len(order) == 0 || order[0].Name == rt.cfg.Self {
		return nil
	}
	rt.log.Info("placement: resuming an orphaned sandbox on another node", "sandbox", ref.ID, "node", order[0].Name)
	return &order[0]
}

// snapshotDurable reports whether the project's snapshot id is durable in
// the object store (its record says durableAt).
func (rt *Router) snapshotDurable(ctx context.Context, projectID, id string) bool {
	sns, err := rt.cfg.Store.Snapshots(ctx)
	if err != nil {
		return false
	}
	for _, sn := range sns {
		if sn.ID == id && sn.ProjectID == projectID {
			var spec map[string]json.RawMessage
			if json.Unmarshal(sn.Spec, &spec) != nil {
				return false
			}
			_, ok := spec[store.DurableKey]
			return ok
		}
	}
	return false
}
