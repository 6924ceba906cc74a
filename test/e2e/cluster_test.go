package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/cluster"
)

// The cluster's failure table (docs/CLUSTER.md), one test per row: three
// nodes in network namespaces of their own on one PostgreSQL
// (clusterharness_test.go). Every test ends with nothing left on any node.

// createOn creates a sandbox through via until it lands on node want (the
// others' are killed), so that a test can put a sandbox where it needs
// one; placement is best-of-2, so a few tries suffice.
func (c *testCluster) createOn(via *clusterNode, want string) string {
	c.t.Helper()
	for range 40 {
		id := via.create(c.t)
		if c.where(via, id) == want {
			return id
		}
		if code, body := via.do("DELETE", "/api/sandboxes/"+id, nil, nil); code >= 300 {
			c.t.Fatalf("kill %s: %d %s", id, code, body)
		}
	}
	c.t.Fatalf("no create through %s landed on %s in 40 tries", via.name, want)
	return ""
}

// operations is how many sandbox operations op node n made, from its
// metrics.
func operations(t *testing.T, n *clusterNode, op string) uint64 {
	t.Helper()
	return histogramCount(scrape(t, n.url+"/metrics"), "lizard_sandbox_operation_duration_seconds", map[string]string{"operation": op, "outcome": "ok"})
}

// TestClusterSpread: 60 concurrent creates through one node spread over
// the three, none over its capacity (--max-sandboxes 25 each: 75 fit), and
// every sandbox answers.
func TestClusterSpread(t *testing.T) {
	const perNode, total = 25, 60
	c := startCluster(t, 3, "--max-sandboxes", fmt.Sprint(perNode), "--default-max-sandboxes", "100")
	a := c.node("a")
	ids := a.createMany(t, total, total)
	count := map[string]int{}
	for _, id := range ids {
		count[c.where(a, id)]++
	}
	t.Logf("placement: %v", count)
	for _, n := range c.nodes {
		if count[n.name] == 0 || count[n.name] > perNode {
			t.Errorf("node %s holds %d sandboxes, want 1 to %d (all: %v)", n.name, count[n.name], perNode, count)
		}
	}
	// Each answers through a node that does not hold it, too.
	for i, id := range ids {
		via := c.nodes[i%len(c.nodes)]
		if code, out, err := via.execOK(id, "echo ok"); err != nil || code != 200 || out != "ok\n" {
			t.Fatalf("exec in %s through %s: %d %q %v", id, via.name, code, out, err)
		}
	}
	c.killAll(a)
}

// TestClusterPreview: a sandbox's preview URL is served by every node's
// proxy, whichever holds the sandbox.
func TestClusterPreview(t *testing.T) {
	c := startCluster(t, 3)
	a := c.node("a")
	id := c.createOn(a, "b")
	a.startApp(t, id, 8000)
	var ex exposed
	if code, body := a.do("POST", "/api/sandboxes/"+id+"/expose/8000", nil, &ex); code != 200 {
		t.Fatalf("expose: %d %s", code, body)
	}
	for _, n := range c.nodes {
		resp := n.preview(t, "GET", ex.Hostname, "/hello", http.Header{"X-Lizard-Access-Token": {ex.AccessToken}}, nil)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), "/hello") {
			t.Fatalf("preview through node %s: %d %s", n.name, resp.StatusCode, body)
		}
		// Without the token: the same 401 from every node.
		resp = n.preview(t, "GET", ex.Hostname, "/hello", nil, nil)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("preview without a token through node %s: %d", n.name, resp.StatusCode)
		}
	}
	c.killAll(a)
}

// TestClusterKill9: a node killed with SIGKILL and started again
// reattaches its sandboxes (same processes, files kept), reached through
// another node as before.
func TestClusterKill9(t *testing.T) {
	c := startCluster(t, 3)
	a, b := c.node("a"), c.node("b")
	id := c.createOn(a, "b")
	a.sh(t, id, counterScript)
	pid, n := a.counter(t, id)
	b.crash()
	// Meanwhile its sandboxes answer a retryable 503 through a, never a
	// 404: the node is only suspect.
	if code, _, _ := a.execOK(id, "true"); code != http.StatusServiceUnavailable && code != http.StatusOK {
		t.Fatalf("exec through a while b is down: %d, want 503", code)
	}
	b.start()
	c.waitState("b", "ready")
	var pid2, n2 int
	deadline := time.Now().Add(budget(30 * time.Second))
	for {
		code, out, err := a.execOK(id, "cat /tmp/counter; cat /root/file")
		if err == nil && code == 200 {
			fmt.Sscan(out, &pid2, &n2)
			if !strings.HasSuffix(out, "data\n") {
				t.Fatalf("file after restart: %q", out)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("exec through a after b restarted: %d %s %v", code, out, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if pid2 != pid || n2 <= n {
		t.Fatalf("after kill -9 and restart: counter pid %d at %d, want pid %d past %d", pid2, n2, pid, n)
	}
	c.killAll(a)
}

// TestClusterNodeRemoved: a node gone for good (killed, then removed by the
// operator): its sandboxes answer 404 sandbox_lost naming it, everything
// else carries on; when it comes back anyway it destroys them.
func TestClusterNodeRemoved(t *testing.T) {
	c := startCluster(t, 3)
	a, cn := c.node("a"), c.node("c")
	lost := c.createOn(a, "c")
	kept := c.createOn(a, "b")
	cn.crash()
	c.nodesCLI("remove", "c")
	c.waitState("c", "removed")
	var e struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	// Until a's cache of the owner expires (a few seconds) the answer is
	// a retryable 503, as for a node that is only down.
	code, body := a.do("GET", "/api/sandboxes/"+lost, nil, nil)
	for deadline := time.Now().Add(budget(15 * time.Second)); code == http.StatusServiceUnavailable && time.Now().Before(deadline); {
		time.Sleep(250 * time.Millisecond)
		code, body = a.do("GET", "/api/sandboxes/"+lost, nil, nil)
	}
	json.Unmarshal(body, &e)
	if code != http.StatusNotFound || e.Code != "sandbox_lost" || !strings.Contains(e.Message, `node "c"`) {
		t.Fatalf("a sandbox of the removed node: %d %s, want 404 sandbox_lost naming c", code, body)
	}
	if out := a.sh(t, kept, "echo ok"); out != "ok\n" {
		t.Fatalf("a sandbox on b: %q", out)
	}
	// New sandboxes go to the nodes left.
	for range 4 {
		id := a.create(t)
		if w := c.where(a, id); w == "c" {
			t.Fatalf("sandbox %s placed on the removed node", id)
		}
	}
	// It comes back: fenced, it destroys what it held.
	cn.start()
	cn.waitNoLeaks(t)
	c.killAll(a)
}

// TestClusterDatabaseOutage: PostgreSQL stopped for 20 s under load:
// running sandboxes keep serving exec, files and previews through their
// node, creates answer 503 until it is back, and nobody is declared dead.
func TestClusterDatabaseOutage(t *testing.T) {
	c := startCluster(t, 3)
	a := c.node("a")
	type box struct {
		n  *clusterNode
		id string
		ex exposed
	}
	var boxes []box
	for _, name := range []string{"a", "b", "c"} {
		n := c.node(name)
		id := c.createOn(a, name)
		n.startApp(t, id, 8000)
		var ex exposed
		if code, body := n.do("POST", "/api/sandboxes/"+id+"/expose/8000", nil, &ex); code != 200 {
			t.Fatalf("expose: %d %s", code, body)
		}
		boxes = append(boxes, box{n, id, ex})
	}

	// Load: each sandbox's own node runs execs, file writes and reads and
	// preview requests until the outage is over; every one must succeed.
	var failures atomic.Int64
	var firstFailure atomic.Value
	fail := func(format string, args ...any) {
		if failures.Add(1) == 1 {
			firstFailure.Store(fmt.Sprintf(format, args...))
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, bx := range boxes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := &http.Client{Timeout: budget(30 * time.Second)}
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if code, out, err := bx.n.execOK(bx.id, fmt.Sprintf("echo %d", i)); err != nil || code != 200 || out != fmt.Sprintf("%d\n", i) {
					fail("exec in %s on %s: %d %q %v", bx.id, bx.n.name, code, out, err)
				}
				path := fmt.Sprintf("/tmp/f%d", i%4)
				if code, body, err := bx.n.request(context.Background(), bx.n.key, "POST", "/api/sandboxes/"+bx.id+"/files", map[string]any{"path": path, "content": fmt.Sprint(i)}, nil); err != nil || code >= 300 {
					fail("write in %s: %d %s %v", bx.id, code, body, err)
				}
				req, _ := http.NewRequest("GET", "http://"+bx.n.proxy+"/load", nil)
				req.Host = bx.ex.Hostname
				req.Header.Set("X-Lizard-Access-Token", bx.ex.AccessToken)
				resp, err := client.Do(req)
				if err != nil {
					fail("preview of %s: %v", bx.id, err)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					fail("preview of %s: %d", bx.id, resp.StatusCode)
				}
			}
		}()
	}

	if err := c.pg.Down(context.Background()); err != nil {
		t.Fatal(err)
	}
	down := time.Now()
	// Creates answer a retryable 503 while the database is away.
	for _, n := range c.nodes {
		code, body, err := n.request(context.Background(), n.key, "POST", "/api/sandboxes", map[string]any{"template": "base", "size": "nano"}, nil)
		if err != nil || code != http.StatusServiceUnavailable {
			t.Errorf("create through %s with the database down: %d %s %v, want 503", n.name, code, body, err)
		}
	}
	time.Sleep(20*time.Second - time.Since(down))
	if err := c.pg.Up(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Load goes on a little after the database is back, then stops.
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	if n := failures.Load(); n > 0 {
		t.Fatalf("%d requests to running sandboxes failed during the outage; the first: %v", n, firstFailure.Load())
	}
	// Creates work again once the nodes renewed their leases; nobody was
	// declared dead, so every sandbox is still there.
	deadline := time.Now().Add(budget(time.Minute))
	for {
		var sb sandboxInfo
		code, body, err := a.request(context.Background(), a.key, "POST", "/api/sandboxes", map[string]any{"template": "base", "size": "nano"}, &sb)
		if err == nil && code < 300 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("create %v after the database came back: %d %s %v", budget(time.Minute), code, body, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	for name, st := range c.states() {
		if st != "ready" {
			t.Errorf("node %s is %s after the outage, want ready", name, st)
		}
	}
	for _, bx := range boxes {
		if out := a.sh(t, bx.id, "echo ok"); out != "ok\n" {
			t.Fatalf("sandbox %s after the outage: %q", bx.id, out)
		}
	}
	c.killAll(a)
}

// TestClusterPartitionFromPeers: node c cut off from its peers but not the
// database stays a member; its sandboxes serve through c itself, through
// the others they answer a retryable 503 (never a 404), and creates
// through the others skip it. Healed, everything is reachable again.
func TestClusterPartitionFromPeers(t *testing.T) {
	c := startCluster(t, 3)
	a, cn := c.node("a"), c.node("c")
	id := c.createOn(a, "c")
	heal := c.partition(cn, c.addrs("c"), 0)
	if out := cn.sh(t, id, "echo direct"); out != "direct\n" {
		t.Fatalf("exec through its own node: %q", out)
	}
	if code, body, err := a.request(context.Background(), a.key, "POST", "/api/sandboxes/"+id+"/exec", map[string]any{"cmd": "true"}, nil); err != nil || code != http.StatusServiceUnavailable {
		t.Fatalf("exec through a while c is cut off: %d %s %v, want 503", code, body, err)
	}
	for range 6 {
		nid := a.create(t)
		if w := c.where(a, nid); w == "c" {
			t.Fatalf("create through a landed on the unreachable node c")
		}
	}
	// A lease on the database is all membership takes: c stays ready.
	time.Sleep(5 * time.Second)
	if st := c.states()["c"]; st != "ready" {
		t.Fatalf("node c cut off from its peers only is %s, want ready", st)
	}
	heal()
	deadline := time.Now().Add(budget(30 * time.Second))
	for {
		code, out, err := a.execOK(id, "echo back")
		if err == nil && code == 200 && out == "back\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("exec through a after healing: %d %q %v", code, out, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	c.killAll(a)
}

// TestClusterPartitionFromDatabase: node c cut off from the database but
// not its peers: its lease lapses, it refuses creates but keeps serving
// its running sandboxes; once declared dead its sandboxes are lost
// (404 sandbox_lost through the others), and when it reaches the database
// again it is fenced, destroys them and joins again.
func TestClusterPartitionFromDatabase(t *testing.T) {
	c := startCluster(t, 3)
	a, cn := c.node("a"), c.node("c")
	id := c.createOn(a, "c")
	heal := c.partition(cn, []netip.Addr{netip.MustParseAddr(clusterNet + ".1")}, clusterPGPort)
	c.waitState("c", "suspect")
	if out := cn.sh(t, id, "echo still"); out != "still\n" {
		t.Fatalf("exec on c while it cannot reach the database: %q", out)
	}
	if code, body, err := cn.request(context.Background(), cn.key, "POST", "/api/sandboxes", map[string]any{"template": "base", "size": "nano"}, nil); err != nil || code != http.StatusServiceUnavailable {
		t.Fatalf("create through c while it cannot reach the database: %d %s %v, want 503", code, body, err)
	}
	c.waitState("c", "dead")
	// a may still hold the owner in its cache for a few seconds.
	code, body := a.do("GET", "/api/sandboxes/"+id, nil, nil)
	for deadline := time.Now().Add(budget(15 * time.Second)); code != http.StatusNotFound && time.Now().Before(deadline); {
		time.Sleep(250 * time.Millisecond)
		code, body = a.do("GET", "/api/sandboxes/"+id, nil, nil)
	}
	if code != http.StatusNotFound || !strings.Contains(string(body), "sandbox_lost") || !strings.Contains(string(body), `node \"c\"`) {
		t.Fatalf("a sandbox of the dead node through a: %d %s, want 404 sandbox_lost naming node c", code, body)
	}
	heal()
	c.waitState("c", "ready")
	cn.waitNoLeaks(t)
	if id2 := c.createOn(a, "c"); id2 == "" {
		t.Fatal("no sandbox on c after it joined again")
	}
	c.killAll(a)
}

// TestClusterLastCapacity: two nodes race for the last of the project's
// quota: of creates sent at once through every node, exactly one wins and
// the rest are refused with 429 quota_exceeded, whichever node admitted
// them.
func TestClusterLastCapacity(t *testing.T) {
	c := startCluster(t, 3)
	a := c.node("a")
	a.cli(t, "projects", "set", "default", "--max-sandboxes", "2")
	a.create(t) // one of the two
	const racers = 6
	codes := make([]int, racers)
	bodies := make([]string, racers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range racers {
		n := c.nodes[i%len(c.nodes)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			code, body, _ := n.request(context.Background(), n.key, "POST", "/api/sandboxes", map[string]any{"template": "base", "size": "nano"}, nil)
			codes[i], bodies[i] = code, string(body)
		}()
	}
	close(start)
	wg.Wait()
	won := 0
	for i, code := range codes {
		switch {
		case code == http.StatusCreated || code == http.StatusOK:
			won++
		case code == http.StatusTooManyRequests && strings.Contains(bodies[i], "quota_exceeded"):
		default:
			t.Errorf("racer %d: %d %s, want a create or 429 quota_exceeded", i, code, bodies[i])
		}
	}
	if won != 1 {
		t.Fatalf("%d creates won the last slot of the quota, want 1 (answers %v)", won, codes)
	}
	a.cli(t, "projects", "set", "default", "--max-sandboxes", "default")
	c.killAll(a)
}

// TestClusterSDK: the official SDK's suite through node a, which is
// draining (no sandbox of its own), so that every sandbox is placed on b
// or c and every call, previews included, is forwarded.
func TestClusterSDK(t *testing.T) {
	c := startCluster(t, 3)
	a := c.node("a")
	c.nodesCLI("drain", "a")
	c.waitState("a", "draining")
	time.Sleep(cluster.DefaultNodesTTL + 200*time.Millisecond) // the routers' view of the nodes
	files, _ := filepath.Glob("js/*.test.mjs")
	if len(files) == 0 {
		t.Fatal("no SDK test files")
	}
	ctx, cancel := context.WithTimeout(context.Background(), budget(15*time.Minute))
	defer cancel()
	if err := a.runNode(ctx, files...); err != nil {
		t.Fatalf("SDK tests through node a failed: %v", err)
	}
	if n := operations(t, a, "create"); n != 0 {
		t.Errorf("draining node a created %d sandboxes", n)
	}
	for _, name := range []string{"b", "c"} {
		if n := operations(t, c.node(name), "create"); n == 0 {
			t.Errorf("node %s created no sandbox: placement did not spread", name)
		}
	}
	c.nodesCLI("drain", "--undo", "a")
	c.killAll(a)
}

// TestClusterQuotasEverywhere: a project's snapshot and volume-GB limits
// count what it holds on every node, not only on the node asked.
func TestClusterQuotasEverywhere(t *testing.T) {
	c := startCluster(t, 2)
	a, b := c.node("a"), c.node("b")
	a.cli(t, "projects", "set", "default", "--max-snapshots", "1", "--max-volume-gb", "2")
	defer a.cli(t, "projects", "set", "default", "--max-snapshots", "default", "--max-volume-gb", "default")
	only := func(name string) { // new sandboxes and volumes go to node name
		other := map[string]string{"a": "b", "b": "a"}[name]
		c.nodesCLI("drain", "--undo", name)
		c.nodesCLI("drain", other)
		time.Sleep(cluster.DefaultNodesTTL + 200*time.Millisecond) // the routers' view of the nodes
	}
	snapshot := func(via *clusterNode, name string) (int, string) {
		id := via.create(t)
		if w := c.where(via, id); w != via.name {
			t.Fatalf("sandbox %s on %s, want %s", id, w, via.name)
		}
		code, body := via.do("POST", "/api/sandboxes/"+id+"/snapshot", map[string]any{"name": name}, nil)
		return code, string(body)
	}

	only("a")
	if code, body := snapshot(a, "one"); code != http.StatusOK && code != http.StatusCreated {
		t.Fatalf("first snapshot: %d %s", code, body)
	}
	if code, body := a.do("POST", "/api/projects/default/volumes", map[string]any{"name": "two", "sizeGb": 2}, nil); code != http.StatusCreated {
		t.Fatalf("a 2 GB volume: %d %s", code, body)
	}
	only("b")
	if code, body := snapshot(b, "another"); code != http.StatusTooManyRequests || !strings.Contains(body, "quota_exceeded") || !strings.Contains(body, "snapshots 1 of 1") {
		t.Fatalf("a second snapshot, on the other node: %d %s, want 429 quota_exceeded", code, body)
	}
	if code, body := b.do("POST", "/api/projects/default/volumes", map[string]any{"name": "more", "sizeGb": 1}, nil); code != http.StatusTooManyRequests || !strings.Contains(string(body), "volume-gb 2 of 2") {
		t.Fatalf("1 GB more, on the other node: %d %s, want 429 quota_exceeded", code, body)
	}
	c.nodesCLI("drain", "--undo", "a")

	var snaps []struct{ ID, Name string }
	if code, body := b.do("GET", "/api/projects/default/snapshots", nil, &snaps); code != http.StatusOK || len(snaps) != 1 {
		t.Fatalf("snapshots: %d %s", code, body)
	}
	if code, body := b.do("DELETE", "/api/sandbox-snapshots/"+snaps[0].ID, nil, nil); code != http.StatusNoContent && code != http.StatusOK {
		t.Fatalf("delete snapshot: %d %s", code, body)
	}
	if code, body := b.do("DELETE", "/api/projects/default/volumes/two", nil, nil); code != http.StatusNoContent {
		t.Fatalf("delete volume: %d %s", code, body)
	}
	c.killAll(b)
}
