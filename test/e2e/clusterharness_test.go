package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/store/postgres/pgtest"
)

// The cluster tests' layout is make cluster's (scripts/cluster.sh) with
// names and addresses of their own, so that a cluster a user runs and the
// tests never collide: a host bridge lzt0 with 10.78.0.1/24, PostgreSQL on
// 10.78.0.1:clusterPGPort, and node N (the i-th, from 1) in network
// namespace lzt-N at 10.78.0.x (nodeOctet), with sandbox bridge lztsb-N on
// 10.(84+i).0.0/16 and build bridge lztbb-N on 10.(94+i).0.0/16 (in its
// namespace, which goes with the test); its cgroup parent, on the host,
// is the harness's for its data dir (namesFor), so that what a node of one
// test leaves is not another test's node's.
const (
	clusterBridge = "lzt0"
	clusterNet    = "10.78.0"
	clusterPGPort = 55478
	// Short leases so that the tests of failures take seconds: a lease of
	// 3 s (renewed each second), dead after 12 s.
	clusterLease     = "3s"
	clusterDeadAfter = "12s"
)

// testCluster is PostgreSQL and lizard nodes in network namespaces of
// their own, on one bridge.
type testCluster struct {
	t      *testing.T
	pg     *pgtest.Server
	db     string // the database URL every node uses (TCP, over the bridge)
	secret string // --cluster-secret-file
	nodes  []*clusterNode
}

// clusterNode is one node: its server (in its namespace) and its name.
type clusterNode struct {
	*server
	name string
	addr netip.Addr
}

// startCluster starts PostgreSQL and nodes a, b, c… (n of them), each
// with extra serve flags, and waits until every one answers and lists all
// the others as ready. Everything goes when the test ends.
func startCluster(t *testing.T, n int, extra ...string) *testCluster {
	t.Helper()
	c := newTestCluster(t)
	c.startNodes(n, extra...)
	return c
}

// newTestCluster makes the cluster's bridge and starts its PostgreSQL; no
// node yet (startNodes).
func newTestCluster(t *testing.T) *testCluster {
	t.Helper()
	requirements(t)
	c := &testCluster{t: t}
	removeClusterBridge()
	// A fixed MAC, as scripts/cluster.sh gives its bridge: left alone, a
	// bridge takes the lowest of its ports' MACs and changes it as nodes
	// join, and a node that cached the old one loses the database for up
	// to a minute.
	run(t, "ip", "link", "add", clusterBridge, "address", "02:4c:5a:54:00:01", "type", "bridge")
	t.Cleanup(removeClusterBridge)
	run(t, "ip", "addr", "add", clusterNet+".1/24", "dev", clusterBridge)
	run(t, "ip", "link", "set", clusterBridge, "up")
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}

	pgAddr := netip.AddrPortFrom(netip.MustParseAddr(clusterNet+".1"), clusterPGPort)
	srv, err := pgtest.StartTCP(context.Background(), pgAddr, netip.MustParsePrefix(clusterNet+".0/24"))
	if err != nil {
		t.Fatalf("postgres on %s: %v", pgAddr, err)
	}
	c.pg = srv
	t.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			t.Errorf("stop postgres: %v", err)
		}
	})
	if c.db, err = srv.NewDatabase(context.Background()); err != nil {
		t.Fatal(err)
	}
	c.secret = filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(c.secret, []byte(strings.Repeat("e2e-cluster-secret-", 3)), 0o600); err != nil {
		t.Fatal(err)
	}
	return c
}

// startNodes starts nodes a, b, c… (n of them) with extra serve flags and
// waits until every one answers and lists all the others as ready.
func (c *testCluster) startNodes(n int, extra ...string) {
	t := c.t
	t.Helper()
	for i := 1; i <= n; i++ {
		name := string(rune('a' + i - 1))
		nd := newClusterNetns(t, i, name)
		args := append([]string{
			"--internal-listen", nd.addr.String() + ":7070", "--advertise", nd.addr.String() + ":7070",
			"--node-name", name, "--cluster-secret-file", c.secret,
			"--node-lease", clusterLease, "--node-dead-after", clusterDeadAfter,
			"--bridge", "lztsb-" + name, "--subnet", fmt.Sprintf("10.%d.0.0/16", 84+i),
			"--build-bridge", "lztbb-" + name, "--build-subnet", fmt.Sprintf("10.%d.0.0/16", 94+i),
		}, extra...)
		s := newServerOn(t, nd, t.TempDir(), c.db, args...)
		c.nodes = append(c.nodes, &clusterNode{server: s, name: name, addr: nd.addr})
		// The first node makes the default project and its key; the
		// others find them.
		s.start()
	}
	c.waitReady(n)
}

// nodeOctet is the last octet of node i's address: 10+i, as in
// scripts/cluster.sh.
func nodeOctet(i int) int { return 10 + i }

// newClusterNetns makes node i's network namespace, lzt-<name>, joined to
// the cluster bridge at 10.78.0.nodeOctet(i), with its default route through the
// host.
func newClusterNetns(t *testing.T, i int, name string) *testNode {
	t.Helper()
	nd := &testNode{
		name:     "lzt-" + name,
		addr:     netip.MustParseAddr(fmt.Sprintf("%s.%d", clusterNet, nodeOctet(i))),
		hostAddr: netip.MustParseAddr(clusterNet + ".1"),
		hostVeth: "lzth-" + name,
	}
	nd.path = "/run/netns/" + nd.name
	nd.remove()
	t.Cleanup(nd.remove)
	run(t, "ip", "netns", "add", nd.name)
	run(t, "ip", "link", "add", nd.hostVeth, "type", "veth", "peer", "name", "eth0", "netns", nd.name)
	run(t, "ip", "link", "set", nd.hostVeth, "master", clusterBridge, "up")
	nd.configure(t)
	return nd
}

func removeClusterBridge() { exec.Command("ip", "link", "del", clusterBridge).Run() }

// run runs a command that must succeed.
func run(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%v: %v %s", args, err, out)
	}
}

// node returns the node named name.
func (c *testCluster) node(name string) *clusterNode {
	for _, n := range c.nodes {
		if n.name == name {
			return n
		}
	}
	c.t.Fatalf("no node %s", name)
	return nil
}

// nodesCLI runs `lizard nodes ARGS` against the cluster's database.
func (c *testCluster) nodesCLI(args ...string) string {
	c.t.Helper()
	out, err := exec.Command(filepath.Join(c.nodes[0].bin, "lizard"), append(append([]string{"nodes"}, args...), "--database", c.db)...).CombinedOutput()
	if err != nil {
		c.t.Fatalf("lizard nodes %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// states is each node's state as `lizard nodes ls` shows it.
func (c *testCluster) states() map[string]string {
	c.t.Helper()
	m := map[string]string{}
	for _, line := range strings.Split(c.nodesCLI("ls"), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 {
			continue
		}
		for _, n := range c.nodes {
			if f[0] == n.name {
				m[n.name] = stateField(f)
			}
		}
	}
	return m
}

// stateField finds the state among a `nodes ls` line's fields.
func stateField(f []string) string {
	for _, v := range f {
		switch v {
		case "ready", "draining", "suspect", "dead", "removed":
			return v
		}
	}
	return "?"
}

// waitState waits (up to a minute) until node name is in state want.
func (c *testCluster) waitState(name, want string) {
	c.t.Helper()
	deadline := time.Now().Add(budget(time.Minute))
	for {
		st := c.states()
		if st[name] == want {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("node %s is %q after %v, want %s (all: %v)", name, st[name], budget(time.Minute), want, st)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// waitReady waits until n nodes are listed ready.
func (c *testCluster) waitReady(n int) {
	c.t.Helper()
	for _, nd := range c.nodes[:n] {
		c.waitState(nd.name, "ready")
	}
}

// where is the node a sandbox is on, as GET /api/sandboxes/{id} through
// node via says.
func (c *testCluster) where(via *clusterNode, id string) string {
	c.t.Helper()
	var info struct {
		Node string `json:"node"`
	}
	if code, body := via.do("GET", "/api/sandboxes/"+id, nil, &info); code != 200 {
		c.t.Fatalf("get %s through %s: %d %s", id, via.name, code, body)
	}
	if info.Node == "" {
		c.t.Fatalf("get %s through %s: no node in the answer", id, via.name)
	}
	return info.Node
}

// killAll deletes every sandbox (through node via, which lists the whole
// cluster), then waits until no node holds anything.
func (c *testCluster) killAll(via *clusterNode) {
	c.t.Helper()
	for _, id := range via.listed(c.t) {
		if code, body := via.do("DELETE", "/api/sandboxes/"+id, nil, nil); code >= 300 && code != 404 {
			c.t.Fatalf("kill %s: %d %s", id, code, body)
		}
	}
	c.waitNoLeaks()
}

// waitNoLeaks waits until no node holds anything of a sandbox.
func (c *testCluster) waitNoLeaks() {
	c.t.Helper()
	for _, n := range c.nodes {
		n.waitNoLeaks(c.t)
	}
}

// partition drops, inside node n's namespace, its traffic to and from the
// given addresses (and TCP port when port > 0), until the returned func
// heals it. A table of the test's own: the node's lizard tables are
// untouched.
func (c *testCluster) partition(n *clusterNode, addrs []netip.Addr, port int) (heal func()) {
	c.t.Helper()
	var set []string
	for _, a := range addrs {
		set = append(set, a.String())
	}
	match := "ip daddr { " + strings.Join(set, ", ") + " }"
	back := "ip saddr { " + strings.Join(set, ", ") + " }"
	if port > 0 {
		match += fmt.Sprintf(" tcp dport %d", port)
		back += fmt.Sprintf(" tcp sport %d", port)
	}
	rules := fmt.Sprintf(`table inet lzt_partition {
	chain out { type filter hook output priority -10; policy accept; %s drop; }
	chain in { type filter hook input priority -10; policy accept; %s drop; }
}
`, match, back)
	cmd := exec.Command("nsenter", "--net="+n.node.path, "--", "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		c.t.Fatalf("partition %s: %v %s\n%s", n.name, err, out, rules)
	}
	healed := false
	heal = func() {
		if !healed {
			healed = true
			exec.Command("nsenter", "--net="+n.node.path, "--", "nft", "delete", "table", "inet", "lzt_partition").Run()
		}
	}
	c.t.Cleanup(heal)
	return heal
}

// addrs are the nodes' addresses but for those named in except.
func (c *testCluster) addrs(except ...string) []netip.Addr {
	var out []netip.Addr
	for _, n := range c.nodes {
		skip := false
		for _, e := range except {
			skip = skip || n.name == e
		}
		if !skip {
			out = append(out, n.addr)
		}
	}
	return out
}
