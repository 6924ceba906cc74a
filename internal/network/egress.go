package network

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// Egress is what a sandbox may reach outside its host: E2B's network model
// (allowOut, denyOut, rules, egressProxy, httpsPorts), of which the Lizard
// API's internetAccess and allowedHosts are special cases. The zero value
// is open: anything, through NAT.
//
// A connection to address a, by name n when the egress proxy read one (the
// SNI of TLS or the Host of HTTP, on ports 80 and 443), is decided so
// (Allows):
//
//  1. n matches an allowed domain, or a lies in an allowed range: allowed
//     (allowed entries win over denied ones);
//  2. a lies in a denied range (every address when Restricted): denied;
//  3. otherwise allowed.
//
// Without a name (other ports, UDP, TLS without SNI) an allowed domain
// counts through the addresses the gateway's resolver answered for it
// (the address path), as it always did.
//
// An Egress is a value: it is replaced whole (Update, SetEgress), never
// changed in place, so copies of a record may share its slices and maps.
type Egress struct {
	// Restricted: everything not allowed is denied (denyOut 0.0.0.0/0,
	// E2B's allow_internet_access false, the Lizard API's internetAccess
	// false or allowedHosts).
	Restricted bool `json:"restricted,omitempty"`
	// Allowed is allowOut: CIDRs, IPv4 addresses, domain names and
	// "*.domain" wildcards, normalized (lower case, masked prefixes).
	Allowed []string `json:"allowed,omitempty"`
	// Denied is denyOut as given, normalized: CIDRs and addresses only
	// (0.0.0.0/0 among them makes Restricted). Empty with Restricted in
	// records of older servers, which had no denyOut.
	Denied []string `json:"denied,omitempty"`
	// NodeAPI lets the sandbox reach the node's API on the gateway
	// (Config.APIPort), whatever else it may reach: a sandbox given an
	// API key for the lizard CLI inside it. Without it no host service
	// but the gateway's DNS is reachable.
	NodeAPI bool `json:"nodeApi,omitempty"`
	// Rules are the transforms of outbound HTTP and HTTPS requests by
	// host (see Rule); they grant no access.
	Rules map[string][]Rule `json:"rules,omitempty"`
	// Proxy tunnels the sandbox's allowed outbound TCP through a SOCKS5
	// proxy (E2B's egressProxy); nil sends it out directly.
	Proxy *SOCKSProxy `json:"egressProxy,omitempty"`
	// HTTPSPorts are sandbox ports the preview proxy reaches over TLS,
	// unverified (E2B's httpsPorts). Not egress, but E2B's network
	// configuration; kept by network updates.
	HTTPSPorts []int `json:"httpsPorts,omitempty"`
}

// IsZero reports whether e is the default: everything reachable, nothing
// transformed, no proxy, no HTTPS ports.
func (e Egress) IsZero() bool {
	return !e.Restricted && len(e.Allowed) == 0 && len(e.Denied) == 0 && !e.NodeAPI &&
		len(e.Rules) == 0 && e.Proxy == nil && len(e.HTTPSPorts) == 0
}

// SOCKSProxy is E2B's egressProxy: a SOCKS5 proxy the sandbox's outbound
// TCP is tunnelled through, after filtering, with username/password
// authentication (RFC 1929) when Username is set. The password is never
// shown (Settings leaves it out).
type SOCKSProxy struct {
	Address  string `json:"address"`
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
}

// Caps of one sandbox's configuration.
const (
	// MaxAllowedHosts caps allowOut (and allowedHosts).
	MaxAllowedHosts = 64
	// MaxDeniedRanges caps denyOut.
	MaxDeniedRanges = 64
	// MaxHTTPSPorts caps httpsPorts.
	MaxHTTPSPorts = 32
)

// allTraffic is E2B's ALL_TRAFFIC: every IPv4 address.
const allTraffic = "0.0.0.0/0"

// ParseEgress validates the Lizard API's internetAccess and allowedHosts;
// allowed hosts imply no other internet access.
func ParseEgress(internetAccess *bool, allowedHosts []string) (Egress, error) {
	e := Egress{Restricted: (internetAccess != nil && !*internetAccess) || len(allowedHosts) > 0}
	allowed, err := parseAllowed("allowedHosts", allowedHosts)
	if err != nil {
		return Egress{}, err
	}
	e.Allowed = allowed
	return e, nil
}

// Settings is a sandbox's network configuration as the APIs carry it:
// E2B's SandboxNetworkConfig (without allowPublicTraffic and
// maskRequestHost, which the E2B edge keeps itself) and SandboxNetworkUpdateConfig, and the Lizard
// API's `network`. Settings of an Egress show the proxy's password as "".
type Settings struct {
	AllowOut    []string          `json:"allowOut,omitempty"`
	DenyOut     []string          `json:"denyOut,omitempty"`
	Rules       map[string][]Rule `json:"rules,omitempty"`
	EgressProxy *SOCKSProxy       `json:"egressProxy,omitempty"`
	HTTPSPorts  []int             `json:"httpsPorts,omitempty"`
}

// ParseSettings validates s (field names the object in errors, e.g.
// "network"); internetAccess false adds 0.0.0.0/0 to denyOut, as E2B's
// allow_internet_access does. Errors are ErrInvalid naming the field.
// Placeholders in header values are checked for their syntax only (see
// Placeholders for the names to look up).
func ParseSettings(field string, s Settings, internetAccess *bool) (Egress, error) {
	var e Egress
	var err error
	if len(s.AllowOut) > MaxAllowedHosts {
		return Egress{}, invalidf("%s.allowOut: %d entries, at most %d", field, len(s.AllowOut), MaxAllowedHosts)
	}
	if e.Allowed, err = parseAllowed(field+".allowOut", s.AllowOut); err != nil {
		return Egress{}, err
	}
	if len(s.DenyOut) > MaxDeniedRanges {
		return Egress{}, invalidf("%s.denyOut: %d entries, at most %d", field, len(s.DenyOut), MaxDeniedRanges)
	}
	for i, d := range s.DenyOut {
		p, err := parseRange(d)
		if err != nil {
			return Egress{}, invalidf("%s.denyOut[%d] %q: %s (deny rules take CIDRs and IPv4 addresses only, no domain names)", field, i, d, err)
		}
		e.Denied = append(e.Denied, p)
	}
	if internetAccess != nil && !*internetAccess && !slices.Contains(e.Denied, allTraffic) {
		e.Denied = append(e.Denied, allTraffic)
	}
	e.Restricted = slices.Contains(e.Denied, allTraffic)
	if e.Rules, err = parseRules(field+".rules", s.Rules); err != nil {
		return Egress{}, err
	}
	if s.EgressProxy != nil {
		p, err := parseSOCKS(field+".egressProxy", *s.EgressProxy)
		if err != nil {
			return Egress{}, err
		}
		e.Proxy = &p
	}
	if len(s.HTTPSPorts) > MaxHTTPSPorts {
		return Egress{}, invalidf("%s.httpsPorts: %d ports, at most %d", field, len(s.HTTPSPorts), MaxHTTPSPorts)
	}
	for i, p := range s.HTTPSPorts {
		if p < 1 || p > 65535 {
			return Egress{}, invalidf("%s.httpsPorts[%d]: %d is not a port (1 to 65535)", field, i, p)
		}
		if p == agentPort {
			return Egress{}, invalidf("%s.httpsPorts[%d]: %d is the sandbox agent's (envd's) port, which cannot be listed", field, i, p)
		}
		if !slices.Contains(e.HTTPSPorts, p) {
			e.HTTPSPorts = append(e.HTTPSPorts, p)
		}
	}
	return e, nil
}

// agentPort is agent.Port (the network package imports no agent).
const agentPort = 49983

// Settings is e as the APIs show it: denyOut with 0.0.0.0/0 for an older
// record's Restricted, placeholders as written, never the proxy's
// password.
func (e Egress) Settings() Settings {
	s := Settings{AllowOut: e.Allowed, DenyOut: e.Denied, Rules: e.Rules, HTTPSPorts: e.HTTPSPorts}
	if len(s.DenyOut) == 0 && e.Restricted {
		s.DenyOut = []string{allTraffic}
	}
	if e.Proxy != nil {
		s.EgressProxy = &SOCKSProxy{Address: e.Proxy.Address, Username: e.Proxy.Username}
	}
	return s
}

// WithSettings is e with the egress part of n (allowOut, denyOut, rules,
// egressProxy) in place of its own: what a network update replaces. What
// is not egress (NodeAPI, HTTPSPorts) stays e's.
func (e Egress) WithSettings(n Egress) Egress {
	n.NodeAPI, n.HTTPSPorts = e.NodeAPI, e.HTTPSPorts
	return n
}

func parseAllowed(field string, hosts []string) ([]string, error) {
	if len(hosts) > MaxAllowedHosts {
		return nil, invalidf("%s: %d entries, at most %d", field, len(hosts), MaxAllowedHosts)
	}
	var out []string
	for i, h := range hosts {
		n, err := normalizeHost(h)
		if err != nil {
			return nil, invalidf("%s[%d] %q: %s (want a domain like pypi.org, a wildcard like *.github.com, an IPv4 address or a CIDR like 10.0.0.0/8)", field, i, h, err)
		}
		out = append(out, n)
	}
	return out, nil
}

// parseRange normalizes a CIDR or an IPv4 address (a /32).
func parseRange(s string) (string, error) {
	s = strings.TrimSpace(s)
	if p, err := netip.ParsePrefix(s); err == nil {
		if !p.Addr().Is4() {
			return "", fmt.Errorf("only IPv4 ranges are supported")
		}
		return p.Masked().String(), nil
	}
	if a, err := netip.ParseAddr(s); err == nil {
		if !a.Is4() {
			return "", fmt.Errorf("only IPv4 addresses are supported")
		}
		return a.String(), nil
	}
	return "", fmt.Errorf("not a CIDR or an IPv4 address")
}

// normalizeHost normalizes an allow entry: a range (parseRange) or a
// domain name, or "*." and a domain name (a bare "*" is not one).
func normalizeHost(h string) (string, error) {
	h = strings.TrimSpace(strings.ToLower(h))
	if h == "*" {
		return "", fmt.Errorf("a bare * is not allowed (0.0.0.0/0 is every address, *.example.com every subdomain of example.com)")
	}
	if strings.ContainsAny(h, ":/") || isAddrLike(h) {
		return parseRange(h)
	}
	name, wild := strings.CutPrefix(h, "*.")
	if err := checkDomain(name, wild); err != nil {
		return "", err
	}
	name = strings.TrimSuffix(name, ".")
	if wild {
		return "*." + name, nil
	}
	return name, nil
}

// isAddrLike: digits and dots only (a mistyped address, not a name).
func isAddrLike(s string) bool {
	return s != "" && strings.Trim(s, "0123456789.") == ""
}

// checkDomain checks a DNS name (after any "*."): letters, digits and
// dashes in labels of 1 to 63, at least two labels unless a wildcard's
// (or localhost).
func checkDomain(name string, wild bool) error {
	name = strings.TrimSuffix(name, ".")
	if name == "" || len(name) > 253 || !strings.Contains(name, ".") && !wild && name != "localhost" {
		return fmt.Errorf("not a domain name")
	}
	for _, label := range strings.Split(name, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("not a domain name")
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("not a domain name")
			}
		}
	}
	return nil
}

func parseSOCKS(field string, p SOCKSProxy) (SOCKSProxy, error) {
	host, port, err := net.SplitHostPort(strings.TrimSpace(p.Address))
	if err != nil || host == "" {
		return SOCKSProxy{}, invalidf("%s.address %q: want host:port (e.g. proxy.example.com:1080)", field, p.Address)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return SOCKSProxy{}, invalidf("%s.address %q: port must be 1 to 65535", field, p.Address)
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if !a.Is4() {
			return SOCKSProxy{}, invalidf("%s.address %q: only IPv4 addresses are supported", field, p.Address)
		}
	} else if err := checkDomain(strings.ToLower(host), false); err != nil {
		return SOCKSProxy{}, invalidf("%s.address %q: %s", field, p.Address, err)
	}
	if len(p.Username) > 255 || len(p.Password) > 255 {
		return SOCKSProxy{}, invalidf("%s: username and password are at most 255 bytes each", field)
	}
	if p.Password != "" && p.Username == "" {
		return SOCKSProxy{}, invalidf("%s.password: only with a username", field)
	}
	return SOCKSProxy{Address: net.JoinHostPort(strings.ToLower(host), port), Username: p.Username, Password: p.Password}, nil
}

func (e Egress) open() bool { return !e.Restricted }

// prefixes are the allowed CIDRs and addresses.
func (e Egress) prefixes() []netip.Prefix { return ranges(e.Allowed) }

// deniedPrefixes are the denied ranges other than everything (which
// Restricted stands for).
func (e Egress) deniedPrefixes() []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ranges(e.Denied) {
		if p.Bits() > 0 {
			out = append(out, p)
		}
	}
	return out
}

func ranges(entries []string) []netip.Prefix {
	var out []netip.Prefix
	for _, h := range entries {
		if p, err := netip.ParsePrefix(h); err == nil {
			out = append(out, p)
		} else if a, err := netip.ParseAddr(h); err == nil {
			out = append(out, netip.PrefixFrom(a, 32))
		}
	}
	return out
}

// domains are the allowed domain names and wildcards.
func (e Egress) domains() []string {
	var out []string
	for _, h := range e.Allowed {
		if _, err := parseRange(h); err != nil {
			out = append(out, h)
		}
	}
	return out
}

// denies says whether anything is denied at all.
func (e Egress) denies() bool { return e.Restricted || len(e.deniedPrefixes()) > 0 }

// AllowsName says whether a DNS name matches an allowed domain (any case,
// with or without its final dot).
func (e Egress) AllowsName(name string) bool {
	name = canonicalName(name)
	for _, h := range e.domains() {
		if matchDomain(h, name) {
			return true
		}
	}
	return false
}

// resolves says whether the gateway's resolver answers name: a sandbox
// whose everything else is denied resolves only the names it may reach.
func (e Egress) resolves(name string) bool { return e.open() || e.AllowsName(name) }

// learnsAddresses says whether the resolver's answers for allowed names
// open their addresses (the address path): only when something is denied
// that they could be in.
func (e Egress) learnsAddresses() bool { return e.denies() && len(e.domains()) > 0 }

// Allows decides a connection to addr, by name when it is known (""
// when not): see Egress.
func (e Egress) Allows(addr netip.Addr, name string) bool {
	if name != "" && e.AllowsName(name) {
		return true
	}
	if inAny(addr, e.prefixes()) {
		return true
	}
	if e.Restricted || inAny(addr, e.deniedPrefixes()) {
		return false
	}
	return true
}

// AllowsAddr decides a connection to addr without a name: Allows, with
// the addresses the resolver answered for allowed names (learned) counted
// as allowed.
func (e Egress) AllowsAddr(addr netip.Addr, learned []netip.Prefix) bool {
	return e.Allows(addr, "") || inAny(addr, learned)
}

func inAny(a netip.Addr, ps []netip.Prefix) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Intercepts says whether the sandbox's TCP to ports 80 and 443 goes
// through the egress proxy: when names decide (domains are allowed and
// something is denied), when requests are transformed, or when a SOCKS5
// proxy tunnels it. Its UDP 443 (QUIC) is refused then.
func (e Egress) Intercepts() bool {
	return len(e.Rules) > 0 || e.Proxy != nil || e.learnsAddresses()
}

// Tunnelled says whether all the sandbox's TCP goes through the egress
// proxy (to its SOCKS5 proxy), not only ports 80 and 443.
func (e Egress) Tunnelled() bool { return e.Proxy != nil }

// canonicalName lower-cases a DNS name and drops its final dot.
func canonicalName(name string) string { return strings.TrimSuffix(strings.ToLower(name), ".") }

// matchDomain matches a name against an allow entry or rule key: equal,
// or for "*.d" a subdomain of d at any depth (not d itself).
func matchDomain(pattern, name string) bool {
	if wild, ok := strings.CutPrefix(pattern, "*."); ok {
		return strings.HasSuffix(name, "."+wild)
	}
	return name == pattern
}

func invalidf(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, errdefs.ErrInvalid)...)
}
