package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"time"

	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/lizard-build/lizard/internal/api"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/sandbox/snapshot"
	"github.com/lizard-build/lizard/internal/sandbox/usage"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/tracing"
	"github.com/lizard-build/lizard/internal/volume"
)

// Local is what this node holds: the parts of the cluster-wide lists it
// answers for, to its own API and to its peers (/internal/v1).
type Local interface {
	// Sandboxes are the project's sandboxes on this node, with their
	// latest usage samples.
	Sandboxes(projectID string) []api.NodeSandbox
	// Snapshots are the project's snapshots on this node.
	Snapshots(projectID string) []snapshot.Info
	// Volumes are the project's volumes on this node.
	Volumes(ctx context.Context, projectID string) ([]volume.Volume, error)
	// Holds reports whether sandbox id is on this node (running, paused
	// or being reattached).
	Holds(id string) bool
}

// LocalService is Local over this node's sandbox service, snapshots and
// volume manager (whose store, in cluster mode, is the node's: NodeStore).
type LocalService struct {
	Node    string
	Service interface {
		List(projectID string) []sandbox.Record
		Holds(id string) bool
	}
	SnapshotManager interface {
		List(projectID string) []snapshot.Info
	}
	Usage interface {
		LatestUsage(id string) (usage.Sample, bool)
	}
	VolumeManager interface {
		List(ctx context.Context, projectID string) ([]volume.Volume, error)
	}
}

var _ Local = LocalService{}

func (l LocalService) Sandboxes(projectID string) []api.NodeSandbox {
	recs := l.Service.List(projectID)
	out := make([]api.NodeSandbox, len(recs))
	for i, rec := range recs {
		out[i] = api.NodeSandbox{Node: l.Node, Record: rec}
		if u, ok := l.Usage.LatestUsage(rec.ID); ok {
			out[i].Usage = &u
		}
	}
	return out
}

func (l LocalService) Snapshots(projectID string) []snapshot.Info {
	return l.SnapshotManager.List(projectID)
}

func (l LocalService) Holds(id string) bool { return l.Service.Holds(id) }

func (l LocalService) Volumes(ctx context.Context, projectID string) ([]volume.Volume, error) {
	return l.VolumeManager.List(ctx, projectID)
}

// listTimeout bounds a peer's answer to a list call.
const listTimeout = 3 * time.Second

// maxListBody bounds a peer's answer to a list call.
const maxListBody = 64 << 20

// Sandboxes lists the project's sandboxes on every node that may hold
// live ones (ready, draining, suspect), in the order of a single node's
// list (started, then id). A node that does not answer in time is left out
// and logged: its sandboxes are not reported rather than reported from
// rows that may be stale.
func (rt *Router) Sandboxes(ctx context.Context, projectID string) ([]api.NodeSandbox, error) {
	out, err := gather(rt, ctx, "sandboxes", projectID, func(context.Context) ([]api.NodeSandbox, error) {
		return rt.cfg.Local.Sandboxes(projectID), nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b api.NodeSandbox) int {
		if c := a.Record.StartedAt.Compare(b.Record.StartedAt); c != 0 {
			return c
		}
		return cmpString(a.Record.ID, b.Record.ID)
	})
	return out, nil
}

// Snapshots lists the project's snapshots on every node, oldest first.
func (rt *Router) Snapshots(ctx context.Context, projectID string) ([]snapshot.Info, error) {
	out, err := gather(rt, ctx, "snapshots", projectID, func(context.Context) ([]snapshot.Info, error) {
		return rt.cfg.Local.Snapshots(projectID), nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortStableFunc(out, func(a, b snapshot.Info) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return dedupSnapshots(out), nil
}

// dedupSnapshots keeps one entry per snapshot: a snapshot whose warm pool
// another node keeps is listed by both; the pool node's entry (the one
// with the most ready copies) is kept.
func dedupSnapshots(in []snapshot.Info) []snapshot.Info {
	at := map[string]int{}
	out := in[:0]
	for _, sn := range in {
		i, seen := at[sn.ID]
		switch {
		case !seen:
			at[sn.ID] = len(out)
			out = append(out, sn)
		case sn.ReadyCount > out[i].ReadyCount:
			out[i] = sn
		}
	}
	return out
}

// Volumes lists the project's volumes on every node, oldest first.
func (rt *Router) Volumes(ctx context.Context, projectID string) ([]volume.Volume, error) {
	out, err := gather(rt, ctx, "volumes", projectID, func(ctx context.Context) ([]volume.Volume, error) {
		return rt.cfg.Local.Volumes(ctx, projectID)
	})
	if err != nil {
		return nil, err
	}
	slices.SortStableFunc(out, func(a, b volume.Volume) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return out, nil
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// gather asks every other node that may hold live things for its part of
// a list (/internal/v1/<what>?project=), all at once, and adds this node's
// own. This node's failure is the list's; a peer's is logged and its part
// left out. When the nodes cannot be listed (the database is down), the
// list is this node's part alone.
func gather[T any](rt *Router, ctx context.Context, what, projectID string, local func(context.Context) ([]T, error)) ([]T, error) {
	out, err := local(ctx)
	if err != nil {
		return nil, err
	}
	if Forwarded(ctx) {
		return out, nil
	}
	nodes, err := rt.nodes(ctx)
	if err != nil {
		rt.log.Warn("cluster list: nodes unknown; listing this node's only", "list", what, "err", err)
		return out, nil
	}
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	for _, n := range nodes {
		if n.Name == rt.cfg.Self || !mayHoldLive(n) {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var part []T
			if err := rt.internalCall(ctx, http.MethodGet, n, "/internal/v1/"+what+"?project="+url.QueryEscape(projectID), listTimeout, &part); err != nil {
				rt.log.Warn("cluster list: a node did not answer; its part is left out", "list", what, "node", n.Name, "err", err)
				return
			}
			mu.Lock()
			out = append(out, part...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out, nil
}

// mayHoldLive reports whether a node may have live sandboxes, snapshots
// and volumes to list: a dead or removed node's were lost with it.
func mayHoldLive(n store.Node) bool {
	return n.State != store.NodeDead && n.State != store.NodeRemoved
}

// internalCall makes the /internal/v1 call method uri to node n within
// timeout and decodes its JSON answer into v (nil: the answer is not
// read). A refusal is the peer's error as it answered it (peerAnswer); a
// node that cannot be dialled is ErrUnavailable.
func (rt *Router) internalCall(ctx context.Context, method string, n store.Node, uri string, timeout time.Duration, v any) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ctx, span := tracing.StartClient(ctx, "internal "+method, tracing.Node.String(n.Name), semconv.ServerAddress(n.Address))
	defer span.End()
	req, err := http.NewRequestWithContext(ctx, method, "http://"+n.Address+uri, nil)
	if err != nil {
		return err
	}
	tracing.Inject(ctx, req.Header)
	rt.cfg.Signer.sign(req, kindInternal)
	resp, err := rt.client.Do(req)
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			return unreachable(n, err)
		}
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return peerAnswer(n, resp)
	}
	if v == nil {
		return nil
	}
	return json.NewDecoder(io.LimitReader(resp.Body, maxListBody)).Decode(v)
}

// The /internal/v1 list calls: this node's part of a project's list. The
// sandboxes' secrets (tokens, envs) stay on their node.

func serveLocalSandboxes(w http.ResponseWriter, r *http.Request, l Local) {
	part := l.Sandboxes(r.URL.Query().Get("project"))
	for i := range part {
		rec := &part[i].Record
		rec.AgentToken, rec.PreviewToken, rec.PortTokens, rec.EnvdToken, rec.TrafficToken, rec.Envs = "", "", nil, "", "", nil
	}
	api.WriteJSON(w, http.StatusOK, part)
}

func serveLocalSnapshots(w http.ResponseWriter, r *http.Request, l Local) {
	part := l.Snapshots(r.URL.Query().Get("project"))
	for i := range part {
		part[i].AgentToken, part[i].Envs = "", nil
	}
	api.WriteJSON(w, http.StatusOK, part)
}

func serveLocalVolumes(w http.ResponseWriter, r *http.Request, l Local, log *slog.Logger) {
	vs, err := l.Volumes(r.Context(), r.URL.Query().Get("project"))
	if err != nil {
		writePeerError(w, r, log, err)
		return
	}
	api.WriteJSON(w, http.StatusOK, vs)
}
