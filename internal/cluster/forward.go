package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httputil"
	"strconv"
	"sync"
	"time"

	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/lizard-build/lizard/internal/api"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/tcpdial"
	"github.com/lizard-build/lizard/internal/tracing"
)

// Defaults of RouterConfig.
const (
	DefaultOwnerTTL = 3 * time.Second
	DefaultNodesTTL = time.Second
)

// retryAfterSecs is the Retry-After of a 503 for a node that does not
// answer: a suspect node's lease, or the cache, is settled by then.
const retryAfterSecs = 2

// maxOwners bounds the owner cache.
const maxOwners = 50_000

// RouterConfig wires a Router.
type RouterConfig struct {
	// Self is this node's name.
	Self string
	// Directory answers who holds a sandbox and which nodes there are.
	Directory Directory
	// Store has the snapshot and volume rows of every node (the shared
	// store, not the node's NodeStore).
	Store  store.Store
	Signer *Signer
	// ObjectStore says volumes are synced to an object store: one whose
	// node is gone (dead or removed) is answered here and a create with
	// it placed on any node, which fetches its last sync.
	ObjectStore bool
	// Local is this node's part of the lists.
	Local  Local
	Logger *slog.Logger
	// OwnerTTL is how long a sandbox's owner is trusted without asking
	// the database again; NodesTTL the same for the list of nodes. A
	// stale answer is still used while the database cannot be reached.
	OwnerTTL, NodesTTL time.Duration
	// Transport carries requests to peers; nil: a pooled one of the
	// router's own.
	Transport http.RoundTripper
	// Rand draws placement's samples; nil: seeded at random.
	Rand *rand.Rand
}

// Directory is what routing asks the database (store.Cluster has it).
type Directory interface {
	SandboxOwner(ctx context.Context, id string) (store.Owner, error)
	Nodes(ctx context.Context) ([]store.Node, error)
}

// Router sends each request to the node that holds what it names: it
// implements api.Cluster (the Lizard and E2B APIs) and proxy.Forwarder
// (previews).
type Router struct {
	cfg    RouterConfig
	log    *slog.Logger
	rp     *httputil.ReverseProxy
	client *http.Client

	mu      sync.Mutex
	owners  map[string]ownerEntry
	nodesAt time.Time
	nodeSet []store.Node
	rnd     *rand.Rand
}

type ownerEntry struct {
	owner store.Owner
	at    time.Time
}

var _ api.Cluster = (*Router)(nil)

// NewRouter returns the router of node cfg.Self.
func NewRouter(cfg RouterConfig) *Router {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.OwnerTTL <= 0 {
		cfg.OwnerTTL = DefaultOwnerTTL
	}
	if cfg.NodesTTL <= 0 {
		cfg.NodesTTL = DefaultNodesTTL
	}
	if cfg.Transport == nil {
		cfg.Transport = &http.Transport{
			// Peers are dialled directly, never through a proxy of the
			// environment.
			Proxy: nil,
			// A peer that vanishes mid-request (a partition) fails the
			// request in seconds, on a pooled connection too.
			DialContext:         tcpdial.New().DialContext,
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     90 * time.Second,
		}
	}
	rnd := cfg.Rand
	if rnd == nil {
		rnd = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	rt := &Router{cfg: cfg, log: cfg.Logger, owners: map[string]ownerEntry{}, rnd: rnd,
		client: &http.Client{Transport: cfg.Transport, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
	rt.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			t := pr.In.Context().Value(hopKey{}).(*hop)
			pr.Out.URL.Scheme, pr.Out.URL.Host = "http", t.addr
			// The owner sees the host the client asked for (previews are
			// routed by it) under the same request id.
			pr.Out.Host = pr.In.Host
			pr.SetXForwarded()
			if t.requestID != "" {
				pr.Out.Header.Set(api.RequestIDHeader, t.requestID)
			}
			// The owner's server span is a child of this hop's.
			tracing.Inject(pr.Out.Context(), pr.Out.Header)
			rt.cfg.Signer.sign(pr.Out, t.kind)
		},
		Transport: cfg.Transport,
		// Server-Sent Events, logs and watch streams must not wait in a
		// buffer.
		FlushInterval: -1,
		ModifyResponse: func(resp *http.Response) error {
			t := resp.Request.Context().Value(hopKey{}).(*hop)
			trace.SpanFromContext(resp.Request.Context()).SetAttributes(semconv.HTTPResponseStatusCode(resp.StatusCode))
			if t.requestID != "" {
				// This node's answer carries it already.
				resp.Header.Del(api.RequestIDHeader)
			}
			if t.sandbox != "" && t.kind == kindProxy && resp.StatusCode == http.StatusUnauthorized {
				// The owner's proxy answers 401 for a sandbox it does
				// not hold (as if it never existed): if it moved, the
				// client's next request finds its new owner.
				rt.dropOwner(t.sandbox)
			}
			if t.sandbox != "" && resp.StatusCode == http.StatusNotFound {
				// The owner has no such sandbox (any more): ask again
				// next time, or at once when the request can go again.
				rt.dropOwner(t.sandbox)
				if t.replayable && resp.Header.Get(api.SandboxMissingHeader) != "" {
					resp.Body.Close()
					return errMoved
				}
			}
			return nil
		},
		// A stream cut short mid-way is the client's or the peer's
		// leaving: worth a debug line, not the standard logger's.
		ErrorLog: slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelDebug),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			// Nothing was written yet: the caller answers in its own
			// shape.
			r.Context().Value(hopKey{}).(*hop).err = err
		},
	}
	return rt
}

// Node is this node's name.
func (rt *Router) Node() string { return rt.cfg.Self }

// hop is one forwarded request.
type hop struct {
	addr, kind string
	sandbox    string // the sandbox the request is about, if any
	requestID  string
	err        error // set when the peer could not be reached
	// replayable: the request can be sent again (no body, or a small
	// one kept in body), so a 404 of a sandbox that moved is not
	// answered but followed (errMoved).
	replayable bool
	body       []byte
}

// maxReplay bounds the body kept to send a request again after its
// sandbox moved.
const maxReplay = 1 << 20

// errMoved is a peer's 404 for the sandbox, not answered: it may have
// moved (drain --move, a resume elsewhere) and the request can go to its
// new owner.
var errMoved = errors.New("the sandbox is not on that node")

// keepForReplay makes r's request replayable when its body is small
// enough to keep.
func (t *hop) keepForReplay(r *http.Request) {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		t.replayable = true
		return
	}
	if r.ContentLength < 0 || r.ContentLength > maxReplay {
		return
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, maxReplay+1))
	r.Body.Close()
	r.Body = io.NopCloser(bytes.NewReader(b))
	if err == nil && len(b) <= maxReplay {
		t.replayable, t.body = true, b
	}
}

// rewind gives r its kept body again.
func (t *hop) rewind(r *http.Request) {
	if t.body != nil {
		r.Body = io.NopCloser(bytes.NewReader(t.body))
	}
}

type hopKey struct{}

// Forward answers r on the node that holds ref's sandbox, snapshot or
// volume when that is another node (see api.Cluster).
func (rt *Router) Forward(w http.ResponseWriter, r *http.Request, projectID string, ref api.Ref) (bool, error) {
	if Forwarded(r.Context()) {
		return false, nil
	}
	if n := rt.placeOrphan(r, projectID, ref); n != nil {
		err := rt.send(w, r, &hop{addr: n.Address, kind: kindAPI, sandbox: ref.ID, requestID: w.Header().Get(api.RequestIDHeader)})
		if err != nil {
			w.Header().Set("Retry-After", strconv.Itoa(retryAfterSecs))
		}
		return true, err
	}
	n, err := rt.locate(r.Context(), projectID, ref, r.Method)
	if err != nil || n == nil {
		if errdefs.Code(err) == codeNodeUnavailable {
			w.Header().Set("Retry-After", strconv.Itoa(retryAfterSecs))
		}
		return false, err
	}
	t := &hop{addr: n.Address, kind: kindAPI, requestID: w.Header().Get(api.RequestIDHeader)}
	if ref.Kind == api.RefSandbox {
		t.sandbox = ref.ID
		t.keepForReplay(r)
	}
	err = rt.send(w, r, t)
	if errors.Is(err, errMoved) {
		// Its owner had it no more: follow it once, to wherever the
		// database says it is now (here: answered here).
		t.rewind(r)
		var n *store.Node
		if n, err = rt.locate(r.Context(), projectID, ref, r.Method); err != nil || n == nil || n.Address == t.addr {
			return false, err
		}
		t = &hop{addr: n.Address, kind: kindAPI, sandbox: ref.ID, requestID: t.requestID}
		err = rt.send(w, r, t)
	}
	if err != nil {
		w.Header().Set("Retry-After", strconv.Itoa(retryAfterSecs))
		return true, err
	}
	return true, nil
}

// ForwardPreview answers a preview request for sandbox id on its node
// when that is another node, and reports whether it did and how it went
// (the proxy's outcomes). The owner checks the preview's token; an owner
// that cannot be reached is a 503 with Retry-After.
func (rt *Router) ForwardPreview(w http.ResponseWriter, r *http.Request, id string) (outcome string, handled bool) {
	if Forwarded(r.Context()) {
		return "", false
	}
	o, err := rt.owner(r.Context(), id)
	if err != nil || o.Lost || o.Node == rt.cfg.Self {
		// Unknown, lost or here: the proxy answers as on one node.
		return "", false
	}
	n, err := rt.peer(r.Context(), o.Node)
	if err == nil {
		err = rt.send(w, r, &hop{addr: n.Address, kind: kindProxy, sandbox: id})
	}
	if err != nil {
		rt.log.Warn("preview: the sandbox's node cannot be reached", "sandbox", id, "node", o.Node, "err", err)
		w.Header().Set("Retry-After", strconv.Itoa(retryAfterSecs))
		w.Header().Set("Cache-Control", "no-store")
		http.Error(w, "The sandbox's node cannot be reached now; retry shortly.", http.StatusServiceUnavailable)
		return "unavailable", true
	}
	return "forwarded", true
}

// send streams r to a peer and its answer back, WebSocket upgrades
// included. An error means the peer could not be reached and nothing was
// answered.
func (rt *Router) send(w http.ResponseWriter, r *http.Request, t *hop) error {
	// A client may still be sending its body while the answer streams
	// (E2B's envd streams, uploads answered early).
	_ = http.NewResponseController(w).EnableFullDuplex()
	ctx, span := tracing.StartClient(r.Context(), "forward "+t.kind, semconv.ServerAddress(t.addr), tracing.SandboxID.String(t.sandbox))
	rt.rp.ServeHTTP(w, r.WithContext(context.WithValue(ctx, hopKey{}, t)))
	tracing.End(span, t.err)
	if errors.Is(t.err, errMoved) {
		return errMoved
	}
	if t.err == nil || r.Context().Err() != nil {
		// Answered, or the client left: nothing to say.
		return nil
	}
	if t.sandbox != "" {
		rt.dropOwner(t.sandbox)
	}
	rt.dropNodes()
	rt.log.Warn("forward: peer unreachable", "addr", t.addr, "method", r.Method, "path", r.URL.Path, "err", t.err)
	return errdefs.WithCode(codeNodeUnavailable, fmt.Errorf("the node holding this cannot be reached now; retry shortly: %w", errdefs.ErrUnavailable))
}

// Codes of the errors routing answers.
const (
	codeSandboxLost     = "sandbox_lost"
	codeNodeUnavailable = "node_unavailable"
)

// locate finds the peer that holds ref (for a snapshot: the one that
// answers method, snapshotTarget); nil (and no error) when it is this
// node, unknown or another project's.
func (rt *Router) locate(ctx context.Context, projectID string, ref api.Ref, method string) (*store.Node, error) {
	var node string
	switch ref.Kind {
	case api.RefSandbox:
		o, err := rt.owner(ctx, ref.ID)
		if err != nil || o.ProjectID != projectID {
			// Unknown, or the database is unreachable with nothing
			// cached: this node answers for what it has.
			return nil, nil
		}
		if o.Lost {
			return nil, lostError(ref.ID, o.Node)
		}
		node = o.Node
	case api.RefSnapshot:
		node = rt.snapshotTarget(ctx, projectID, ref.ID, method)
	case api.RefVolume:
		node = rt.volumeNode(ctx, projectID, ref.ID)
		if rt.movable(ctx, node) {
			return nil, nil
		}
	}
	if node == "" || node == rt.cfg.Self {
		return nil, nil
	}
	n, err := rt.peer(ctx, node)
	if errors.Is(err, errNodeGone) && ref.Kind == api.RefSandbox {
		// The cached owner is on a node declared dead since: its row
		// says lost by now.
		rt.dropOwner(ref.ID)
		if o, err := rt.owner(ctx, ref.ID); err == nil && o.Lost {
			return nil, lostError(ref.ID, o.Node)
		}
	}
	return n, err
}

// snapshotNode is the node of the project's snapshot id, "" if none has
// it.
func (rt *Router) snapshotNode(ctx context.Context, projectID, id string) string {
	return rt.rowNode(ctx, "snapshot", func() (string, error) {
		sns, err := rt.cfg.Store.Snapshots(ctx)
		for _, sn := range sns {
			if sn.ID == id && sn.ProjectID == projectID {
				return sn.Node, nil
			}
		}
		return "", err
	})
}

// volumeNode is the node of the project's volume ref (an id or a name),
// "" if none has it.
func (rt *Router) volumeNode(ctx context.Context, projectID, ref string) string {
	return rt.rowNode(ctx, "volume", func() (string, error) {
		vs, err := rt.cfg.Store.Volumes(ctx)
		for _, v := range vs {
			if v.ProjectID == projectID && (v.ID == ref || v.Name == ref) {
				return v.Node, nil
			}
		}
		return "", err
	})
}

// movable reports whether a volume of node may be used on any node: there
// is an object store and node is gone (dead, removed or unknown).
func (rt *Router) movable(ctx context.Context, node string) bool {
	if !rt.cfg.ObjectStore || node == "" || node == rt.cfg.Self {
		return false
	}
	nodes, err := rt.nodes(ctx)
	return err == nil && Gone(nodes, node)
}

// Gone reports whether node is declared dead or removed, or not a member
// of nodes at all.
func Gone(nodes []store.Node, node string) bool {
	for _, n := range nodes {
		if n.Name == node {
			return n.State == store.NodeDead || n.State == store.NodeRemoved
		}
	}
	return true
}

// rowNode runs a lookup of a row's node; a failed one (the database is
// unreachable) is logged and leaves the request to this node.
func (rt *Router) rowNode(ctx context.Context, what string, find func() (string, error)) string {
	node, err := find()
	if err != nil {
		rt.log.Warn("cluster: cannot look the "+what+"'s node up; answering here", "err", err)
	}
	return node
}

func lostError(id, node string) error {
	return errdefs.WithCode(codeSandboxLost, fmt.Errorf("sandbox %q was lost with node %q (declared dead or removed): %w", id, node, errdefs.ErrNotFound))
}

// errNodeGone is a peer declared dead or removed.
var errNodeGone = errors.New("node gone")

// peer returns node name if it can take requests: its lease is current.
// A suspect node, one declared dead or removed, or one not (yet) known is
// a retryable ErrUnavailable.
func (rt *Router) peer(ctx context.Context, name string) (*store.Node, error) {
	nodes, err := rt.nodes(ctx)
	if err != nil {
		return nil, errdefs.WithCode(codeNodeUnavailable, fmt.Errorf("node %q: the cluster's nodes cannot be listed now: %w", name, errdefs.ErrUnavailable))
	}
	for i := range nodes {
		n := &nodes[i]
		if n.Name != name {
			continue
		}
		switch n.State {
		case store.NodeReady, store.NodeDraining:
			return n, nil
		case store.NodeDead, store.NodeRemoved:
			return nil, errdefs.WithCode(codeNodeUnavailable, fmt.Errorf("node %q is %s: %w: %w", name, n.State, errNodeGone, errdefs.ErrUnavailable))
		default:
			return nil, errdefs.WithCode(codeNodeUnavailable, fmt.Errorf("node %q has not renewed its lease (suspect); retry shortly: %w", name, errdefs.ErrUnavailable))
		}
	}
	return nil, errdefs.WithCode(codeNodeUnavailable, fmt.Errorf("node %q is not a member of the cluster: %w", name, errdefs.ErrUnavailable))
}

// owner is SandboxOwner behind a cache of OwnerTTL. While the database
// cannot be reached, an entry past its time is still used. An entry that
// names this node while this node does not hold the sandbox is not
// trusted: this node let it go (drain --move) and another took it over,
// and answering here would be a 404 until the entry expired.
func (rt *Router) owner(ctx context.Context, id string) (store.Owner, error) {
	rt.mu.Lock()
	e, ok := rt.owners[id]
	rt.mu.Unlock()
	if ok && time.Since(e.at) < rt.cfg.OwnerTTL && (e.owner.Node != rt.cfg.Self || rt.holds(id)) {
		return e.owner, nil
	}
	o, err := rt.cfg.Directory.SandboxOwner(ctx, id)
	switch {
	case err == nil && o.Orphaned():
		// Not cached: whichever node resumes it takes it any moment.
		rt.dropOwner(id)
		return o, nil
	case err == nil:
		rt.mu.Lock()
		if len(rt.owners) >= maxOwners {
			rt.pruneOwnersLocked()
		}
		rt.owners[id] = ownerEntry{owner: o, at: time.Now()}
		rt.mu.Unlock()
		return o, nil
	case errors.Is(err, errdefs.ErrNotFound):
		rt.dropOwner(id)
		return store.Owner{}, err
	case ok:
		rt.log.Warn("cluster: owner lookup failed; using what was known", "sandbox", id, "node", e.owner.Node, "err", err)
		return e.owner, nil
	default:
		return store.Owner{}, err
	}
}

// holds reports whether this node holds sandbox id (no Local: assume so).
func (rt *Router) holds(id string) bool {
	return rt.cfg.Local == nil || rt.cfg.Local.Holds(id)
}

// pruneOwnersLocked drops the entries past their time, and all of them if
// that is not enough.
func (rt *Router) pruneOwnersLocked() {
	for id, e := range rt.owners {
		if time.Since(e.at) >= rt.cfg.OwnerTTL {
			delete(rt.owners, id)
		}
	}
	if len(rt.owners) >= maxOwners {
		clear(rt.owners)
	}
}

func (rt *Router) dropOwner(id string) {
	rt.mu.Lock()
	delete(rt.owners, id)
	rt.mu.Unlock()
}

// nodes is Cluster.Nodes behind a cache of NodesTTL; while the database
// cannot be reached, the last answer is still used.
func (rt *Router) nodes(ctx context.Context) ([]store.Node, error) {
	rt.mu.Lock()
	cached, at := rt.nodeSet, rt.nodesAt
	rt.mu.Unlock()
	if cached != nil && time.Since(at) < rt.cfg.NodesTTL {
		return cached, nil
	}
	// The list is as old as the read's start: a slow read does not make
	// a stale view live longer than NodesTTL after a change.
	start := time.Now()
	ns, err := rt.cfg.Directory.Nodes(ctx)
	if err != nil {
		if cached != nil {
			return cached, nil
		}
		return nil, err
	}
	rt.mu.Lock()
	rt.nodeSet, rt.nodesAt = ns, start
	rt.mu.Unlock()
	return ns, nil
}

// dropNodes makes the next nodes call ask the database.
func (rt *Router) dropNodes() {
	rt.mu.Lock()
	rt.nodesAt = time.Time{}
	rt.mu.Unlock()
}
