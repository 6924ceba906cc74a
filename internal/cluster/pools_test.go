package cluster

import (
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/lizard-build/lizard/internal/api"
	"github.com/lizard-build/lizard/internal/sandbox/snapshot"
	"github.com/lizard-build/lizard/internal/store"
)

func poolSnap(id, node, poolNode, spec string) store.Snapshot {
	return store.Snapshot{ID: id, ProjectID: "p1", Node: node, PoolNode: poolNode, Spec: []byte(spec)}
}

const durablePool = `{"template":"base","poolSize":2,"durableAt":"2026-01-01T00:00:00Z"}`

// TestOrphanedPools: only movable pools (some copies, not paused, no
// volume, a durable image) whose keeper is dead, removed or unknown are
// up for adoption; the keeper is the pool node, else the snapshot's.
func TestOrphanedPools(t *testing.T) {
	nodes := []store.Node{
		node("a", store.NodeDead, 10, 0), node("b", store.NodeReady, 10, 0),
		node("c", store.NodeRemoved, 10, 0), node("d", store.NodeSuspect, 10, 0),
	}
	sns := []store.Snapshot{
		poolSnap("on-dead", "a", "", durablePool),
		poolSnap("adopted-by-live", "a", "b", durablePool),
		poolSnap("kept-by-removed", "b", "c", durablePool),
		poolSnap("on-suspect", "d", "", durablePool), // not yet dead: it may come back
		poolSnap("on-unknown", "zz", "", durablePool),
		poolSnap("not-durable", "a", "", `{"template":"base","poolSize":2}`),
		poolSnap("no-pool", "a", "", `{"template":"base","poolSize":0,"durableAt":"2026-01-01T00:00:00Z"}`),
		poolSnap("paused", "a", "", `{"template":"base","poolSize":2,"poolPaused":true,"durableAt":"2026-01-01T00:00:00Z"}`),
		poolSnap("volume", "a", "", `{"template":"base","poolSize":2,"volumeId":"vol_1","durableAt":"2026-01-01T00:00:00Z"}`),
		poolSnap("unreadable", "a", "", `{`),
	}
	var got []string
	for _, sn := range orphanedPools(nodes, sns) {
		got = append(got, sn.ID)
	}
	if want := []string{"on-dead", "kept-by-removed", "on-unknown"}; !slices.Equal(got, want) {
		t.Fatalf("orphaned pools %v, want %v", got, want)
	}
}

// TestPoolCandidates: the adopter is ready, not draining, of the build,
// not the node skipped; every node computes the same order whatever the
// order it lists the nodes in.
func TestPoolCandidates(t *testing.T) {
	mk := func(name, build string, reserved float64) store.Node {
		n := node(name, store.NodeReady, 10, reserved, "base")
		n.RunscBuild = build
		return n
	}
	draining := mk("drain", "b1", 0)
	draining.Draining = true
	nodes := []store.Node{mk("a", "b1", 0), mk("b", "b1", 5), mk("c", "b1", 1), mk("old", "b0", 0), draining,
		node("dead", store.NodeDead, 10, 0, "base")}
	sn := poolSnap("snap-x", "a", "", durablePool)
	first := names(poolCandidates(nodes, sn, poolSpec{Template: "base"}, "b1", "a"))
	if first == "" {
		t.Fatal("no candidates")
	}
	for _, n := range []string{"a", "old", "drain", "dead"} {
		if slices.Contains(strings.Fields(first), n) {
			t.Fatalf("candidates %q include %s", first, n)
		}
	}
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rnd := rand.New(rand.NewPCG(seed, 2))
	for range 20 {
		shuffled := slices.Clone(nodes)
		rnd.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		if got := names(poolCandidates(shuffled, sn, poolSpec{Template: "base"}, "b1", "a")); got != first {
			t.Fatalf("candidates %q from %s, %q from the first order", got, names(shuffled), first)
		}
	}
}

// TestDedupSnapshots: a snapshot listed by its node and by the node that
// keeps its pool appears once, as the pool node lists it.
func TestDedupSnapshots(t *testing.T) {
	info := func(id string, ready int) snapshot.Info {
		return snapshot.Info{Snapshot: snapshot.Snapshot{ID: id}, ReadyCount: ready}
	}
	got := dedupSnapshots([]snapshot.Info{info("s1", 0), info("s2", 1), info("s1", 2), info("s3", 0), info("s2", 0)})
	var ids []string
	for _, sn := range got {
		ids = append(ids, sn.ID)
	}
	if !slices.Equal(ids, []string{"s1", "s2", "s3"}) || got[0].ReadyCount != 2 || got[1].ReadyCount != 1 {
		t.Fatalf("dedup: %+v", got)
	}
}

// TestForwardPoolRoutes: a snapshot whose pool another node keeps is read
// and changed on the pool node, deleted on its own node; each falls back
// to the other when it does not take requests.
func TestForwardPoolRoutes(t *testing.T) {
	b := peer(t, "b", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("from b")) }), nil, nil)
	c := peer(t, "c", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("from c")) }), nil, nil)
	fc := &fakeCluster{nodes: []store.Node{readyNode("a", "127.0.0.1:1"), readyNode("b", addrOf(b)), readyNode("c", addrOf(c))}}
	rows := &fakeRows{snapshots: []store.Snapshot{{ID: "snap1", ProjectID: "p1", Node: "b", PoolNode: "c"}}}
	rt := newTestRouter(t, "a", fc, rows, nil)
	a := front(t, rt)
	check := func(want map[string]string) {
		t.Helper()
		for method, body := range want {
			if _, got := send(t, method, a.URL+"/api/sandbox-snapshots/snap1", "", nil, nil); got != body {
				t.Errorf("%s: %q, want %q", method, got, body)
			}
		}
	}
	check(map[string]string{http.MethodGet: "from c", http.MethodPatch: "from c", http.MethodDelete: "from b"})
	// The pool node's lease lapsed: everything on the snapshot's node.
	fc.set(func(f *fakeCluster) { f.nodes[2].State = store.NodeSuspect })
	rt.dropNodes()
	check(map[string]string{http.MethodGet: "from b", http.MethodDelete: "from b"})
	// The snapshot's node is removed: its pool node answers a delete.
	fc.set(func(f *fakeCluster) { f.nodes[2].State, f.nodes[1].State = store.NodeReady, store.NodeRemoved })
	rt.dropNodes()
	check(map[string]string{http.MethodGet: "from c", http.MethodDelete: "from c"})
}

// TestCreatePoolFirst: a restore goes first to the node keeping the
// snapshot's pool when it has a warm copy ready, else to the snapshot's
// node as before.
func TestCreatePoolFirst(t *testing.T) {
	holder, nHolder := creator(t, "b", http.StatusCreated, `{"sandboxId":"on-b"}`)
	keeper, nKeeper := creator(t, "c", http.StatusCreated, `{"sandboxId":"on-c"}`)
	b, c := node("b", store.NodeReady, 10, 0), node("c", store.NodeReady, 10, 0)
	b.Address, c.Address = addrOf(holder), addrOf(keeper)
	rows := &fakeRows{snapshots: []store.Snapshot{{ID: "snap1", ProjectID: "p1", Node: "b", PoolNode: "c"}}}
	fc := &fakeCluster{nodes: []store.Node{node("a", store.NodeReady, 10, 0), b, c}}
	rt := newTestRouter(t, "a", fc, rows, nil)
	restore := func() string {
		t.Helper()
		a, locals := createFront(t, rt, api.Placement{Snapshot: "snap1"}, nil)
		status, body := post(t, a.URL)
		if status != http.StatusCreated || locals.Load() != 0 {
			t.Fatalf("restore: %d %q, %d made here", status, body, locals.Load())
		}
		return body
	}
	// No warm copy on c (only another snapshot's, and a running one):
	// the snapshot's node.
	fc.set(func(f *fakeCluster) {
		f.rows = map[string][]store.Sandbox{"c": {
			{ID: "x", Status: statusPooled, Spec: []byte(`{"poolOf":"snap2"}`)},
			{ID: "y", Status: "running", Spec: []byte(`{}`)},
		}}
	})
	if got := restore(); got != `{"sandboxId":"on-b"}` {
		t.Fatalf("no warm copy: %s", got)
	}
	fc.set(func(f *fakeCluster) {
		f.rows["c"] = append(f.rows["c"], store.Sandbox{ID: "z", Status: statusPooled, Spec: []byte(`{"poolOf":"snap1"}`)})
	})
	if got := restore(); got != `{"sandboxId":"on-c"}` {
		t.Fatalf("a warm copy on c: %s", got)
	}
	if nHolder.Load() != 1 || nKeeper.Load() != 1 {
		t.Fatalf("b made %d, c %d", nHolder.Load(), nKeeper.Load())
	}
}
