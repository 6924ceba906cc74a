package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
)

// RunCluster runs the conformance suite of store.Cluster against a backend
// whose stores implement it.
func RunCluster(t *testing.T, newDB NewDB) {
	for _, tc := range []struct {
		name string
		f    func(*testing.T, context.Context, func() store.Cluster, store.Project)
	}{
		{"Register", testRegister},
		{"Lease", testLease},
		{"Remove", testRemove},
		{"Draining", testDraining},
		{"Fenced", testFenced},
		{"Admission", testAdmission},
		{"AdmissionRace", testAdmissionRace},
		{"Orphans", testOrphans},
		{"AdoptPool", testAdoptPool},
		{"ScheduleFence", testScheduleFence},
		{"DeliveryFence", testDeliveryFence},
	} {
		t.Run(tc.name, func(t *testing.T) {
			open := newDB(t)
			ctx := context.Background()
			openCluster := func() store.Cluster {
				t.Helper()
				st, err := open()
				if err != nil {
					t.Fatalf("open: %v", err)
				}
				t.Cleanup(func() { st.Close() })
				c, ok := st.(store.Cluster)
				if !ok {
					t.Fatalf("%T does not implement store.Cluster", st)
				}
				return c
			}
			p, err := openCluster().(store.Store).CreateProject(ctx, "cluster", "")
			if err != nil {
				t.Fatal(err)
			}
			tc.f(t, ctx, openCluster, p)
		})
	}
}

func nodeInfo(name string) store.NodeInfo {
	return store.NodeInfo{Name: name, Address: name + ".internal:7070", RunscBuild: "sha256:abc", VCPUs: 8, MemoryMB: 16384,
		MaxSandboxes: 10, Templates: []string{"base", "prj/custom"}}
}

// NodeOf finds a node in c's Nodes; the tests of the cluster's users
// (internal/cluster, the CLI) use it too.
func NodeOf(t *testing.T, ctx context.Context, c store.Cluster, name string) store.Node {
	t.Helper()
	ns, err := c.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range ns {
		if n.Name == name {
			return n
		}
	}
	t.Fatalf("node %s not in %+v", name, ns)
	return store.Node{}
}

// waitState polls Nodes until name is in state; leases run on the
// database's clock, which the test can only watch.
func waitState(t *testing.T, ctx context.Context, c store.Cluster, name, state string) store.Node {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		n := NodeOf(t, ctx, c, name)
		if n.State == state {
			return n
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s still %s (lease left %v), want %s", name, n.State, n.LeaseLeft, state)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func sandboxOn(p store.Project, id, status string, cpus float64, mem int64) store.Sandbox {
	return store.Sandbox{ID: id, ProjectID: p.ID, Template: "base", Size: "s", Status: status, Spec: []byte(`{"id":"` + id + `"}`),
		StartedAt: ts(1), CPUs: cpus, MemoryMB: mem}
}

func testRegister(t *testing.T, ctx context.Context, open func() store.Cluster, p store.Project) {
	c := open()
	if ns, err := c.Nodes(ctx); err != nil || ns == nil || len(ns) != 0 {
		t.Fatalf("nodes of an empty store: %#v %v", ns, err)
	}
	f1, err := c.RegisterNode(ctx, nodeInfo("a"), time.Hour)
	if err != nil || f1.Node != "a" || f1.Incarnation < 1 {
		t.Fatalf("register: %+v %v", f1, err)
	}
	n := NodeOf(t, ctx, c, "a")
	want := nodeInfo("a")
	if n.State != store.NodeReady || n.Address != want.Address || n.RunscBuild != want.RunscBuild || n.VCPUs != 8 ||
		n.MemoryMB != 16384 || n.MaxSandboxes != 10 || fmt.Sprint(n.Templates) != fmt.Sprint(want.Templates) ||
		n.Incarnation != f1.Incarnation || n.LeaseLeft <= 0 || n.LeaseLeft > time.Hour || n.Heartbeat.IsZero() || n.JoinedAt.IsZero() {
		t.Fatalf("registered node: %+v", n)
	}
	// A restart (or another process taking the name) is a new incarnation;
	// the old one is fenced.
	f2, err := open().RegisterNode(ctx, nodeInfo("a"), time.Hour)
	if err != nil || f2.Incarnation <= f1.Incarnation {
		t.Fatalf("re-register: %+v %v (was %+v)", f2, err, f1)
	}
	if err := c.Heartbeat(ctx, f1, nodeInfo("a"), time.Hour); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("heartbeat of the old incarnation: %v, want ErrFenced", err)
	}
	info := nodeInfo("a")
	info.VCPUs, info.Templates = 4, []string{"base"}
	if err := c.Heartbeat(ctx, f2, info, time.Hour); err != nil {
		t.Fatalf("heartbeat: %v", err)
	}
	if n := NodeOf(t, ctx, c, "a"); n.VCPUs != 4 || len(n.Templates) != 1 || n.Incarnation != f2.Incarnation {
		t.Fatalf("after a heartbeat with new info: %+v", n)
	}
	if err := c.Heartbeat(ctx, store.Fence{Node: "nobody", Incarnation: 1}, nodeInfo("nobody"), time.Hour); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("heartbeat of an unknown node: %v, want ErrFenced", err)
	}
}

func testLease(t *testing.T, ctx context.Context, open func() store.Cluster, p store.Project) {
	c := open()
	fa, err := c.RegisterNode(ctx, nodeInfo("a"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	fb, err := c.RegisterNode(ctx, nodeInfo("b"), 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range []store.Sandbox{sandboxOn(p, "sb-b1", "running", 1, 512), sandboxOn(p, "sb-b2", "paused", 1, 512)} {
		if err := c.PutSandboxFenced(ctx, fb, sb, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.PutSandboxFenced(ctx, fa, sandboxOn(p, "sb-a1", "running", 1, 512), nil); err != nil {
		t.Fatal(err)
	}
	if n := NodeOf(t, ctx, c, "b"); n.Sandboxes != 2 || n.ReservedVCPUs != 1 || n.ReservedMemoryMB != 512 {
		t.Fatalf("node b's reservations: %+v", n)
	}
	// A live lease is never declared dead.
	if done, err := c.DeclareDead(ctx, "a", 0); err != nil || done {
		t.Fatalf("declare a live node dead: %v %v", done, err)
	}
	n := waitState(t, ctx, c, "b", store.NodeSuspect)
	if n.LeaseLeft > 0 {
		t.Fatalf("suspect node with lease left: %+v", n)
	}
	// Not dead until the lease has lapsed for after.
	if done, err := c.DeclareDead(ctx, "b", time.Hour); err != nil || done {
		t.Fatalf("declare dead before after: %v %v", done, err)
	}
	if o, err := c.SandboxOwner(ctx, "sb-b1"); err != nil || o.Lost || o.Node != "b" || o.Status != "running" || o.ProjectID != p.ID {
		t.Fatalf("owner of a suspect node's sandbox: %+v %v", o, err)
	}
	// A suspect node that heartbeats again is back.
	if err := c.Heartbeat(ctx, fb, nodeInfo("b"), time.Hour); err != nil {
		t.Fatalf("heartbeat of a suspect node: %v", err)
	}
	waitState(t, ctx, c, "b", store.NodeReady)
	if err := c.Heartbeat(ctx, fb, nodeInfo("b"), 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	waitState(t, ctx, c, "b", store.NodeSuspect)
	if done, err := c.DeclareDead(ctx, "b", 50*time.Millisecond); err != nil || !done {
		// The lease has lapsed at least a moment ago; give it after.
		time.Sleep(100 * time.Millisecond)
		if done, err = c.DeclareDead(ctx, "b", 50*time.Millisecond); err != nil || !done {
			t.Fatalf("declare dead: %v %v", done, err)
		}
	}
	if done, err := c.DeclareDead(ctx, "b", 0); err != nil || done {
		t.Fatalf("declare a dead node dead again: %v %v", done, err)
	}
	if n := NodeOf(t, ctx, c, "b"); n.State != store.NodeDead || n.Sandboxes != 0 || n.ReservedVCPUs != 0 {
		t.Fatalf("dead node: %+v", n)
	}
	for _, id := range []string{"sb-b1", "sb-b2"} {
		if o, err := c.SandboxOwner(ctx, id); err != nil || !o.Lost || o.Node != "b" || o.Status != store.SandboxLost {
			t.Fatalf("owner of a dead node's sandbox %s: %+v %v", id, o, err)
		}
	}
	if o, err := c.SandboxOwner(ctx, "sb-a1"); err != nil || o.Lost {
		t.Fatalf("another node's sandbox after b died: %+v %v", o, err)
	}
	// The dead incarnation can write nothing.
	if err := c.Heartbeat(ctx, fb, nodeInfo("b"), time.Hour); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("heartbeat of a dead node: %v, want ErrFenced", err)
	}
	if err := c.PutSandboxFenced(ctx, fb, sandboxOn(p, "sb-b1", "running", 1, 512), nil); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("put by a dead node: %v, want ErrFenced", err)
	}
	if err := c.DeleteSandboxFenced(ctx, fb, "sb-b1"); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("delete by a dead node: %v, want ErrFenced", err)
	}
	// It rejoins as a new incarnation and finds its lost rows.
	fb2, err := c.RegisterNode(ctx, nodeInfo("b"), time.Hour)
	if err != nil || fb2.Incarnation <= fb.Incarnation {
		t.Fatalf("rejoin: %+v %v", fb2, err)
	}
	if n := NodeOf(t, ctx, c, "b"); n.State != store.NodeReady {
		t.Fatalf("rejoined node: %+v", n)
	}
	sbs, err := c.SandboxesOn(ctx, "b")
	if err != nil || len(sbs) != 2 || sbs[0].Status != store.SandboxLost || sbs[1].Status != store.SandboxLost || sbs[0].Node != "b" {
		t.Fatalf("sandboxes on the rejoined node: %+v %v", sbs, err)
	}
	if err := c.DeleteSandboxFenced(ctx, fb2, "sb-b1"); err != nil {
		t.Fatalf("delete a lost row: %v", err)
	}
	if _, err := c.SandboxOwner(ctx, "sb-b1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("owner of a deleted sandbox: %v, want ErrNotFound", err)
	}
}

func testRemove(t *testing.T, ctx context.Context, open func() store.Cluster, p store.Project) {
	c := open()
	if err := c.RemoveNode(ctx, "nobody"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("remove an unknown node: %v, want ErrNotFound", err)
	}
	fa, err := c.RegisterNode(ctx, nodeInfo("a"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.PutSandboxFenced(ctx, fa, sandboxOn(p, "sb-1", "running", 1, 256), nil); err != nil {
		t.Fatal(err)
	}
	// Removed whatever its lease.
	if err := open().RemoveNode(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if n := NodeOf(t, ctx, c, "a"); n.State != store.NodeRemoved {
		t.Fatalf("removed node: %+v", n)
	}
	if o, err := c.SandboxOwner(ctx, "sb-1"); err != nil || !o.Lost {
		t.Fatalf("sandbox of a removed node: %+v %v", o, err)
	}
	if err := c.Heartbeat(ctx, fa, nodeInfo("a"), time.Hour); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("heartbeat of a removed node: %v, want ErrFenced", err)
	}
	if done, err := c.DeclareDead(ctx, "a", 0); err != nil || done {
		t.Fatalf("declare a removed node dead: %v %v", done, err)
	}
	if n := NodeOf(t, ctx, c, "a"); n.State != store.NodeRemoved {
		t.Fatalf("removed node after DeclareDead: %+v", n)
	}
}

func testDraining(t *testing.T, ctx context.Context, open func() store.Cluster, p store.Project) {
	c := open()
	if err := c.SetDraining(ctx, "nobody", true); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("drain an unknown node: %v, want ErrNotFound", err)
	}
	if _, err := c.RegisterNode(ctx, nodeInfo("a"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := c.SetDraining(ctx, "a", true); err != nil {
		t.Fatal(err)
	}
	if n := NodeOf(t, ctx, c, "a"); n.State != store.NodeDraining || !n.Draining {
		t.Fatalf("draining node: %+v", n)
	}
	// Draining survives a restart.
	f, err := c.RegisterNode(ctx, nodeInfo("a"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if n := NodeOf(t, ctx, c, "a"); n.State != store.NodeDraining {
		t.Fatalf("draining node after a restart: %+v", n)
	}
	// A draining node's own writes go on (its sandboxes live on).
	if err := c.PutSandboxFenced(ctx, f, sandboxOn(p, "sb-1", "running", 1, 256), &store.Admission{}); err != nil {
		t.Fatalf("put on a draining node: %v", err)
	}
	if err := c.SetDraining(ctx, "a", false); err != nil {
		t.Fatal(err)
	}
	if n := NodeOf(t, ctx, c, "a"); n.State != store.NodeReady || n.Draining {
		t.Fatalf("undrained node: %+v", n)
	}
}

func testFenced(t *testing.T, ctx context.Context, open func() store.Cluster, p store.Project) {
	c := open()
	fa, err := c.RegisterNode(ctx, nodeInfo("a"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	fb, err := c.RegisterNode(ctx, nodeInfo("b"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	sb := sandboxOn(p, "sb-1", "running", 2, 1024)
	sb.Node = "elsewhere" // the fence decides
	if err := c.PutSandboxFenced(ctx, fa, sb, nil); err != nil {
		t.Fatal(err)
	}
	sbs, err := c.SandboxesOn(ctx, "a")
	if err != nil || len(sbs) != 1 || sbs[0].Node != "a" || sbs[0].CPUs != 2 || sbs[0].MemoryMB != 1024 || !sameJSON(sbs[0].Spec, sb.Spec) {
		t.Fatalf("sandboxes on a: %+v %v", sbs, err)
	}
	if sbs, err := c.SandboxesOn(ctx, "b"); err != nil || sbs == nil || len(sbs) != 0 {
		t.Fatalf("sandboxes on b: %#v %v", sbs, err)
	}
	// The plain store sees the row with its node.
	all, err := c.(store.Store).Sandboxes(ctx)
	if err != nil || len(all) != 1 || all[0].Node != "a" || all[0].CPUs != 2 {
		t.Fatalf("Sandboxes: %+v %v", all, err)
	}
	sb.Status = "paused"
	if err := c.PutSandboxFenced(ctx, fa, sb, nil); err != nil {
		t.Fatalf("update: %v", err)
	}
	if o, err := c.SandboxOwner(ctx, "sb-1"); err != nil || o.Status != "paused" || o.Node != "a" {
		t.Fatalf("owner after update: %+v %v", o, err)
	}
	// Another node's row is not b's to write or delete.
	if err := c.PutSandboxFenced(ctx, fb, sb, nil); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("put another node's row: %v, want ErrConflict", err)
	}
	if err := c.DeleteSandboxFenced(ctx, fb, "sb-1"); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("delete another node's row: %v, want ErrConflict", err)
	}
	if o, err := c.SandboxOwner(ctx, "sb-1"); err != nil || o.Node != "a" {
		t.Fatalf("owner after b's refused writes: %+v %v", o, err)
	}
	// A stale incarnation is fenced, even for a row of its own node.
	stale := store.Fence{Node: "a", Incarnation: fa.Incarnation - 1}
	if err := c.PutSandboxFenced(ctx, stale, sb, nil); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("put with a stale fence: %v, want ErrFenced", err)
	}
	if err := c.PutSandboxFenced(ctx, store.Fence{Node: "nobody", Incarnation: 1}, sandboxOn(p, "sb-2", "running", 1, 1), nil); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("put by an unknown node: %v, want ErrFenced", err)
	}
	if err := c.DeleteSandboxFenced(ctx, fa, "sb-1"); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteSandboxFenced(ctx, fa, "sb-1"); err != nil {
		t.Fatalf("delete a missing row: %v", err)
	}
	if _, err := c.SandboxOwner(ctx, "sb-1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("owner of a deleted row: %v, want ErrNotFound", err)
	}
}

// twoNodes registers node a through ca and node b through cb, and makes
// a second project.
func twoNodes(t *testing.T, ctx context.Context, ca, cb store.Cluster) (fa, fb store.Fence, q store.Project) {
	t.Helper()
	var err error
	if fa, err = ca.RegisterNode(ctx, nodeInfo("a"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if fb, err = cb.RegisterNode(ctx, nodeInfo("b"), time.Hour); err != nil {
		t.Fatal(err)
	}
	if q, err = ca.(store.Store).CreateProject(ctx, "other", ""); err != nil {
		t.Fatal(err)
	}
	return fa, fb, q
}

// holding is the admission's statuses that hold vCPUs and memory.
var holding = []string{"creating", "running", "resuming"}

func testAdmission(t *testing.T, ctx context.Context, open func() store.Cluster, p store.Project) {
	c := open()
	fa, fb, q := twoNodes(t, ctx, c, c)
	node := store.Admission{Holding: holding, NodeVCPUs: 4, NodeMemoryMB: 4096, MaxSandboxes: 3}
	put := func(f store.Fence, sb store.Sandbox, a store.Admission) error {
		return c.PutSandboxFenced(ctx, f, sb, &a)
	}
	exceeded := func(err error, class error, unit string) bool {
		var ex *errdefs.Exceeded
		return errors.Is(err, class) && errors.As(err, &ex) && ex.Unit == unit
	}
	// Node capacity: vCPUs.
	if err := put(fa, sandboxOn(p, "a1", "running", 2, 1024), node); err != nil {
		t.Fatal(err)
	}
	if err := put(fa, sandboxOn(q, "a2", "creating", 2, 1024), node); err != nil {
		t.Fatal(err)
	}
	if err := put(fa, sandboxOn(p, "a3", "creating", 1, 256), node); !exceeded(err, errdefs.ErrCapacity, "vcpu") {
		t.Fatalf("over the node's vCPUs: %v, want ErrCapacity vcpu", err)
	}
	// An update of a row that already holds needs nothing more.
	if err := put(fa, sandboxOn(q, "a2", "running", 2, 1024), node); err != nil {
		t.Fatalf("creating → running: %v", err)
	}
	// Pausing frees vCPUs and memory, not the sandbox's place.
	if err := put(fa, sandboxOn(p, "a1", "paused", 2, 1024), node); err != nil {
		t.Fatal(err)
	}
	if err := put(fa, sandboxOn(p, "a3", "creating", 2, 1024), node); err != nil {
		t.Fatalf("create into freed vCPUs: %v", err)
	}
	// Resuming the paused one needs its vCPUs back.
	if err := put(fa, sandboxOn(p, "a1", "resuming", 2, 1024), node); !exceeded(err, errdefs.ErrCapacity, "vcpu") {
		t.Fatalf("resume over the node's vCPUs: %v, want ErrCapacity", err)
	}
	// The sandbox count: three live on a (one paused).
	if err := put(fa, sandboxOn(p, "a4", "paused", 0, 0), node); !exceeded(err, errdefs.ErrCapacity, "sandboxes") {
		t.Fatalf("over the node's sandboxes: %v, want ErrCapacity sandboxes", err)
	}
	// Node b is another node: its own capacity.
	if err := put(fb, sandboxOn(p, "b1", "running", 4, 4096), node); err != nil {
		t.Fatalf("create on b: %v", err)
	}
	memNode := node
	memNode.NodeVCPUs = 0
	if err := put(fb, sandboxOn(q, "b2", "running", 1, 1), memNode); !exceeded(err, errdefs.ErrCapacity, "memory-gb") {
		t.Fatalf("over b's memory: %v, want ErrCapacity memory-gb", err)
	}
	// Without admission nothing is checked.
	if err := c.PutSandboxFenced(ctx, fb, sandboxOn(q, "b3", "running", 64, 1<<20), nil); err != nil {
		t.Fatalf("put without admission: %v", err)
	}
	if err := c.DeleteSandboxFenced(ctx, fb, "b3"); err != nil {
		t.Fatal(err)
	}

	// Project limits count every node: p holds 6 vCPUs, a3 (2) on a and b1
	// (4) on b (a1 is paused).
	proj := store.Admission{Holding: holding, Limits: store.Limits{VCPUs: 6}}
	if err := put(fb, sandboxOn(p, "b4", "running", 1, 1), proj); !exceeded(err, errdefs.ErrQuota, "vcpu") {
		t.Fatalf("over the project's vCPUs across nodes: %v, want ErrQuota", err)
	}
	if err := put(fb, sandboxOn(q, "b4", "running", 1, 1), proj); err != nil {
		t.Fatalf("another project: %v", err)
	}
	proj.Limits = store.Limits{Sandboxes: 3}
	if err := put(fb, sandboxOn(p, "b5", "paused", 0, 0), proj); !exceeded(err, errdefs.ErrQuota, "sandboxes") {
		t.Fatalf("over the project's sandboxes across nodes: %v, want ErrQuota", err)
	}
	proj.Limits = store.Limits{MemoryGB: 6} // p holds 1 + 4 GiB
	if err := put(fb, sandboxOn(p, "b5", "running", 0, 2048), proj); !exceeded(err, errdefs.ErrQuota, "memory-gb") {
		t.Fatalf("over the project's memory across nodes: %v, want ErrQuota", err)
	}
	// Lost rows hold nothing: once a is removed, p holds only b1.
	if err := c.RemoveNode(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	proj.Limits = store.Limits{Sandboxes: 2, VCPUs: 6}
	if err := put(fb, sandboxOn(p, "b5", "running", 2, 1024), proj); err != nil {
		t.Fatalf("create after the other node's rows were lost: %v", err)
	}
	if n := NodeOf(t, ctx, c, "b"); n.Sandboxes != 3 || n.ReservedVCPUs != 7 || n.ReservedMemoryMB != 4096+1+1024 {
		t.Fatalf("node b's reservations: %+v", n)
	}
}

// testAdmissionRace: many writers on two nodes, each node with its own
// handle on the database, race for the last room of one node and of one
// project: exactly the room is granted.
func testAdmissionRace(t *testing.T, ctx context.Context, open func() store.Cluster, p store.Project) {
	ca, cb := open(), open()
	fa, fb, q := twoNodes(t, ctx, ca, cb)
	const writers = 16
	race := func(name string, room int, put func(i int) error) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make([]error, writers)
		for i := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = put(i)
			}()
		}
		wg.Wait()
		granted := 0
		for i, err := range errs {
			var ex *errdefs.Exceeded
			switch {
			case err == nil:
				granted++
			case !errors.As(err, &ex):
				t.Errorf("%s: writer %d: %v, want a refusal for the limit", name, i, err)
			}
		}
		if granted != room {
			t.Fatalf("%s: %d of %d writers admitted, want exactly %d", name, granted, writers, room)
		}
	}
	// The project's last 3 sandboxes, raced for from both nodes.
	proj := &store.Admission{Holding: holding, Limits: store.Limits{Sandboxes: 5}}
	for i := range 2 {
		if err := ca.PutSandboxFenced(ctx, fa, sandboxOn(p, fmt.Sprintf("pre%d", i), "running", 1, 1), proj); err != nil {
			t.Fatal(err)
		}
	}
	race("project", 3, func(i int) error {
		c, f := ca, fa
		if i%2 == 1 {
			c, f = cb, fb
		}
		return c.PutSandboxFenced(ctx, f, sandboxOn(p, fmt.Sprintf("p%d", i), "creating", 1, 1), proj)
	})
	// Node c's 4 vCPUs, raced for by two projects through two handles
	// (a server's connections).
	fc, err := cb.RegisterNode(ctx, nodeInfo("c"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	node := &store.Admission{Holding: holding, NodeVCPUs: 4}
	race("node", 2, func(i int) error {
		c, pr := ca, p
		if i%2 == 1 {
			c, pr = cb, q
		}
		return c.PutSandboxFenced(ctx, fc, sandboxOn(pr, fmt.Sprintf("n%d", i), "running", 2, 1), node)
	})
	if n := NodeOf(t, ctx, ca, "c"); n.ReservedVCPUs != 4 || n.Sandboxes != 2 {
		t.Fatalf("node c after the race: %+v", n)
	}
}

// durablePaused is a paused row whose image is durable in the object store.
func durablePaused(p store.Project, id string) store.Sandbox {
	sb := sandboxOn(p, id, store.SandboxPaused, 1, 512)
	sb.Spec = []byte(`{"id":"` + id + `","` + store.DurableKey + `":"2026-01-01T00:00:00Z"}`)
	return sb
}

// testOrphans: a node's durable paused sandboxes survive its death or
// removal, ownerless, and one node takes each over, admitted there.
func testOrphans(t *testing.T, ctx context.Context, open func() store.Cluster, p store.Project) {
	c := open()
	var fences []store.Fence
	for _, name := range []string{"a", "b", "c"} {
		info := nodeInfo(name)
		if name == "b" {
			info.MaxSandboxes = 1
		}
		f, err := c.RegisterNode(ctx, info, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		fences = append(fences, f)
	}
	fa, fb, fc := fences[0], fences[1], fences[2]
	for _, sb := range []store.Sandbox{
		durablePaused(p, "sb-d1"), durablePaused(p, "sb-d2"),
		sandboxOn(p, "sb-p", store.SandboxPaused, 1, 512), // paused, not durable yet
		sandboxOn(p, "sb-r", "running", 1, 512),
	} {
		if err := c.PutSandboxFenced(ctx, fa, sb, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.PutSandboxFenced(ctx, fb, sandboxOn(p, "sb-b", "running", 1, 512), nil); err != nil {
		t.Fatal(err)
	}
	if err := open().RemoveNode(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"sb-p", "sb-r"} {
		if o, err := c.SandboxOwner(ctx, id); err != nil || !o.Lost || o.Orphaned() || o.Node != "a" {
			t.Fatalf("owner of a removed node's sandbox %s that is not durable: %+v %v", id, o, err)
		}
	}
	for _, id := range []string{"sb-d1", "sb-d2"} {
		if o, err := c.SandboxOwner(ctx, id); err != nil || o.Lost || !o.Orphaned() || o.Status != store.SandboxPaused || o.ProjectID != p.ID || o.Template != "base" {
			t.Fatalf("owner of a removed node's durable paused sandbox %s: %+v %v", id, o, err)
		}
	}
	if sbs, err := c.SandboxesOn(ctx, "a"); err != nil || len(sbs) != 2 {
		t.Fatalf("rows left on the removed node: %+v %v", sbs, err)
	}
	// The removed incarnation cannot take its sandbox back.
	if err := c.PutSandboxFenced(ctx, fa, durablePaused(p, "sb-d1"), nil); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("put by the removed node: %v, want ErrFenced", err)
	}
	admit := &store.Admission{Holding: []string{"running", "creating"}, MaxSandboxes: 1}
	// b is full (one sandbox of one): taking an orphan is admitted as a new
	// sandbox there.
	sb := durablePaused(p, "sb-d1")
	sb.Status = "creating"
	if err := c.PutSandboxFenced(ctx, fb, sb, admit); !errors.Is(err, errdefs.ErrCapacity) {
		t.Fatalf("take an orphan over on a full node: %v, want ErrCapacity", err)
	}
	if o, err := c.SandboxOwner(ctx, "sb-d1"); err != nil || !o.Orphaned() {
		t.Fatalf("orphan after a refused take-over: %+v %v", o, err)
	}
	// Two nodes race for each orphan: exactly one takes it.
	for _, id := range []string{"sb-d1", "sb-d2"} {
		sb := durablePaused(p, id)
		sb.Status = "creating"
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for i, f := range []store.Fence{fc, fb} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = open().PutSandboxFenced(ctx, f, sb, &store.Admission{Holding: []string{"running", "creating"}})
			}()
		}
		wg.Wait()
		won := 0
		for _, err := range errs {
			switch {
			case err == nil:
				won++
			case !errors.Is(err, errdefs.ErrConflict):
				t.Fatalf("take-over of %s that lost the race: %v, want ErrConflict", id, err)
			}
		}
		o, err := c.SandboxOwner(ctx, id)
		if won != 1 || err != nil || o.Orphaned() || o.Status != "creating" || (o.Node != "b" && o.Node != "c") {
			t.Fatalf("take-over of %s: %d won (%v), owner %+v %v", id, won, errs, o, err)
		}
		other := fb
		if o.Node == "b" {
			other = fc
		}
		if err := c.PutSandboxFenced(ctx, other, sb, nil); !errors.Is(err, errdefs.ErrConflict) {
			t.Fatalf("put of a taken-over sandbox by another node: %v, want ErrConflict", err)
		}
	}
	// A node declared dead orphans the same way.
	fd, err := c.RegisterNode(ctx, nodeInfo("d"), 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.PutSandboxFenced(ctx, fd, durablePaused(p, "sb-d3"), nil); err != nil {
		t.Fatal(err)
	}
	waitState(t, ctx, c, "d", store.NodeSuspect)
	for done := false; !done; {
		if done, err = c.DeclareDead(ctx, "d", 0); err != nil {
			t.Fatal(err)
		}
	}
	if o, err := c.SandboxOwner(ctx, "sb-d3"); err != nil || !o.Orphaned() || o.Status != store.SandboxPaused {
		t.Fatalf("durable paused sandbox of a dead node: %+v %v", o, err)
	}

	// A live node lets its durable paused sandboxes go (drain --move).
	if err := c.SetMoving(ctx, "nobody", true); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("move an unknown node: %v, want ErrNotFound", err)
	}
	if err := c.SetMoving(ctx, "c", true); err != nil {
		t.Fatal(err)
	}
	if n := NodeOf(t, ctx, c, "c"); !n.Moving || !n.Draining || n.State != store.NodeDraining {
		t.Fatalf("node asked to move: %+v", n)
	}
	for _, sb := range []store.Sandbox{durablePaused(p, "sb-m"), sandboxOn(p, "sb-n", store.SandboxPaused, 1, 512)} {
		if err := c.PutSandboxFenced(ctx, fc, sb, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.ReleaseSandbox(ctx, fc, "sb-n"); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("release a sandbox not durable: %v, want ErrConflict", err)
	}
	if err := c.ReleaseSandbox(ctx, fb, "sb-m"); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("release another node's sandbox: %v, want ErrConflict", err)
	}
	if err := c.ReleaseSandbox(ctx, fa, "sb-m"); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("release by a removed node: %v, want ErrFenced", err)
	}
	if err := c.ReleaseSandbox(ctx, fc, "sb-m"); err != nil {
		t.Fatal(err)
	}
	if o, err := c.SandboxOwner(ctx, "sb-m"); err != nil || !o.Orphaned() {
		t.Fatalf("released sandbox: %+v %v", o, err)
	}
	if err := c.SetMoving(ctx, "c", false); err != nil {
		t.Fatal(err)
	}
	if n := NodeOf(t, ctx, c, "c"); n.Moving || !n.Draining {
		t.Fatalf("node done moving: %+v, want draining still", n)
	}
	c.SetMoving(ctx, "c", true)
	if err := c.SetDraining(ctx, "c", false); err != nil {
		t.Fatal(err)
	}
	if n := NodeOf(t, ctx, c, "c"); n.Moving || n.Draining {
		t.Fatalf("drain undone: %+v", n)
	}
}

// testAdoptPool: a snapshot's warm pool is kept by its node until another
// node adopts it, fenced and only from the node that keeps it now; a
// PutSnapshot of the spec leaves the pool where it is.
func testAdoptPool(t *testing.T, ctx context.Context, open func() store.Cluster, p store.Project) {
	c := open()
	st := c.(store.Store)
	var fences []store.Fence
	for _, name := range []string{"a", "b", "c"} {
		f, err := c.RegisterNode(ctx, nodeInfo(name), time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		fences = append(fences, f)
	}
	fa, fb, fc := fences[0], fences[1], fences[2]
	if err := st.PutSnapshot(ctx, store.Snapshot{ID: "snap-1", ProjectID: p.ID, Node: "a", Spec: []byte(`{"poolSize":2}`), CreatedAt: ts(1)}); err != nil {
		t.Fatal(err)
	}
	pool := func() store.Snapshot {
		t.Helper()
		sns, err := st.Snapshots(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, sn := range sns {
			if sn.ID == "snap-1" {
				return sn
			}
		}
		t.Fatalf("snap-1 not in %+v", sns)
		return store.Snapshot{}
	}
	if sn := pool(); sn.PoolNode != "" || sn.KeepsPool() != "a" {
		t.Fatalf("new snapshot: pool node %q, keeps %q; want \"\", a", sn.PoolNode, sn.KeepsPool())
	}
	// Only from the node that keeps it.
	if err := c.AdoptPool(ctx, fb, "snap-1", "c"); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("adopt from a node that does not keep it: %v, want ErrConflict", err)
	}
	if err := c.AdoptPool(ctx, fb, "snap-none", "a"); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("adopt the pool of an unknown snapshot: %v, want ErrConflict", err)
	}
	// Two nodes adopt it from a at once: one wins.
	errs := make(chan error, 2)
	for _, f := range []store.Fence{fb, fc} {
		go func() { errs <- open().AdoptPool(ctx, f, "snap-1", "a") }()
	}
	won := 0
	for range 2 {
		err := <-errs
		switch {
		case err == nil:
			won++
		case !errors.Is(err, errdefs.ErrConflict):
			t.Fatalf("racing adoption: %v, want nil or ErrConflict", err)
		}
	}
	if won != 1 {
		t.Fatalf("%d of two racing adoptions won, want 1", won)
	}
	winner := pool().KeepsPool()
	if winner != "b" && winner != "c" || pool().Node != "a" {
		t.Fatalf("after the race: %+v", pool())
	}
	// A spec update keeps the pool where it is and the snapshot on a.
	if err := st.PutSnapshot(ctx, store.Snapshot{ID: "snap-1", ProjectID: p.ID, Node: winner, Spec: []byte(`{"poolSize":3}`), CreatedAt: ts(1)}); err != nil {
		t.Fatal(err)
	}
	if sn := pool(); sn.KeepsPool() != winner || sn.Node != "a" || !strings.Contains(string(sn.Spec), "3") {
		t.Fatalf("after a spec update: %+v", sn)
	}
	// A stale incarnation of a adopts nothing, the current one adopts it
	// back.
	fa2, err := c.RegisterNode(ctx, nodeInfo("a"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.AdoptPool(ctx, fa, "snap-1", winner); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("adopt with a stale fence: %v, want ErrFenced", err)
	}
	if err := c.AdoptPool(ctx, fa2, "snap-1", winner); err != nil {
		t.Fatal(err)
	}
	if sn := pool(); sn.KeepsPool() != "a" {
		t.Fatalf("adopted back by a: %+v", sn)
	}
	// A removed node adopts nothing.
	if err := c.RemoveNode(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if err := c.AdoptPool(ctx, fb, "snap-1", "a"); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("adopt by a removed node: %v, want ErrFenced", err)
	}
}
