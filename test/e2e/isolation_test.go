package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lizard-build/lizard/internal/network"
	"github.com/lizard-build/lizard/internal/runtime/gvisor"
	"github.com/lizard-build/lizard/internal/template"
)

// Each data directory's servers take names on the host of their own
// (hostNames): a cgroup parent, which also prefixes their sandboxes'
// network namespaces, a sandbox bridge and subnet and a build bridge and
// subnet; runsc's root is the data directory's already
// (gvisor.RunscRootFor). A leak check counts what carries these names
// only, so one test's leftovers never fail another's check; and at the
// end of its test each server's leftovers fail that test and are removed
// (finish), before the next test starts.

// hostNames are the names the servers on one data directory take on the
// host, unless the test passes flags of its own (the last of each flag
// wins, lastFlag).
type hostNames struct {
	cgroupParent string // --cgroup-parent: <parent>/<id> cgroups, <parent>-<id> namespaces
	bridge       string // --bridge
	subnet       netip.Prefix
	buildBridge  string // --build-bridge
	buildSubnet  netip.Prefix
	// mounts are those in the data directory before its first server
	// started: the test's own (a small tmpfs), not a server's leftovers.
	mounts []string
}

func (n *hostNames) String() string {
	return fmt.Sprintf("cgroup parent and bridge %s, subnet %s; build bridge %s, subnet %s", n.bridge, n.subnet, n.buildBridge, n.buildSubnet)
}

// args are the serve flags that give a server these names.
func (n *hostNames) args() []string {
	return []string{"--cgroup-parent", n.cgroupParent, "--bridge", n.bridge, "--subnet", n.subnet.String(),
		"--build-bridge", n.buildBridge, "--build-subnet", n.buildSubnet.String()}
}

// LIZARD_E2E_SALT lets several runs of the suite share the host (work
// trees of their own, run at once): its value goes into every tag, and
// the first subnet slot a run tries follows from it.
var named = struct {
	sync.Mutex
	byDir   map[string]*hostNames // data dir → its names
	perTest map[string]int        // test → data dirs named for it so far
	tags    map[string]string     // tag → the key it was made from
	slot    int                   // the next subnet slot to try
}{byDir: map[string]*hostNames{}, perTest: map[string]int{}, tags: map[string]string{}, slot: saltSlot(os.Getenv("LIZARD_E2E_SALT"))}

// saltSlot is the first subnet slot a run with salt tries: 0 without one.
func saltSlot(salt string) int {
	if salt == "" {
		return 0
	}
	sum := sha256.Sum256([]byte(salt))
	return (int(sum[0])<<8 | int(sum[1])) % subnetSlots
}

// namesFor returns the names of the servers on dataDir, made for test t
// on its first server: a tag from the test's name and the data
// directory's place among the test's (so a test's names are the same from
// one run to the next, and a leftover a killed run left can only meet
// its own test again), and subnets of a slot of their own in this
// process (no two data dirs of a run share one; a slot whose subnet an
// interface of the host has already is passed over).
func namesFor(t *testing.T, dataDir string) *hostNames {
	t.Helper()
	named.Lock()
	defer named.Unlock()
	if n, ok := named.byDir[dataDir]; ok {
		return n
	}
	named.perTest[t.Name()]++
	key := os.Getenv("LIZARD_E2E_SALT") + t.Name() + "#" + strconv.Itoa(named.perTest[t.Name()])
	tag := ""
	for salt := key; ; salt += "'" {
		sum := sha256.Sum256([]byte(salt))
		tag = hex.EncodeToString(sum[:])[:6]
		if k, taken := named.tags[tag]; !taken || k == key {
			break
		}
	}
	named.tags[tag] = key
	sub, build, err := freeSubnets()
	if err != nil {
		t.Fatal(err)
	}
	// lze + 6 hex digits: 9 bytes, a build bridge 10, within the 15 of
	// an interface's name.
	n := &hostNames{cgroupParent: "lze" + tag, bridge: "lze" + tag, subnet: sub, buildBridge: "lze" + tag + "b", buildSubnet: build,
		mounts: mountsUnder(dataDir)}
	named.byDir[dataDir] = n
	t.Logf("servers on %s: %s", dataDir, n)
	return n
}

// Subnet slots: 1024 of them, a /22 of 10.224.0.0/12 for sandboxes (1021
// addresses) and a /24 of 10.200.0.0/14 for builds, both clear of the
// fixed subnets some tests name (10.78-10.99, 10.21x, 10.246-10.253).
const subnetSlots = 1024

func slotSubnets(slot int) (sandboxes, builds netip.Prefix) {
	sandboxes = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(224 + slot/64), byte(slot % 64 * 4), 0}), 22)
	builds = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(200 + slot/256), byte(slot % 256), 0}), 24)
	return sandboxes, builds
}

// freeSubnets takes the next slot whose subnets no interface of the host
// has an address in. Caller holds named.
func freeSubnets() (sandboxes, builds netip.Prefix, err error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return netip.Prefix{}, netip.Prefix{}, fmt.Errorf("list the host's addresses: %w", err)
	}
	used := func(p netip.Prefix) bool {
		for _, a := range addrs {
			if in, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(in.IP.To4()); ok && p.Contains(ip) {
					return true
				}
			}
		}
		return false
	}
	for range subnetSlots {
		slot := named.slot
		named.slot = (named.slot + 1) % subnetSlots
		if sandboxes, builds = slotSubnets(slot); !used(sandboxes) && !used(builds) {
			return sandboxes, builds, nil
		}
	}
	return netip.Prefix{}, netip.Prefix{}, errors.New("every test subnet slot is in use on the host")
}

// mountsUnder lists the mount points at or below dir.
func mountsUnder(dir string) []string {
	var out []string
	b, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && within(f[4], dir) {
			out = append(out, f[4])
		}
	}
	return out
}

// within reports whether path is dir or below it.
func within(path, dir string) bool { return path == dir || strings.HasPrefix(path, dir+"/") }

// cgroupParent is the server's --cgroup-parent.
func (s *server) cgroupParent() string { return s.flag("--cgroup-parent", s.names.cgroupParent) }

// cgroupParents are the cgroups the server's sandboxes and RUN steps go
// under: its parent, and <parent>-build for `lizard template build`.
func (s *server) cgroupParents() []string {
	return []string{s.cgroupParent(), s.cgroupParent() + "-build"}
}

// bridge is the server's --bridge.
func (s *server) bridge() string { return s.flag("--bridge", s.names.bridge) }

// buildBridge is the server's --build-bridge.
func (s *server) buildBridge() string { return s.flag("--build-bridge", s.names.buildBridge) }

// gateway is the server's address on its bridge: its --subnet's first.
func (s *server) gateway() netip.Addr {
	p, err := netip.ParsePrefix(s.flag("--subnet", s.names.subnet.String()))
	if err != nil {
		s.t.Fatalf("--subnet: %v", err)
	}
	return p.Masked().Addr().Next()
}

// buildArgs are the flags that put `lizard template build`'s RUN steps on
// the server's names (its cgroup parent, build bridge and subnet).
func (s *server) buildArgs() []string {
	return []string{"--cgroup-parent", s.cgroupParent(), "--build-bridge", s.buildBridge(),
		"--build-subnet", s.flag("--build-subnet", s.names.buildSubnet.String())}
}

// leaks lists host resources held by lizard sandboxes of this server: what
// is left after every sandbox is gone must be nothing. Only this server's
// count (its cgroup parents, which also prefix its network namespaces, its
// bridge, runsc root and data dir), so servers sharing the host do not see
// each other's.
func (s *server) leaks() []string {
	var out []string
	ids := map[string]bool{} // the sandboxes the host still has something of
	if ents, err := os.ReadDir("/run/netns"); err == nil {
		for _, e := range ents {
			if gvisor.OwnNetns(s.cgroupParent(), e.Name()) {
				out = append(out, "netns "+e.Name())
				ids[strings.TrimPrefix(e.Name(), s.cgroupParent()+"-")] = true
			}
		}
	}
	for _, m := range s.mounts() {
		out = append(out, "mount "+m)
	}
	for _, p := range s.cgroupParents() {
		for _, c := range gvisor.CgroupDirs(cgroupRoot, p, "") {
			out = append(out, "cgroup "+c)
			ids[filepath.Base(c)] = true
		}
	}
	for _, d := range s.leftDirs() {
		out = append(out, "dir "+d)
		ids[filepath.Base(d)] = true
	}
	veths, err := s.veths(ids)
	if err != nil {
		out = append(out, "(cannot list links: "+err.Error()+")")
	}
	for _, name := range veths {
		out = append(out, "veth "+name)
	}
	for _, pid := range s.processes() {
		out = append(out, "process "+strconv.Itoa(pid))
	}
	return out
}

// mounts lists the mounts of the server's sandboxes: their network
// namespaces and what is mounted in the data dir (volumes), but for the
// test's own there.
func (s *server) mounts() []string {
	var out []string
	b, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) <= 4 {
			continue
		}
		m := f[4]
		if filepath.Dir(m) == "/run/netns" && gvisor.OwnNetns(s.cgroupParent(), filepath.Base(m)) ||
			within(m, s.dataDir) && !slices.Contains(s.names.mounts, m) {
			out = append(out, m)
		}
	}
	return out
}

// leftDirs lists the sandboxes' directories in the data dir and those of
// the runtime's containers of template build steps (sandboxes/.run).
func (s *server) leftDirs() []string {
	var out []string
	dir := filepath.Join(s.dataDir, "sandboxes")
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.Name() != ".run" {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	runs, _ := os.ReadDir(filepath.Join(dir, ".run"))
	for _, r := range runs {
		out = append(out, filepath.Join(dir, ".run", r.Name()))
	}
	return out
}

// processes lists the runsc processes under the server's runsc root and
// whatever else runs in its cgroups.
func (s *server) processes() []int {
	seen := map[int]bool{}
	root := gvisor.RunscRootFor(s.dataDir)
	if ents, err := os.ReadDir("/proc"); err == nil {
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			b, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
			if c := string(b); strings.Contains(c, "runsc") && strings.Contains(c, root) {
				seen[pid] = true
			}
		}
	}
	for _, d := range s.cgroupDirs() {
		b, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				seen[pid] = true
			}
		}
	}
	out := make([]int, 0, len(seen))
	for pid := range seen {
		out = append(out, pid)
	}
	slices.Sort(out)
	return out
}

// cgroupDirs lists the server's sandboxes' cgroups and every cgroup below
// them, deepest first (the order rmdir needs).
func (s *server) cgroupDirs() []string {
	var out []string
	for _, p := range s.cgroupParents() {
		for _, c := range gvisor.CgroupDirs(cgroupRoot, p, "") {
			filepath.WalkDir(c, func(path string, d fs.DirEntry, err error) error {
				if err == nil && d.IsDir() {
					out = append(out, path)
				}
				return nil
			})
		}
	}
	slices.Reverse(out)
	return out
}

// cgroupRoot is where the host mounts cgroups (v1: a directory per
// controller below it; v2: the single hierarchy itself).
const cgroupRoot = "/sys/fs/cgroup"

// waitNoLeaks polls until nothing is left, for cleanups that finish just
// after an answer (a reaped process, an expiry).
func (s *server) waitNoLeaks(t *testing.T) {
	t.Helper()
	if l := s.leftAfter(budget(5 * time.Second)); len(l) > 0 {
		t.Fatalf("left behind: %v", l)
	}
}

// leftAfter is what leaks still lists after up to d of waiting for it to
// go.
func (s *server) leftAfter(d time.Duration) []string {
	var l []string
	for deadline := time.Now().Add(d); ; time.Sleep(100 * time.Millisecond) {
		if l = s.leaks(); len(l) == 0 || time.Now().After(deadline) {
			return l
		}
	}
}

// reporter is what finish tells of a test (a *testing.T).
type reporter interface {
	Errorf(format string, args ...any)
	Logf(format string, args ...any)
}

// finish ends a server at the end of its test (the test's cleanup): the
// server stops, and what its sandboxes left on the host is a failure of
// this test (of a test that stopped half-way, failed or skipped, it is
// logged) and is removed, so that the next test starts on a clean host;
// then runsc's root, the cgroup parents and the bridges go.
func (s *server) finish(r reporter, halfway bool) {
	s.stop()
	var left []string
	if halfway {
		left = s.leaks()
	} else {
		left = s.leftAfter(budget(5 * time.Second))
	}
	if len(left) > 0 {
		if halfway {
			r.Logf("removing what the server on %s left when its test stopped half-way: %s", s.dataDir, summary(left))
		} else {
			r.Errorf("left behind by the server on %s (now removed): %s", s.dataDir, summary(left))
			if l := s.logs(); l != "" {
				r.Logf("server log:\n%s", l)
			}
		}
		s.scrub()
		if l := s.leaks(); len(l) > 0 {
			r.Errorf("could not remove what the server on %s left: %s", s.dataDir, summary(l))
		}
	}
	// runsc pins one empty network namespace in its state directory,
	// which is per data directory: a test's goes with it.
	root := gvisor.RunscRootFor(s.dataDir)
	for unix.Unmount(filepath.Join(root, "null-netns"), unix.MNT_DETACH) == nil {
	}
	os.RemoveAll(root)
	// So do the cgroup parents (runsc makes them, nothing removes them;
	// rmdir leaves one a sandbox is still in).
	for _, p := range s.cgroupParents() {
		if p == gvisor.DefaultCgroupParent {
			continue
		}
		dirs, _ := filepath.Glob(filepath.Join(cgroupRoot, "*", p))
		for _, d := range append(dirs, filepath.Join(cgroupRoot, p)) {
			os.Remove(d)
		}
	}
	// Its builds' turns on its build bridge were taken with a lock file.
	os.Remove(template.BuildNetworkLock(s.buildBridge()))
	// A server leaves its network for the sandboxes that outlive it;
	// none is left now. A node's are in its namespace, which goes with
	// it.
	if s.node == nil {
		if err := removeNetworks(s.bridge(), s.buildBridge()); err != nil {
			r.Errorf("remove the networks of the server on %s: %v", s.dataDir, err)
		}
	}
}

// summary is what leaks listed, by kind: how many of each and the first
// few (a busy test leaves ten cgroups a sandbox on cgroup v1).
func summary(left []string) string {
	var kinds []string
	of := map[string][]string{}
	for _, l := range left {
		kind, what, _ := strings.Cut(l, " ")
		if of[kind] == nil {
			kinds = append(kinds, kind)
		}
		of[kind] = append(of[kind], what)
	}
	var out []string
	for _, k := range kinds {
		ws := of[k]
		more := ""
		if len(ws) > 3 {
			ws, more = ws[:3], ", …"
		}
		out = append(out, fmt.Sprintf("%d %s (%s%s)", len(of[k]), k, strings.Join(ws, ", "), more))
	}
	return strings.Join(out, "; ")
}

// scrub removes by force whatever this server's sandboxes left on the
// host: their processes first (runsc's under its root, anything in its
// cgroups), then their veths, network namespaces, mounts, cgroups and
// directories.
func (s *server) scrub() {
	for deadline := time.Now().Add(budget(5 * time.Second)); ; time.Sleep(100 * time.Millisecond) {
		pids := s.processes()
		if len(pids) == 0 || time.Now().After(deadline) {
			break
		}
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	ids := map[string]bool{}
	for _, d := range s.leftDirs() {
		ids[filepath.Base(d)] = true
	}
	if ents, err := os.ReadDir("/run/netns"); err == nil {
		for _, e := range ents {
			if gvisor.OwnNetns(s.cgroupParent(), e.Name()) {
				ids[strings.TrimPrefix(e.Name(), s.cgroupParent()+"-")] = true
			}
		}
	}
	veths, _ := s.veths(ids)
	for _, v := range veths {
		exec.Command("ip", s.node.ipArgs("link", "del", v)...).Run()
	}
	mounts := s.mounts()
	slices.SortFunc(mounts, func(a, b string) int { return len(b) - len(a) }) // the deepest first
	for _, m := range mounts {
		for unix.Unmount(m, unix.MNT_DETACH) == nil {
		}
		if filepath.Dir(m) == "/run/netns" {
			os.Remove(m)
		}
	}
	if ents, err := os.ReadDir("/run/netns"); err == nil {
		for _, e := range ents {
			if gvisor.OwnNetns(s.cgroupParent(), e.Name()) {
				os.Remove(filepath.Join("/run/netns", e.Name()))
			}
		}
	}
	for _, c := range s.cgroupDirs() {
		os.Remove(c)
	}
	for _, d := range s.leftDirs() {
		os.RemoveAll(d)
	}
}

// hostBridges are the bridges the tests' servers made on the host. Each
// server's go at the end of its test (finish); TestMain removes any still
// there, with their firewall tables, once every test ran.
var hostBridges = bridgeSet{names: map[string]bool{}}

type bridgeSet struct {
	sync.Mutex
	names map[string]bool
}

func (bs *bridgeSet) add(bridges ...string) {
	bs.Lock()
	for _, b := range bridges {
		bs.names[b] = true
	}
	bs.Unlock()
}

// removeTestNetworks removes every bridge of hostBridges still there and
// its nftables table.
func removeTestNetworks() error {
	hostBridges.Lock()
	defer hostBridges.Unlock()
	return removeNetworks(slices.Sorted(maps.Keys(hostBridges.names))...)
}

// removeNetworks removes the host's bridges of these names and their
// nftables tables, where they are.
func removeNetworks(bridges ...string) error {
	var errs []error
	for _, b := range bridges {
		errs = append(errs, network.RemoveBridge(b))
	}
	return errors.Join(errs...)
}
