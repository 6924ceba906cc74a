package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
)

// A drain --move (docs/CLUSTER.md): the node's Member sees move on its row
// and runs OnMove, which has the sandbox service pause each running
// sandbox, wait until its image is durable and release it (orphaned); then
// ResumeElsewhere asks another node, chosen as a create is placed, to take
// it over with POST /internal/v1/resume/{id}.

// ResumeElsewhere has another node resume orphaned sandbox id: the
// candidates are those placement orders (ready, not draining, holding its
// template) of this node's runsc build; one that answers 503 or cannot be
// dialled is skipped. Another refusal is the peer's error, of its class.
func (rt *Router) ResumeElsewhere(ctx context.Context, id string) error {
	o, err := rt.cfg.Directory.SandboxOwner(ctx, id)
	if err != nil {
		return err
	}
	if !o.Orphaned() {
		return fmt.Errorf("sandbox %s is not orphaned (node %q, %s): %w", id, o.Node, o.Status, errdefs.ErrConflict)
	}
	rt.dropNodes()
	nodes, err := rt.nodes(ctx)
	if err != nil {
		return err
	}
	build := ""
	if i := slices.IndexFunc(nodes, func(n store.Node) bool { return n.Name == rt.cfg.Self }); i >= 0 {
		build = nodes[i].RunscBuild
	}
	nodes = slices.DeleteFunc(nodes, func(n store.Node) bool { return n.RunscBuild != build || n.Name == rt.cfg.Self })
	rt.mu.Lock()
	order := Place(nodes, Want{ProjectID: o.ProjectID, Template: o.Template}, rt.rnd)
	rt.mu.Unlock()
	if len(order) == 0 {
		return fmt.Errorf("sandbox %s: no other node takes sandboxes now (ready, not draining, runsc build %s): %w", id, build, errdefs.ErrCapacity)
	}
	var last error
	for _, n := range order {
		last = rt.resumeOn(ctx, n, id)
		if last == nil {
			rt.dropOwner(id)
			rt.log.Info("move: sandbox resumed on another node", "sandbox", id, "node", n.Name)
			return nil
		}
		if !refused(last) {
			return last
		}
		rt.log.Info("move: node refused; trying the next", "sandbox", id, "node", n.Name, "err", last)
	}
	return last
}

// resumeOn asks node n to resume orphaned sandbox id; its refusal is the
// error it answered (peerAnswer).
func (rt *Router) resumeOn(ctx context.Context, n store.Node, id string) error {
	return rt.internalCall(ctx, http.MethodPost, n, "/internal/v1/resume/"+url.PathEscape(id), createTimeout, nil)
}

// serveResume is POST /internal/v1/resume/{id}: resume the orphaned
// sandbox here; errors as the API answers them.
func serveResume(w http.ResponseWriter, r *http.Request, resume func(context.Context, string) error, log *slog.Logger) {
	if resume == nil {
		http.Error(w, "this node resumes no sandbox for its peers", http.StatusNotFound)
		return
	}
	if err := resume(r.Context(), r.PathValue("id")); err != nil {
		writePeerError(w, r, log, err)
		return
	}
	w.WriteHeader(http.StatusOK)
}
