package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/store"
)

// drainMove is `lizard nodes drain NODE --move`. The CLI talks to the
// database only; the node acts: the CLI sets move (and draining) on the
// node's row, the node's membership loop sees it, moves each sandbox
// (pause, durable, release, resume on a node placement chooses) and clears
// the flag. The CLI prints progress from the rows until then and reports
// where each sandbox went; it fails naming those that did not move.
func drainMove(ctx context.Context, db store.Cluster, node string, timeout time.Duration, out io.Writer) error {
	n, err := nodeNamed(ctx, db, node)
	if err != nil {
		return err
	}
	if n.State != store.NodeReady && n.State != store.NodeDraining {
		return fmt.Errorf("node %s is %s: only a live node can move its sandboxes (a dead one's durable paused sandboxes are resumable anywhere already)", node, n.State)
	}
	before, err := db.SandboxesOn(ctx, node)
	if err != nil {
		return err
	}
	before = slices.DeleteFunc(before, func(sb store.Sandbox) bool { return sb.Status == store.SandboxLost })
	if err := db.SetMoving(ctx, node, true); err != nil {
		return err
	}
	fmt.Fprintf(out, "node %s is draining and moving its %d sandboxes to other nodes\n", node, len(before))
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	left := -1
	for {
		n, err := nodeNamed(ctx, db, node)
		if err == nil && n.State != store.NodeReady && n.State != store.NodeDraining {
			err = fmt.Errorf("node %s is %s: it stopped before it moved everything", node, n.State)
		}
		if err != nil {
			return errors.Join(err, report(context.WithoutCancel(ctx), db, node, before, out))
		}
		rows, err := db.SandboxesOn(ctx, node)
		if err == nil {
			rows = slices.DeleteFunc(rows, func(sb store.Sandbox) bool { return sb.Status == store.SandboxLost })
			if len(rows) != left {
				left = len(rows)
				fmt.Fprintf(out, "%d of %d sandboxes left on %s\n", left, len(before), node)
			}
		}
		if !n.Moving {
			break
		}
		select {
		case <-ctx.Done():
			return errors.Join(fmt.Errorf("node %s did not finish moving within %s", node, timeout), report(context.WithoutCancel(ctx), db, node, before, out))
		case <-time.After(time.Second):
		}
	}
	return report(ctx, db, node, before, out)
}

func nodeNamed(ctx context.Context, db store.Cluster, name string) (store.Node, error) {
	ns, err := db.Nodes(ctx)
	if err != nil {
		return store.Node{}, err
	}
	if i := slices.IndexFunc(ns, func(n store.Node) bool { return n.Name == name }); i >= 0 {
		return ns[i], nil
	}
	return store.Node{}, store.NodeNotFound(name)
}

// report prints where each sandbox of before is now and fails naming those
// that did not move: a running one must run on another node; a paused one
// must be orphaned (resumable anywhere) or elsewhere. A sandbox gone
// meanwhile (killed) is fine.
func report(ctx context.Context, db store.Cluster, node string, before []store.Sandbox, out io.Writer) error {
	var stuck []string
	for _, sb := range before {
		o, err := db.SandboxOwner(ctx, sb.ID)
		var where string
		ok := false
		switch {
		case errors.Is(err, errdefs.ErrNotFound) && sb.Status == sandbox.StatusPooled:
			where, ok = "a warm copy, released (its pool is kept by another node now)", true
		case errors.Is(err, errdefs.ErrNotFound):
			where, ok = "gone (killed meanwhile)", true
		case err != nil:
			where = "unknown: " + err.Error()
		case o.Node == node:
			where = "still on " + node + " (" + o.Status + ")"
		case o.Orphaned():
			where, ok = "paused, durable, resumable on any node", sb.Status != "running"
			if !ok {
				where = "paused and durable but not resumed elsewhere (resume it)"
			}
		default:
			where, ok = o.Status+" on "+o.Node, sb.Status != "running" || o.Status == "running"
		}
		fmt.Fprintf(out, "  %s (%s): %s\n", sb.ID, sb.Status, where)
		if !ok {
			stuck = append(stuck, sb.ID)
		}
	}
	if len(stuck) > 0 {
		return fmt.Errorf("did not move off %s: %s", node, strings.Join(stuck, ", "))
	}
	fmt.Fprintf(out, "node %s moved all its sandboxes; it stays draining (drain --undo takes it back)\n", node)
	return nil
}
