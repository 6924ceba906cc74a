// Package network gives each sandbox its own Linux network namespace joined to
// a host bridge by a veth pair, with a private address from the bridge's
// subnet. The gVisor runtime backend asks it for an Endpoint before it starts
// a sandbox and hands it back on destroy. Bridge ports are isolated, so
// sandboxes reach the host side of the bridge but never each other.
package network

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// Config names the bridge and the subnet sandboxes get addresses from. The
// first address of the subnet is the bridge's (the sandboxes' gateway).
type Config struct {
	Bridge string       // e.g. "lizard0"
	Subnet netip.Prefix // e.g. 10.250.0.0/16
	// DNSUpstream is where the sandboxes' resolver forwards queries
	// ("host:port"); "" means the host's first nameserver.
	DNSUpstream string
	// Deny are destinations no endpoint reaches whatever its policy (the
	// subnet of another lizard bridge: the build network denies the
	// sandboxes', so RUN steps reach no sandbox).
	Deny []netip.Prefix
	// NetnsPrefix names the endpoints' network namespaces
	// (/run/netns/<prefix>-<id>); "" means DefaultNetnsPrefix. Servers
	// sharing a host pass prefixes of their own, so that each one's scans
	// of /run/netns see only its own namespaces.
	NetnsPrefix string
	// APIPort is the TCP port of the gateway that endpoints whose
	// Egress.NodeAPI is set may reach: the server's API, which listens on
	// the gateway's address too (see APIURL); 0: none may.
	APIPort uint16
	// EgressProxy makes the manager listen for the egress proxy on the
	// gateway (EgressListener) and redirect there the TCP of endpoints
	// whose Egress.Intercepts (ports 80 and 443) or Egress.Tunnelled (all
	// ports) says so; without it those policies are refused.
	EgressProxy bool
	// Run runs a command (iptables) and waits for it; nil runs it plainly.
	// A server that is a child subreaper passes its reaper's Run, so that
	// the command's status is not reaped away from under it.
	Run    func(*exec.Cmd) error
	Logger *slog.Logger
}

// Endpoint is one sandbox's network identity.
type Endpoint struct {
	Netns    string     `json:"netns"`    // path of the named namespace, /run/netns/<name>
	HostVeth string     `json:"hostVeth"` // host end of the veth pair, on the bridge
	Addr     netip.Addr `json:"addr"`     // the sandbox's address
	Gateway  netip.Addr `json:"gateway"`  // the bridge's address
	Bits     int        `json:"bits"`     // prefix length
}

// Manager creates and removes endpoints and allocates addresses. It is safe
// for concurrent use.
type Manager struct {
	cfg     Config
	gateway netip.Addr
	bridge  netlink.Link

	fw      *firewall
	fwd     *hostForward // accepts the bridge's traffic in iptables FORWARD chains
	dns     *resolver
	proxyLn net.Listener // the egress proxy's (Config.EgressProxy)

	mu        sync.Mutex
	used      map[netip.Addr]bool
	next      netip.Addr
	endpoints map[netip.Addr]*endpoint // by address, once its policy is known
}

// endpoint is what the manager enforces for one address.
type endpoint struct {
	id     string
	egress Egress
	// learned are the addresses the resolver answered for each name the
	// policy allows, while the policy learns addresses (the address path).
	learned map[string][]netip.Prefix
}

// learnedPrefixes are all of ep's learned addresses.
func (ep *endpoint) learnedPrefixes() []netip.Prefix {
	var out []netip.Prefix
	for _, ps := range ep.learned {
		out = append(out, ps...)
	}
	return out
}

const netnsDir = "/run/netns"

// DefaultNetnsPrefix is the prefix of the namespaces' names unless
// Config.NetnsPrefix says otherwise.
const DefaultNetnsPrefix = "lizard"

// New makes sure the bridge exists, is up and carries the gateway address.
func New(cfg Config) (*Manager, error) {
	if !cfg.Subnet.Addr().Is4() || cfg.Subnet.Bits() > 30 {
		return nil, fmt.Errorf("subnet %s: need an IPv4 prefix of /30 or larger: %w", cfg.Subnet, errdefs.ErrInvalid)
	}
	cfg.Subnet = cfg.Subnet.Masked()
	gw := cfg.Subnet.Addr().Next()
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.NetnsPrefix == "" {
		cfg.NetnsPrefix = DefaultNetnsPrefix
	}
	if err := checkSubnetFree(cfg.Bridge, cfg.Subnet); err != nil {
		return nil, err
	}
	if err := ensureMountPoint(netnsDir); errors.Is(err, errBoundBefore) {
		cfg.Logger.Warn("network namespaces: the directory is no mount point of its own; a later `ip netns add` would hide the sandboxes' namespaces", "err", err)
	} else if err != nil {
		return nil, fmt.Errorf("network namespaces: %w", err)
	}
	m := &Manager{cfg: cfg, gateway: gw, used: map[netip.Addr]bool{}, next: gw.Next(), endpoints: map[netip.Addr]*endpoint{}}
	br, err := netlink.LinkByName(cfg.Bridge)
	if err != nil {
		la := netlink.NewLinkAttrs()
		la.Name = cfg.Bridge
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: la}); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("create bridge %s: %w", cfg.Bridge, err)
		}
		if br, err = netlink.LinkByName(cfg.Bridge); err != nil {
			return nil, fmt.Errorf("bridge %s: %w", cfg.Bridge, err)
		}
	}
	// A bridge without a MAC of its own takes the lowest of its ports', so
	// it changes as sandboxes come and go, and sandboxes that cached the
	// gateway's old MAC lose their packets to it until their ARP entry
	// expires (TCP then stalls for its retransmission backoff). A fixed
	// address never changes.
	if err := netlink.LinkSetHardwareAddr(br, bridgeMAC(cfg.Bridge)); err != nil {
		return nil, fmt.Errorf("fix the MAC address of %s: %w", cfg.Bridge, err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: gw.AsSlice(), Mask: net.CIDRMask(cfg.Subnet.Bits(), 32)}}
	if err := netlink.AddrReplace(br, addr); err != nil {
		return nil, fmt.Errorf("address %s on %s: %w", gw, cfg.Bridge, err)
	}
	if err := netlink.LinkSetUp(br); err != nil {
		return nil, fmt.Errorf("bring up %s: %w", cfg.Bridge, err)
	}
	m.bridge = br
	// Sandboxes reach the internet through the host.
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		return nil, fmt.Errorf("enable IPv4 forwarding: %w", err)
	}
	var proxyPort uint16
	if cfg.EgressProxy {
		// Its port is the redirect's: bound before the table is made.
		if m.proxyLn, err = net.Listen("tcp4", netip.AddrPortFrom(gw, 0).String()); err != nil {
			return nil, fmt.Errorf("egress proxy listener on %s: %w", gw, err)
		}
		proxyPort = uint16(m.proxyLn.Addr().(*net.TCPAddr).Port)
	}
	fail := func(err error) (*Manager, error) {
		if m.proxyLn != nil {
			m.proxyLn.Close()
		}
		return nil, err
	}
	if m.fw, err = newFirewall(cfg.Bridge, cfg.Subnet, gw, cfg.APIPort, proxyPort, cfg.Deny); err != nil {
		return fail(fmt.Errorf("firewall: %w", err))
	}
	// After the table: the iptables rules only accept, and lizard's table
	// must already reject what policies do not allow.
	if m.fwd, err = allowForward(cfg.Bridge, cfg.Run, cfg.Logger); err != nil {
		return fail(fmt.Errorf("firewall: %w", err))
	}
	upstream := cfg.DNSUpstream
	if upstream == "" {
		upstream = hostUpstream()
	}
	if m.dns, err = startResolver(gw, upstream, m.policy, m.learn, cfg.Logger); err != nil {
		m.fwd.close()
		return fail(fmt.Errorf("DNS resolver on %s: %w", gw, err))
	}
	return m, nil
}

// EgressListener is where the egress proxy accepts the connections the
// firewall redirects (Config.EgressProxy; nil without): a TCP listener on
// the gateway. Its user serves and closes it.
func (m *Manager) EgressListener() net.Listener { return m.proxyLn }

// checkSubnetFree refuses a subnet that overlaps an address of another
// interface of the host: the host would route the sandboxes' packets there,
// and no sandbox's agent would ever answer.
func checkSubnetFree(bridge string, subnet netip.Prefix) error {
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("list the host's addresses: %w", err)
	}
	for _, a := range addrs {
		p, ok := netip.AddrFromSlice(a.IP.To4())
		if !ok {
			continue
		}
		ones, _ := a.Mask.Size()
		other := netip.PrefixFrom(p, ones).Masked()
		if !other.Overlaps(subnet) {
			continue
		}
		link, err := netlink.LinkByIndex(a.LinkIndex)
		if err == nil && link.Attrs().Name == bridge {
			continue
		}
		name := fmt.Sprint("interface ", a.LinkIndex)
		if err == nil {
			name = link.Attrs().Name
		}
		return fmt.Errorf("subnet %s overlaps %s on %s: choose another subnet (--subnet) for bridge %s: %w", subnet, other, name, bridge, errdefs.ErrConflict)
	}
	return nil
}

// Close stops the sandboxes' resolver and takes lizard's rules out of the
// host's iptables FORWARD chains (the egress listener is its user's to
// close). The nftables table stays: sandboxes keep
// running, and the next Manager re-applies every policy.
func (m *Manager) Close() error {
	m.fwd.close()
	return m.dns.close()
}

// policy is what addr may reach, and whether it is known: a sandbox of an
// earlier server is known only once recovery re-applied its policy.
func (m *Manager) policy(a netip.Addr) (Egress, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ep, ok := m.endpoints[a]
	if !ok {
		// Not a sandbox we know: nothing.
		return Egress{Restricted: true}, false
	}
	return ep.egress, true
}

// learn lets addr reach what an allowed name resolved to (the resolver
// calls it before it answers).
func (m *Manager) learn(a netip.Addr, name string, ps []netip.Prefix) error {
	m.mu.Lock()
	ep, ok := m.endpoints[a]
	if !ok || !ep.egress.learnsAddresses() {
		m.mu.Unlock()
		return nil
	}
	name = canonicalName(name)
	var fresh []netip.Prefix
	for _, p := range ps {
		if !inAny(p.Addr(), ep.egress.prefixes()) && !inAny(p.Addr(), ep.learnedPrefixes()) {
			fresh = append(fresh, p)
		}
	}
	if ep.learned == nil {
		ep.learned = map[string][]netip.Prefix{}
	}
	ep.learned[name] = append(ep.learned[name], fresh...)
	m.mu.Unlock()
	return m.fw.allowRanges(a, fresh)
}

// setPolicy records and enforces what addr may reach. The addresses the
// resolver answered for names the new policy still allows stay reachable.
func (m *Manager) setPolicy(a netip.Addr, id string, e Egress) error {
	if (e.Intercepts() || e.Tunnelled()) && m.proxyLn == nil {
		return fmt.Errorf("this network has no egress proxy (domain rules on the wire, transforms, egressProxy): %w", errdefs.ErrUnavailable)
	}
	m.mu.Lock()
	ep := &endpoint{id: id, egress: e}
	if old, ok := m.endpoints[a]; ok && e.learnsAddresses() {
		for name, ps := range old.learned {
			if e.AllowsName(name) {
				if ep.learned == nil {
					ep.learned = map[string][]netip.Prefix{}
				}
				ep.learned[name] = ps
			}
		}
	}
	m.endpoints[a] = ep
	learned := ep.learnedPrefixes()
	// The firewall is changed under the lock, so that two changes of one
	// address cannot apply in the other order than they were recorded.
	defer m.mu.Unlock()
	return m.fw.apply(a, e, learned)
}

// SetEgress replaces the policy of sandbox id's endpoint, at once for
// new connections (connections already made keep going).
func (m *Manager) SetEgress(id string, ep Endpoint, e Egress) error {
	if !ep.Addr.IsValid() {
		return fmt.Errorf("sandbox %q has no address: %w", id, errdefs.ErrNotFound)
	}
	return m.setPolicy(ep.Addr, id, e)
}

// Source is what the manager knows of the sandbox at an address.
type Source struct {
	ID     string
	Egress Egress
	// Learned are the addresses its resolver answered for names its
	// policy allows (Egress.AllowsAddr).
	Learned []netip.Prefix
}

// Lookup is the sandbox whose endpoint has address a, if its policy is
// known.
func (m *Manager) Lookup(a netip.Addr) (Source, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ep, ok := m.endpoints[a]
	if !ok {
		return Source{}, false
	}
	return Source{ID: ep.id, Egress: ep.egress, Learned: ep.learnedPrefixes()}, true
}

// Forbidden says whether a destination is never the egress proxy's to
// dial whatever a policy says: what the firewall rejects for every
// sandbox (169.254.0.0/16, the subnet, Config.Deny) and the host itself
// (loopback, its own addresses), which sandboxes never reach.
func (m *Manager) Forbidden(a netip.Addr) bool {
	a = a.Unmap()
	if !a.Is4() || a.IsLoopback() || a.IsUnspecified() || a.IsMulticast() || a.IsLinkLocalUnicast() || m.cfg.Subnet.Contains(a) || inAny(a, m.cfg.Deny) {
		return true
	}
	routes, err := netlink.RouteGet(a.AsSlice())
	if err != nil {
		return true
	}
	for _, r := range routes {
		if r.Type == unix.RTN_LOCAL {
			return true
		}
	}
	return false
}

// Attach takes back a running sandbox's endpoint after a restart: its
// address is reserved and its egress policy enforced again.
func (m *Manager) Attach(id string, ep Endpoint, e Egress) error {
	if !ep.Addr.IsValid() {
		return nil
	}
	m.Reserve(ep.Addr)
	m.mu.Lock()
	_, known := m.endpoints[ep.Addr]
	m.mu.Unlock()
	if known {
		// Already enforced, with what its DNS answers added.
		return nil
	}
	return m.setPolicy(ep.Addr, id, e)
}

// bridgeMAC is a locally administered unicast address derived from the
// bridge's name, the same at every start.
func bridgeMAC(name string) net.HardwareAddr {
	h := sha256.Sum256([]byte("lizard bridge " + name))
	return net.HardwareAddr{0x02, h[0], h[1], h[2], h[3], h[4]}
}

// Reserve marks addr as taken (used when reattaching to running sandboxes).
func (m *Manager) Reserve(addr netip.Addr) {
	m.mu.Lock()
	m.used[addr] = true
	m.mu.Unlock()
}

// allocate returns a free address, scanning the subnet round-robin so that a
// just-released address is not handed out again at once.
func (m *Manager) allocate() (netip.Addr, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	a := m.next
	for range 1 << (32 - m.cfg.Subnet.Bits()) {
		if !m.cfg.Subnet.Contains(a) || a == m.gateway || isBroadcast(a, m.cfg.Subnet) {
			a = m.gateway.Next()
			continue
		}
		if !m.used[a] {
			m.used[a] = true
			m.next = a.Next()
			return a, nil
		}
		a = a.Next()
	}
	return netip.Addr{}, fmt.Errorf("subnet %s: no free address: %w", m.cfg.Subnet, errdefs.ErrLimit)
}

func (m *Manager) release(a netip.Addr) {
	m.mu.Lock()
	delete(m.used, a)
	m.mu.Unlock()
}

func isBroadcast(a netip.Addr, p netip.Prefix) bool {
	b := a.As4()
	host := 32 - p.Bits()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	mask := uint32(1)<<host - 1
	return v&mask == mask
}

// names derives the namespace and host veth names from a sandbox id and
// the namespace prefix; veth names are limited to 15 bytes, so they use a
// hash.
func names(prefix, id string) (nsName, hostVeth string) {
	h := sha256.Sum256([]byte(id))
	return prefix + "-" + id, "lzv" + hex.EncodeToString(h[:])[:11]
}

// Setup creates the namespace, the veth pair and the addressing for sandbox
// id. On failure everything it made is removed again.
func (m *Manager) Setup(id string, e Egress) (Endpoint, error) {
	addr, err := m.allocate()
	if err != nil {
		return Endpoint{}, err
	}
	ep, err := m.setup(id, addr)
	if err != nil {
		return ep, err
	}
	if err := m.setPolicy(addr, id, e); err != nil {
		m.Teardown(ep)
		return Endpoint{}, fmt.Errorf("egress policy: %w", err)
	}
	return ep, nil
}

// Rebuild makes ep's namespace and veth again when they are gone (after a
// reboot of the machine, for a paused sandbox): same names, same address.
// It does nothing when the namespace exists.
func (m *Manager) Rebuild(id string, ep Endpoint, e Egress) error {
	if _, err := os.Stat(ep.Netns); err == nil {
		return nil
	}
	if _, err := m.setup(id, ep.Addr); err != nil {
		return err
	}
	return m.Attach(id, ep, e)
}

func (m *Manager) setup(id string, addr netip.Addr) (ep Endpoint, err error) {
	nsName, hostVeth := names(m.cfg.NetnsPrefix, id)
	ep = Endpoint{Netns: netnsDir + "/" + nsName, HostVeth: hostVeth, Addr: addr, Gateway: m.gateway, Bits: m.cfg.Subnet.Bits()}
	defer func() {
		if err != nil {
			m.Teardown(ep)
		}
	}()
	ns, err := newNamedNetns(nsName)
	if err != nil {
		return ep, fmt.Errorf("netns %s: %w", nsName, err)
	}
	defer ns.Close()

	la := netlink.NewLinkAttrs()
	la.Name = hostVeth
	la.MasterIndex = m.bridge.Attrs().Index
	veth := &netlink.Veth{LinkAttrs: la, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(ns))}
	if err := netlink.LinkAdd(veth); err != nil {
		return ep, fmt.Errorf("veth %s: %w", hostVeth, err)
	}
	host, err := netlink.LinkByName(hostVeth)
	if err != nil {
		return ep, fmt.Errorf("veth %s: %w", hostVeth, err)
	}
	if err := netlink.LinkSetIsolated(host, true); err != nil {
		return ep, fmt.Errorf("isolate %s: %w", hostVeth, err)
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return ep, fmt.Errorf("up %s: %w", hostVeth, err)
	}
	if err := ConfigureInside(ep); err != nil {
		return ep, err
	}
	// The host may still have the address's previous owner's MAC cached;
	// frames to it would be lost until the entry expires.
	m.forgetNeighbor(addr)
	return ep, nil
}

// forgetNeighbor drops the host's ARP entry for addr on the bridge.
func (m *Manager) forgetNeighbor(addr netip.Addr) {
	netlink.NeighDel(&netlink.Neigh{LinkIndex: m.bridge.Attrs().Index, Family: netlink.FAMILY_V4, IP: addr.AsSlice()})
}

// ConfigureInside (re)applies the sandbox side's address, links and default
// route. runsc takes the addresses off the veth when it boots a sandbox, so a
// restore into the same namespace needs them put back first.
func ConfigureInside(ep Endpoint) error {
	ns, err := netns.GetFromPath(ep.Netns)
	if err != nil {
		return fmt.Errorf("open %s: %w", ep.Netns, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("netlink in %s: %w", ep.Netns, err)
	}
	defer h.Close()
	eth, err := h.LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("eth0 in %s: %w", ep.Netns, err)
	}
	a := &netlink.Addr{IPNet: &net.IPNet{IP: ep.Addr.AsSlice(), Mask: net.CIDRMask(ep.Bits, 32)}}
	if err := h.AddrReplace(eth, a); err != nil {
		return fmt.Errorf("address %s: %w", ep.Addr, err)
	}
	if err := h.LinkSetUp(eth); err != nil {
		return fmt.Errorf("up eth0: %w", err)
	}
	if lo, err := h.LinkByName("lo"); err == nil {
		if err := h.LinkSetUp(lo); err != nil {
			return fmt.Errorf("up lo: %w", err)
		}
	}
	route := &netlink.Route{LinkIndex: eth.Attrs().Index, Gw: ep.Gateway.AsSlice()}
	if err := h.RouteReplace(route); err != nil {
		return fmt.Errorf("default route: %w", err)
	}
	return nil
}

// Teardown removes the veth pair and the namespace and releases the address.
// It is idempotent: missing pieces are skipped.
func (m *Manager) Teardown(ep Endpoint) error {
	var errs []error
	if l, err := netlink.LinkByName(ep.HostVeth); err == nil {
		if err := netlink.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("delete %s: %w", ep.HostVeth, err))
		}
	}
	if ep.Netns != "" {
		if err := unix.Unmount(ep.Netns, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", ep.Netns, err))
		}
		if err := os.Remove(ep.Netns); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if ep.Addr.IsValid() {
		m.mu.Lock()
		delete(m.endpoints, ep.Addr)
		m.mu.Unlock()
		if err := m.fw.remove(ep.Addr); err != nil {
			errs = append(errs, fmt.Errorf("firewall: %w", err))
		}
		m.forgetNeighbor(ep.Addr)
		m.release(ep.Addr)
	}
	return errors.Join(errs...)
}

// newNamedNetns creates a network namespace bound at /run/netns/name without
// moving the calling goroutine's thread into it for longer than needed.
func newNamedNetns(name string) (netns.NsHandle, error) {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return netns.None(), err
	}
	defer orig.Close()
	ns, err := netns.NewNamed(name)
	if serr := netns.Set(orig); serr != nil {
		// The thread is stuck in the wrong namespace: keep it locked so
		// that it dies with the goroutine instead of being reused.
		if err == nil {
			ns.Close()
		}
		return netns.None(), fmt.Errorf("return to host netns: %w", serr)
	}
	runtime.UnlockOSThread()
	return ns, err
}

// EndpointFor returns the names an endpoint for id would have under
// namespace prefix (Config.NetnsPrefix, "" for the default), without an
// address; enough for Teardown of a leftover.
func EndpointFor(prefix, id string) Endpoint {
	if prefix == "" {
		prefix = DefaultNetnsPrefix
	}
	nsName, hostVeth := names(prefix, id)
	return Endpoint{Netns: netnsDir + "/" + nsName, HostVeth: hostVeth}
}

// EndpointFor is the package's EndpointFor under m's namespace prefix.
func (m *Manager) EndpointFor(id string) Endpoint { return EndpointFor(m.cfg.NetnsPrefix, id) }

// NetnsPrefix is the prefix of m's namespaces' names: /run/netns/<prefix>-<id>.
func (m *Manager) NetnsPrefix() string { return m.cfg.NetnsPrefix }

// Gateway is the bridge's address, the sandboxes' gateway: they reach the
// host at it.
func (m *Manager) Gateway() netip.Addr { return m.gateway }

// APIURL is where endpoints with Egress.NodeAPI reach the server's API
// (http://<gateway>:<Config.APIPort>); "" when none may.
func (m *Manager) APIURL() string {
	if m.cfg.APIPort == 0 {
		return ""
	}
	return "http://" + netip.AddrPortFrom(m.gateway, m.cfg.APIPort).String()
}

// Bridge is the name of the bridge m's endpoints hang on.
func (m *Manager) Bridge() string { return m.cfg.Bridge }

// Ready checks that the bridge sandboxes hang on exists and is up.
func (m *Manager) Ready() error {
	br, err := netlink.LinkByName(m.cfg.Bridge)
	if err != nil {
		return fmt.Errorf("bridge %s: %w", m.cfg.Bridge, err)
	}
	if br.Attrs().Flags&net.FlagUp == 0 {
		return fmt.Errorf("bridge %s is down", m.cfg.Bridge)
	}
	return nil
}
