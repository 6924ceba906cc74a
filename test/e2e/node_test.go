package e2e

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/lizard-build/lizard/internal/network"
)

// testNode is a network namespace of a test's own standing for a machine of
// its own (its firewall, its bridge, its lizard server), joined to the
// host's namespace by a veth pair on 10.98.<n>.0/24: the host's end is .1,
// the node's .2 with its default route through the host, which forwards
// between nodes and to the fake internet. Several nodes can run at once;
// nothing leaves this machine.
type testNode struct {
	name     string     // namespace name, lztest-node<n>
	path     string     // /run/netns/<name>
	addr     netip.Addr // the node's address, 10.98.<n>.2
	hostAddr netip.Addr // the host's end, 10.98.<n>.1
	hostVeth string
}

// newTestNode makes node n (1–254) and removes it when the test ends; one
// left by a killed run is removed first.
func newTestNode(t *testing.T, n int) *testNode {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes a network namespace")
	}
	nd := &testNode{
		name:     fmt.Sprintf("lztest-node%d", n),
		addr:     netip.AddrFrom4([4]byte{10, 98, byte(n), 2}),
		hostAddr: netip.AddrFrom4([4]byte{10, 98, byte(n), 1}),
		hostVeth: fmt.Sprintf("lztnode%d", n),
	}
	nd.path = "/run/netns/" + nd.name
	nd.remove()
	t.Cleanup(nd.remove)
	run(t, "ip", "netns", "add", nd.name)
	run(t, "ip", "link", "add", nd.hostVeth, "type", "veth", "peer", "name", "eth0", "netns", nd.name)
	run(t, "ip", "addr", "add", nd.hostAddr.String()+"/24", "dev", nd.hostVeth)
	run(t, "ip", "link", "set", nd.hostVeth, "up")
	nd.configure(t)
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	return nd
}

// configure gives the node's end its address, brings its links up and
// routes through the host's end.
func (nd *testNode) configure(t *testing.T) {
	t.Helper()
	run(t, "ip", "-n", nd.name, "addr", "add", nd.addr.String()+"/24", "dev", "eth0")
	run(t, "ip", "-n", nd.name, "link", "set", "eth0", "up")
	run(t, "ip", "-n", nd.name, "link", "set", "lo", "up")
	run(t, "ip", "-n", nd.name, "route", "add", "default", "via", nd.hostAddr.String())
}

// remove deletes the namespace (and with it the veth pair and whatever a
// server made in it: its bridge, nftables table and iptables rules).
func (nd *testNode) remove() {
	exec.Command("ip", "netns", "del", nd.name).Run()
	exec.Command("ip", "link", "del", nd.hostVeth).Run()
}

// exec runs a command inside the node's network namespace and returns its
// output; a failure fails the test.
func (nd *testNode) exec(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("nsenter", append([]string{"--net=" + nd.path, "--"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("in %s: %v: %v\n%s", nd.name, args, err, out)
	}
	return string(out)
}

// ipArgs prefixes an ip(8) command line to act in the node (nil: the host).
func (nd *testNode) ipArgs(args ...string) []string {
	if nd == nil {
		return args
	}
	return append([]string{"-n", nd.name}, args...)
}

// veths lists the sandbox veths (lzv…) in the server's namespace that hang
// on its bridge, and those on none (left after their bridge went) that are
// the host ends of sandboxes in ids (a veth is named for its sandbox's id,
// network.EndpointFor): another server's sandboxes in the same namespace
// are not this one's.
func (s *server) veths(ids map[string]bool) ([]string, error) {
	h := &netlink.Handle{} // the zero handle acts in this process's namespace
	if s.node != nil {
		ns, err := netns.GetFromPath(s.node.path)
		if err != nil {
			return nil, err
		}
		defer ns.Close()
		if h, err = netlink.NewHandleAt(ns); err != nil {
			return nil, fmt.Errorf("netlink in %s: %w", s.node.path, err)
		}
		defer h.Close()
	}
	links, err := h.LinkList()
	if err != nil {
		return nil, err
	}
	bridge := -1
	for _, l := range links {
		if l.Attrs().Name == s.bridge() {
			bridge = l.Attrs().Index
		}
	}
	orphans := map[string]bool{}
	for id := range ids {
		orphans[network.EndpointFor(s.cgroupParent(), id).HostVeth] = true
	}
	var names []string
	for _, l := range links {
		if a := l.Attrs(); strings.HasPrefix(a.Name, "lzv") && (a.MasterIndex == bridge || a.MasterIndex == 0 && orphans[a.Name]) {
			names = append(names, a.Name)
		}
	}
	return names, nil
}

// lines returns the lines of out that contain sub.
func lines(out, sub string) []string {
	var ls []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, sub) {
			ls = append(ls, l)
		}
	}
	return ls
}
