package e2e

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/store/postgres"
)

// Warm pools across nodes (docs/CLUSTER.md, the failure table): a
// snapshot's pool is rebuilt on another node when its node is drained with
// --move, and serves restores there.

// poolInfo is what the tests read of a snapshot.
type poolInfo struct {
	PoolSize   int `json:"poolSize"`
	ReadyCount int `json:"readyCount"`
}

// waitPool waits until GET of snapshot id through via says ready warm
// copies (a retryable 503 while routing catches up is waited out).
func (c *testCluster) waitPool(via *clusterNode, id string, ready int) {
	c.t.Helper()
	deadline := time.Now().Add(budget(3 * time.Minute))
	for {
		var info poolInfo
		code, body := via.do("GET", "/api/sandbox-snapshots/"+id, nil, &info)
		if code == http.StatusOK && info.ReadyCount == ready {
			return
		}
		if code != http.StatusOK && code != http.StatusServiceUnavailable || time.Now().After(deadline) {
			c.t.Fatalf("snapshot %s through %s: %d %s, want %d ready", id, via.name, code, body, ready)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// snapshotRow is snapshot id's row in the cluster's database.
func (c *testCluster) snapshotRow(db *postgres.Store, id string) (store.Snapshot, bool) {
	c.t.Helper()
	sns, err := db.Snapshots(context.Background())
	if err != nil {
		c.t.Fatal(err)
	}
	for _, sn := range sns {
		if sn.ID == id {
			return sn, true
		}
	}
	return store.Snapshot{}, false
}

// pooledOn lists the warm copies node has in the database.
func (c *testCluster) pooledOn(db *postgres.Store, node string) []string {
	c.t.Helper()
	rows, err := db.SandboxesOn(context.Background(), node)
	if err != nil {
		c.t.Fatal(err)
	}
	var ids []string
	for _, r := range rows {
		if r.Status == "pooled" {
			ids = append(ids, r.ID)
		}
	}
	return ids
}

// waitNoneWarm waits until node has no warm copy in the database. A pool
// set to 0 says readyCount 0 at once, but a copy its refill was making
// then is recorded pooled once made and only then destroyed (the refill
// trims after each copy, sandbox.fillPool): its row goes when runsc let it
// go, which on a slow machine takes seconds.
func (c *testCluster) waitNoneWarm(db *postgres.Store, node string) {
	c.t.Helper()
	for deadline := time.Now().Add(budget(30 * time.Second)); ; time.Sleep(250 * time.Millisecond) {
		got := c.pooledOn(db, node)
		if len(got) == 0 {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("warm copies left on %s %v after poolSize 0: %v", node, budget(30*time.Second), got)
		}
	}
}

// pooledSnapshot takes, through b, a durable snapshot of a sandbox on a
// running the counter, with a warm pool of 2 (ready when it returns), and
// kills the source. It returns a client of the cluster's database, the
// snapshot and the counter's pid and value when it was taken.
func (c *testCluster) pooledSnapshot() (db *postgres.Store, snap snapshotRef, pid, n int) {
	t, b := c.t, c.node("b")
	t.Helper()
	db, err := postgres.Open(context.Background(), c.db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	src := c.createOn(b, "a")
	b.sh(t, src, counterScript)
	pid, n = b.counter(t, src)
	snap = b.durablePooledSnapshot(t, src, "pool", 2)
	c.waitPool(b, snap.ID, 2)
	return db, snap, pid, n
}

// TestClusterPoolMoves: a durable snapshot with a counter process, taken
// on a with a warm pool of 2; a is drained with --move: another node
// adopts the pool and refills it from the object store (readyCount 2
// through every node); the official SDK restores through the third node
// and gets a warm copy of the pool's node, the counter going on from the
// snapshot's value; poolSize 0 releases the copies there; a delete
// through any node removes the pool's cache on its node; nothing is left
// on any node or in the object store.
func TestClusterPoolMoves(t *testing.T) {
	c, st := startDurableCluster(t, 3)
	a, b := c.node("a"), c.node("b")
	db, snap, pid, n := c.pooledSnapshot()
	if got := c.pooledOn(db, "a"); len(got) != 2 {
		t.Fatalf("warm copies on a: %v, want 2", got)
	}

	out := c.nodesCLI("drain", "a", "--move")
	t.Logf("drain --move:\n%s", out)
	if !strings.Contains(out, "moved all its sandboxes") || strings.Count(out, "a warm copy, released") != 2 {
		t.Fatalf("drain --move output: %s", out)
	}
	row, ok := c.snapshotRow(db, snap.ID)
	if !ok || row.Node != "a" || row.KeepsPool() == "a" {
		t.Fatalf("snapshot row after the move: %+v (found %v), want a's snapshot with its pool on b or c", row, ok)
	}
	pool := c.node(row.KeepsPool())
	other := c.node(map[string]string{"b": "c", "c": "b"}[pool.name])
	t.Logf("the pool moved to %s; restoring through %s", pool.name, other.name)
	for _, via := range c.nodes {
		c.waitPool(via, snap.ID, 2)
	}
	a.waitNoLeaks(t) // its copies went
	warm := c.pooledOn(db, pool.name)
	if len(warm) != 2 {
		t.Fatalf("warm copies on %s: %v, want 2", pool.name, warm)
	}

	ctx, cancel := context.WithTimeout(context.Background(), budget(5*time.Minute))
	defer cancel()
	outFile := filepath.Join(t.TempDir(), "restored")
	env := []string{"POOL_SNAPSHOT=" + snap.ID, "POOL_PID=" + strconv.Itoa(pid), "POOL_N=" + strconv.Itoa(n), "POOL_OUT=" + outFile}
	if err := other.runNodeEnv(ctx, env, "js/move/pool.test.mjs"); err != nil {
		t.Fatalf("restore through %s with the SDK: %v", other.name, err)
	}
	id, err := os.ReadFile(outFile)
	if err != nil {
		t.Fatal(err)
	}
	if w := c.where(b, string(id)); w != pool.name || !slices.Contains(warm, string(id)) {
		t.Fatalf("restored copy %s on %s, want one of the warm copies %v on the pool's node %s", id, w, warm, pool.name)
	}
	c.waitNoneWarm(db, pool.name)

	// A delete through a node that neither holds the snapshot nor keeps
	// its pool (routed to a, which drops the pool on its node).
	if code, body := other.do("DELETE", "/api/sandbox-snapshots/"+snap.ID, nil, nil); code >= 300 {
		t.Fatalf("delete snapshot through %s: %d %s", other.name, code, body)
	}
	if code, body := b.do("GET", "/api/sandbox-snapshots/"+snap.ID, nil, nil); code != http.StatusNotFound {
		t.Fatalf("snapshot after its delete: %d %s", code, body)
	}
	if _, err := os.Stat(filepath.Join(pool.dataDir, "snapshots", snap.ID)); !os.IsNotExist(err) {
		t.Fatalf("the pool's cached image on %s after the delete: %v", pool.name, err)
	}
	c.killAll(b)
	waitNoObjects(t, st)
}

// TestClusterPoolLostNode: the warm pool of a durable snapshot whose node
// a is killed (kill -9) and removed is adopted by another node, which
// refills it from the object store (readyCount 2 through any node); a
// restore through the third node claims a warm copy there, the counter
// going on from the snapshot's value; poolSize 0 releases the copies; the
// snapshot, deleted through any node, leaves nothing on any node (a,
// started again, destroys its old copies) or in the object store.
func TestClusterPoolLostNode(t *testing.T) {
	c, st := startDurableCluster(t, 3)
	a, b := c.node("a"), c.node("b")
	db, snap, pid, n := c.pooledSnapshot()

	a.crash()
	c.nodesCLI("remove", "a")
	c.waitState("a", "removed")
	c.waitPool(b, snap.ID, 2)
	row, ok := c.snapshotRow(db, snap.ID)
	if !ok || row.KeepsPool() != "b" && row.KeepsPool() != "c" {
		t.Fatalf("snapshot row after a was removed: %+v (found %v), want its pool on b or c", row, ok)
	}
	pool := c.node(row.KeepsPool())
	other := c.node(map[string]string{"b": "c", "c": "b"}[pool.name])
	t.Logf("the pool was adopted by %s; restoring through %s", pool.name, other.name)
	c.waitPool(other, snap.ID, 2)
	warm := c.pooledOn(db, pool.name)
	if len(warm) != 2 {
		t.Fatalf("warm copies on %s: %v, want 2", pool.name, warm)
	}

	var cp sandboxInfo
	if code, body := other.do("POST", "/api/sandboxes", map[string]any{"snapshotId": snap.ID}, &cp); code >= 300 {
		t.Fatalf("restore through %s: %d %s", other.name, code, body)
	}
	if w := c.where(other, cp.SandboxID); w != pool.name || !slices.Contains(warm, cp.SandboxID) {
		t.Fatalf("restored copy %s on %s, want one of the warm copies %v on the pool's node %s", cp.SandboxID, w, warm, pool.name)
	}
	if pid2, n2 := other.counter(t, cp.SandboxID); pid2 != pid || n2 < n {
		t.Fatalf("restored copy: counter pid %d at %d, want the snapshot's pid %d from %d", pid2, n2, pid, n)
	}
	c.waitPool(b, snap.ID, 2) // refilled after the claim
	if code, body := other.do("PATCH", "/api/sandbox-snapshots/"+snap.ID, map[string]any{"poolSize": 0}, nil); code != 200 {
		t.Fatalf("poolSize 0 through %s: %d %s", other.name, code, body)
	}
	c.waitPool(b, snap.ID, 0)
	c.waitNoneWarm(db, pool.name)
	if code, body := b.do("DELETE", "/api/sandbox-snapshots/"+snap.ID, nil, nil); code >= 300 {
		t.Fatalf("delete snapshot through b: %d %s", code, body)
	}
	if _, err := os.Stat(filepath.Join(pool.dataDir, "snapshots", snap.ID)); !os.IsNotExist(err) {
		t.Fatalf("the pool's cached image on %s after the delete: %v", pool.name, err)
	}
	// a comes back anyway: fenced, it destroys the copies it held.
	a.start()
	a.waitNoLeaks(t)
	c.killAll(b)
	waitNoObjects(t, st)
}
