package e2e

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/cluster"
	"github.com/lizard-build/lizard/internal/objstore"
	"github.com/lizard-build/lizard/internal/objstore/s3"
	"github.com/lizard-build/lizard/internal/objstore/vgwtest"
)

// Durable state that moves between nodes (docs/CLUSTER.md, the failure
// table): the cluster harness's three nodes with a versitygw on the
// cluster's bridge as their object store.

// startDurableCluster starts n nodes with an object store they all reach
// (on the cluster's bridge), and returns the cluster and a client of the
// bucket.
func startDurableCluster(t *testing.T, n int) (*testCluster, objstore.Store) {
	t.Helper()
	c := newTestCluster(t)
	gw := vgwtest.NewOn(t, clusterNet+".1")
	gw.SetEnv(t)
	st, err := s3.Open(gw.URL("lizard"))
	if err != nil {
		t.Fatal(err)
	}
	c.startNodes(n, "--object-store", gw.URL("lizard"))
	return c, st
}

// TestClusterResumeAnywhere: a sandbox paused on a, durable, survives a
// being killed for good (removed): it stays paused, and a resume through
// b brings it back on another node with its processes and memory (the
// counter keeps counting, same pid) and files; its image then leaves the
// object store.
func TestClusterResumeAnywhere(t *testing.T) {
	c, st := startDurableCluster(t, 3)
	a, b := c.node("a"), c.node("b")
	id := c.createOn(b, "a")
	b.sh(t, id, counterScript)
	pid, n := b.counter(t, id)
	if code, body := b.do("POST", "/api/sandboxes/"+id+"/pause", nil, nil); code >= 300 {
		t.Fatalf("pause through b: %d %s", code, body)
	}
	b.waitDurable(t, "/api/sandboxes/"+id)
	if len(keys(t, st, "images/sandboxes/"+id+"/")) == 0 {
		t.Fatalf("no manifest of the pause image in the object store")
	}

	a.crash()
	c.nodesCLI("remove", "a")
	c.waitState("a", "removed")
	// Not lost: paused, any node answers for it (once b's routing has seen
	// a go: until then a retryable 503).
	for deadline := time.Now().Add(budget(30 * time.Second)); ; time.Sleep(200 * time.Millisecond) {
		var info sandboxInfo
		code, body := b.do("GET", "/api/sandboxes/"+id, nil, &info)
		if code == http.StatusOK && info.Status == "paused" {
			break
		}
		if code != http.StatusServiceUnavailable || time.Now().After(deadline) {
			t.Fatalf("get through b after a was removed: %d %s, want paused", code, body)
		}
	}
	// The official SDK, through b: connect, resume, the counter goes on.
	ctx, cancel := context.WithTimeout(context.Background(), budget(5*time.Minute))
	defer cancel()
	env := []string{"MOVE_SANDBOX=" + id, "MOVE_PID=" + strconv.Itoa(pid), "MOVE_N=" + strconv.Itoa(n)}
	if err := b.runNodeEnv(ctx, env, "js/move/resume.test.mjs"); err != nil {
		t.Fatalf("resume through b with the SDK: %v", err)
	}
	if w := c.where(b, id); w != "b" && w != "c" {
		t.Fatalf("resumed on %q, want b or c", w)
	}
	pid2, n2 := b.counter(t, id)
	if pid2 != pid || n2 <= n {
		t.Fatalf("after the resume on another node: counter pid %d at %d, want pid %d past %d", pid2, n2, pid, n)
	}
	if out := c.node("c").sh(t, id, "cat /root/file"); out != "data\n" {
		t.Fatalf("file after the move, through c: %q", out)
	}
	waitRetired(t, st, id) // resumed: its image is only the base of its next pause's

	// a comes back anyway: fenced, it destroys its copy and leaves the
	// sandbox, running elsewhere, alone.
	a.start()
	a.waitNoLeaks(t)
	if out := b.sh(t, id, "echo ok"); out != "ok\n" {
		t.Fatalf("the moved sandbox after a came back: %q", out)
	}
	c.killAll(b)
	waitNoObjects(t, st)
}

// TestClusterPauseFilesAnywhere: a sandbox paused on a without its memory
// is durable as a memory pause is; with a removed, a resume through b boots
// it on b or c over its files (its processes ended); its image is then
// retired (the base of its next pause), and leaves the object store with
// the sandbox.
func TestClusterPauseFilesAnywhere(t *testing.T) {
	c, st := startDurableCluster(t, 3)
	a, b := c.node("a"), c.node("b")
	id := c.createOn(b, "a")
	b.sh(t, id, counterScript+"; rm /etc/motd")
	pid, _ := b.counter(t, id)
	if code, body := b.do("POST", "/api/sandboxes/"+id+"/pause", map[string]any{"memory": false}, nil); code >= 300 {
		t.Fatalf("files-only pause through b: %d %s", code, body)
	}
	b.waitDurable(t, "/api/sandboxes/"+id)
	a.crash()
	c.nodesCLI("remove", "a")
	c.waitState("a", "removed")
	for deadline := time.Now().Add(budget(30 * time.Second)); ; time.Sleep(200 * time.Millisecond) {
		var info sandboxInfo
		code, body := b.do("POST", "/api/sandboxes/"+id+"/resume", nil, &info)
		if code == http.StatusOK && info.Status == "running" {
			break
		}
		if code != http.StatusServiceUnavailable || time.Now().After(deadline) {
			t.Fatalf("resume through b after a was removed: %d %s, want running", code, body)
		}
	}
	if w := c.where(b, id); w != "b" && w != "c" {
		t.Fatalf("resumed on %q, want b or c", w)
	}
	out := c.node("c").sh(t, id, "cat /root/file; test -e /etc/motd && echo motd back; "+counterAlive(pid)+"; true")
	if out != "data\n" {
		t.Fatalf("after the files-only resume on another node: %q, want the file, /etc/motd still deleted and the counter ended", out)
	}
	waitRetired(t, st, id)
	// a comes back: fenced, it removes its copy.
	a.start()
	a.waitNoLeaks(t)
	c.killAll(b)
	waitNoObjects(t, st)
}

// previewOK checks that the preview of hostname answers through every
// node. A client reconnects: right after a move, a node that cached the
// old owner may answer a 401 (the old owner's proxy no longer knows the
// sandbox), and finds the new owner on the next request; on a loaded
// machine the new owner may not have settled yet either (a 404, 502 or
// 503 for a moment), so each node gets a few seconds of tries. Each
// answer that is not the app's is logged.
func (c *testCluster) previewOK(hostname, token string) {
	c.t.Helper()
	for _, n := range c.nodes {
		if n.cmd == nil {
			continue // not running
		}
		deadline := time.Now().Add(budget(10 * time.Second))
		for try := 1; ; try++ {
			resp := n.preview(c.t, "GET", hostname, "/hello", http.Header{"X-Lizard-Access-Token": {token}}, nil)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && strings.Contains(string(body), "/hello") {
				break
			}
			switch resp.StatusCode {
			case http.StatusUnauthorized, http.StatusNotFound, http.StatusBadGateway, http.StatusServiceUnavailable:
				if time.Now().Before(deadline) {
					c.t.Logf("preview through node %s (try %d): %d %s; trying again", n.name, try, resp.StatusCode, body)
					time.Sleep(200 * time.Millisecond)
					continue
				}
			}
			c.t.Fatalf("preview through node %s (try %d): %d %s", n.name, try, resp.StatusCode, body)
		}
	}
}

// TestClusterDrainMove: lizard nodes drain a --move with five running
// sandboxes on a: each is paused, made durable and resumed on b or c with
// its processes (the counters go on, same pids), files and an exposed
// preview (same URL and token, through every node); a is left empty,
// draining, and the object store empty once the sandboxes are killed.
func TestClusterDrainMove(t *testing.T) {
	c, st := startDurableCluster(t, 3)
	a, b := c.node("a"), c.node("b")
	type counted struct {
		id     string
		pid, n int
	}
	// All five on a: b and c take none meanwhile (placement prefers the
	// freest node, so creates would not stack up on a otherwise). A
	// router whose read of the nodes was in flight during the drain
	// keeps the old view for one more DefaultNodesTTL: createOn tries
	// again.
	c.nodesCLI("drain", "b")
	c.nodesCLI("drain", "c")
	time.Sleep(cluster.DefaultNodesTTL + 200*time.Millisecond) // the routers' view of the nodes
	var sbs []counted
	for range 5 {
		id := c.createOn(b, "a")
		b.sh(t, id, counterScript)
		pid, n := b.counter(t, id)
		sbs = append(sbs, counted{id, pid, n})
	}
	c.nodesCLI("drain", "--undo", "b")
	c.nodesCLI("drain", "--undo", "c")
	time.Sleep(cluster.DefaultNodesTTL + 200*time.Millisecond)
	b.startApp(t, sbs[0].id, 8000)
	var ex exposed
	if code, body := b.do("POST", "/api/sandboxes/"+sbs[0].id+"/expose/8000", nil, &ex); code != 200 {
		t.Fatalf("expose: %d %s", code, body)
	}
	c.previewOK(ex.Hostname, ex.AccessToken)

	out := c.nodesCLI("drain", "a", "--move")
	t.Logf("drain --move:\n%s", out)
	if !strings.Contains(out, "moved all its sandboxes") {
		t.Fatalf("drain --move output: %s", out)
	}
	c.waitState("a", "draining")
	for _, sb := range sbs {
		if w := c.where(b, sb.id); w != "b" && w != "c" {
			t.Fatalf("sandbox %s on %q after the move, want b or c", sb.id, w)
		}
		pid, n := b.counter(t, sb.id)
		if pid != sb.pid || n <= sb.n {
			t.Fatalf("sandbox %s after the move: counter pid %d at %d, want pid %d past %d", sb.id, pid, n, sb.pid, sb.n)
		}
		if out := a.sh(t, sb.id, "cat /root/file"); out != "data\n" {
			t.Fatalf("sandbox %s: file after the move, through a: %q", sb.id, out)
		}
	}
	c.previewOK(ex.Hostname, ex.AccessToken)
	a.waitNoLeaks(t)
	if nodes := c.nodesCLI("ls"); !strings.Contains(nodes, "draining") {
		t.Fatalf("a after the move: %s", nodes)
	}
	c.killAll(b)
	waitNoObjects(t, st)
}

// TestClusterMovedThroughOldOwner: a sandbox moved off a (drain --move,
// then resumed through b) lands on b or c and answers through a at once,
// though a and b had just cached a as its owner. A regression test of two
// bugs the cluster bench found: the resume through b went to a (draining,
// it took the sandbox back), and a answered 404 sandbox_not_found until
// its entry expired (cluster.DefaultOwnerTTL). The drain takes one to two
// seconds, so the entries are still fresh when the resume and the GET go
// (internal/cluster's TestForwardOwnerCachedAsSelfLetGo and
// TestForwardResumeAfterReleaseNotToOldOwner cover both without timing).
func TestClusterMovedThroughOldOwner(t *testing.T) {
	c, st := startDurableCluster(t, 3)
	a, b := c.node("a"), c.node("b")
	id := c.createOn(a, "a")
	if code, body := a.do("POST", "/api/sandboxes/"+id+"/pause", nil, nil); code >= 300 {
		t.Fatalf("pause through a: %d %s", code, body)
	}
	a.waitDurable(t, "/api/sandboxes/"+id)
	// Fresh entries on a and b, naming a.
	time.Sleep(cluster.DefaultOwnerTTL)
	for _, n := range []*clusterNode{a, b} {
		if w := c.where(n, id); w != "a" {
			t.Fatalf("sandbox %s on %s before the move (through %s), want a", id, w, n.name)
		}
	}
	start := time.Now()
	c.nodesCLI("drain", "a", "--move")
	if code, body := b.do("POST", "/api/sandboxes/"+id+"/resume", nil, nil); code >= 300 {
		t.Fatalf("resume through b: %d %s", code, body)
	}
	var info struct {
		Node   string `json:"node"`
		Status string `json:"status"`
	}
	code, body := a.do("GET", "/api/sandboxes/"+id, nil, &info)
	t.Logf("GET through a %s after its entry was made", time.Since(start))
	if code != 200 || info.Status != "running" || (info.Node != "b" && info.Node != "c") {
		t.Fatalf("GET through a, the old owner, after the move: %d %s, want it running on b or c", code, body)
	}
	if out := a.sh(t, id, "echo ok"); out != "ok\n" {
		t.Fatalf("exec through a after the move: %q", out)
	}
	c.killAll(b)
	a.waitNoLeaks(t)
	waitNoObjects(t, st)
}

// TestClusterSnapshotAnywhere: a durable snapshot taken on a restores while
// a is down: placed on b or c, which download its image, the copy goes on
// from the snapshot's memory (same pid, the counter past its value).
func TestClusterSnapshotAnywhere(t *testing.T) {
	c, st := startDurableCluster(t, 3)
	a, b := c.node("a"), c.node("b")
	src := c.createOn(b, "a")
	b.sh(t, src, counterScript)
	pid, n := b.counter(t, src)
	snap := b.durableSnapshot(t, src, "anywhere")

	a.crash()
	c.waitState("a", "suspect")
	var cp sandboxInfo
	for deadline := time.Now().Add(budget(30 * time.Second)); ; time.Sleep(200 * time.Millisecond) {
		// A retryable 503 until b's routing has seen a lapse.
		code, body := b.do("POST", "/api/sandboxes", map[string]any{"snapshotId": snap.ID}, &cp)
		if code < 300 {
			break
		}
		if code != http.StatusServiceUnavailable || time.Now().After(deadline) {
			t.Fatalf("restore while the snapshot's node is down: %d %s", code, body)
		}
	}
	if w := c.where(b, cp.SandboxID); w != "b" && w != "c" {
		t.Fatalf("copy on %q, want b or c", w)
	}
	if pid2, n2 := b.counter(t, cp.SandboxID); pid2 != pid || n2 < n {
		t.Fatalf("restored copy: counter pid %d n %d, snapshot's pid %d n >= %d", pid2, n2, pid, n)
	}

	a.start()
	c.waitState("a", "ready")
	for deadline := time.Now().Add(budget(30 * time.Second)); ; time.Sleep(200 * time.Millisecond) {
		// A retryable 503 until b's routing has seen a back.
		code, body := b.do("DELETE", "/api/sandbox-snapshots/"+snap.ID, nil, nil)
		if code < 300 {
			break
		}
		if code != http.StatusServiceUnavailable || time.Now().After(deadline) {
			t.Fatalf("delete snapshot: %d %s", code, body)
		}
	}
	c.killAll(b)
	waitNoObjects(t, st)
}
