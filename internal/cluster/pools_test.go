package cluster

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/lizard-build/lizard/internal/sandbox"
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
	info := func(id string, ready int) sandbox.SnapshotInfo {
		return sandbox.SnapshotInfo{Snapshot: sandbox.Snapshot{ID: id}, ReadyCount: ready}
	}
	got := dedupSnapshots([]sandbox.SnapshotInfo{info("s1", 0), info("s2", 1), info("s1", 2), info("s3", 0), info("s2", 0)})
	var ids []string
	for _, sn := range got {
		ids = append(ids, sn.ID)
	}
	if !slices.Equal(ids, []string{"s1", "s2", "s3"}) || got[0].ReadyCount != 2 || got[1].ReadyCount != 1 {
		t.Fatalf("dedup: %+v", got)
	}
}
