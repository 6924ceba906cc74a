package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/store/postgres"
	"github.com/lizard-build/lizard/internal/store/postgres/pgtest"
	"github.com/lizard-build/lizard/internal/store/storetest"
)

// TestDrainMoveCLI: drain --move sets move on the node's row and waits
// until the node clears it, then reports where each sandbox went and fails
// naming those that did not move. Here a goroutine plays the node, as its
// membership loop does (cluster.Member.OnMove): it moves one running
// sandbox to node-b, releases a paused one, and leaves one running
// sandbox behind.
func TestDrainMoveCLI(t *testing.T) {
	ctx := context.Background()
	url, st, p := nodesDB(t)
	fa, err := st.RegisterNode(ctx, store.NodeInfo{Name: "node-a", Address: "10.77.0.11:7070"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	fb, err := st.RegisterNode(ctx, store.NodeInfo{Name: "node-b", Address: "10.77.0.12:7070"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	row := func(id, status string, durable bool) store.Sandbox {
		spec := `{"id":"` + id + `"}`
		if durable {
			spec = `{"id":"` + id + `","durableAt":"2026-01-01T00:00:00Z"}`
		}
		return store.Sandbox{ID: id, ProjectID: p.ID, Template: "base", Size: "s", Status: status, Spec: []byte(spec), StartedAt: time.Now()}
	}
	for _, sb := range []store.Sandbox{row("moves", "running", false), row("paused", "paused", true), row("stuck", "running", false)} {
		if err := st.PutSandboxFenced(ctx, fa, sb, nil); err != nil {
			t.Fatal(err)
		}
	}
	// The node: once asked, it moves what it can and clears the flag.
	done := make(chan error, 1)
	go func() {
		done <- func() error {
			for asked := false; !asked; time.Sleep(20 * time.Millisecond) {
				ns, err := st.Nodes(ctx)
				if err != nil {
					return err
				}
				for _, n := range ns {
					asked = asked || n.Name == "node-a" && n.Moving
				}
			}
			for _, sb := range []store.Sandbox{row("moves", "paused", true), row("paused", "paused", true)} {
				if err := st.PutSandboxFenced(ctx, fa, sb, nil); err != nil {
					return err
				}
				if err := st.ReleaseSandbox(ctx, fa, sb.ID); err != nil {
					return err
				}
			}
			if err := st.PutSandboxFenced(ctx, fb, row("moves", "running", false), nil); err != nil {
				return err
			}
			return st.SetMoving(ctx, "node-a", false)
		}()
	}()
	var out bytes.Buffer
	err = drainMove(ctx, st, "node-a", time.Minute, &out)
	if gerr := <-done; gerr != nil {
		t.Fatalf("the node's part: %v", gerr)
	}
	t.Logf("drain --move:\n%s", out.String())
	if err == nil || !strings.Contains(err.Error(), "did not move off node-a: stuck") {
		t.Fatalf("drain --move with a sandbox left behind: %v, want it named", err)
	}
	for _, want := range []string{"3 sandboxes", "moves (running): running on node-b", "paused (paused): paused, durable, resumable on any node",
		"stuck (running): still on node-a (running)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output has no %q", want)
		}
	}
	if n := storetest.NodeOf(t, ctx, st, "node-a"); !n.Draining || n.Moving {
		t.Fatalf("node after the move: %+v, want draining, done moving", n)
	}
	// A node that is not alive cannot move anything.
	if err := st.RemoveNode(ctx, "node-b"); err != nil {
		t.Fatal(err)
	}
	if err := Run(ctx, []string{"nodes", "drain", "node-b", "--move", "--database", url}); err == nil || !strings.Contains(err.Error(), "is removed") {
		t.Fatalf("drain --move of a removed node: %v", err)
	}
	if err := Run(ctx, []string{"nodes", "drain", "node-a", "--move", "--undo", "--database", url}); err == nil || !strings.Contains(err.Error(), "usage") {
		t.Fatalf("drain --move --undo: %v, want the usage", err)
	}
}

// nodesDB is a fresh PostgreSQL database for the nodes commands' tests
// (no config file), open, with a project.
func nodesDB(t *testing.T) (string, *postgres.Store, store.Project) {
	t.Helper()
	noConfig(t)
	url, st := emptyDB(t)
	p, err := st.CreateProject(context.Background(), "p", "")
	if err != nil {
		t.Fatal(err)
	}
	return url, st, p
}

// emptyDB is a fresh PostgreSQL database, migrated and open, with nothing
// in it.
func emptyDB(t *testing.T) (string, *postgres.Store) {
	t.Helper()
	ctx := context.Background()
	url, err := pgtest.ForTest(t).NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st, err := postgres.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return url, st
}
