// Package netguard is the rule for connections the host makes on a user's
// behalf (image pulls of Dockerfile builds, webhook deliveries): they must
// not reach what sandboxes cannot. A destination on a loopback,
// link-local or private address (the host's own services, the cloud's
// metadata service, the operator's network) is refused before any
// connection, unless the operator allows that host (--registry-allow,
// --webhook-allow). The check is made on every address a name resolves
// to, and again on the address each connection dials (redirects and DNS
// answers that change between the two included). internal/template and
// internal/webhook import it.
package netguard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// ErrRefused is the cause of a refused destination (for the log and for
// errors.Is; the messages clients get say it in their own words).
var ErrRefused = errors.New("address refused")

// Policy is what the host's connections of one kind may reach beyond
// public addresses. The zero value (and nil) allows public addresses only.
type Policy struct {
	allow map[string]bool // "host" (any port) or "host:port", lower case
}

// New makes the policy of HOST[:PORT] entries given to the operator's
// flag (named in errors, e.g. "--registry-allow").
func New(flag string, allow []string) (*Policy, error) {
	p := &Policy{allow: map[string]bool{}}
	for _, a := range allow {
		a = strings.ToLower(strings.TrimSpace(a))
		host := a
		if h, port, err := net.SplitHostPort(a); err == nil {
			if port == "" || strings.Trim(port, "0123456789") != "" {
				return nil, fmt.Errorf("%s %q: want HOST or HOST:PORT: %w", flag, a, errdefs.ErrInvalid)
			}
			host = h
		}
		if host == "" || strings.ContainsAny(host, "/ @") {
			return nil, fmt.Errorf("%s %q: want HOST or HOST:PORT: %w", flag, a, errdefs.ErrInvalid)
		}
		p.allow[a] = true
	}
	return p, nil
}

// Allowed reports whether the operator allowed host:port (port may be
// ""): a host allowed at any port, or at this one.
func (p *Policy) Allowed(host, port string) bool {
	if p == nil {
		return false
	}
	host = strings.ToLower(strings.Trim(host, "[]"))
	if p.allow[host] {
		return true
	}
	return port != "" && p.allow[net.JoinHostPort(host, port)]
}

// Refused reports whether a connection may not go to a (unless allowed):
// the host's own addresses, link-local (169.254.0.0/16: cloud metadata)
// and private ranges, carrier-grade NAT, and what is not a unicast
// address.
func Refused(a netip.Addr) bool {
	a = a.Unmap()
	return !a.IsValid() || a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsPrivate() || a.IsUnspecified() ||
		a.IsMulticast() || a.IsLinkLocalMulticast() || a.IsInterfaceLocalMulticast() ||
		sharedAddressSpace.Contains(a) || thisNetwork.Contains(a)
}

var (
	sharedAddressSpace = netip.MustParsePrefix("100.64.0.0/10") // carrier-grade NAT
	thisNetwork        = netip.MustParsePrefix("0.0.0.0/8")
)

// Check refuses hostport (host or host:port) unless it is allowed or
// every address its host resolves to is public. A refusal wraps
// ErrRefused; a name that does not resolve is the resolver's error.
// "localhost" and names under it are loopback by definition (RFC 6761)
// and refused without asking a resolver, which may not know them.
func (p *Policy) Check(ctx context.Context, hostport string) error {
	host, port := hostport, ""
	if h, pt, err := net.SplitHostPort(hostport); err == nil {
		host, port = h, pt
	}
	if p.Allowed(host, port) {
		return nil
	}
	if name := strings.TrimSuffix(strings.ToLower(host), "."); name == "localhost" || strings.HasSuffix(name, ".localhost") {
		return fmt.Errorf("%s: %w", host, ErrRefused)
	}
	if a, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		if Refused(a) {
			return fmt.Errorf("%s: %w", a, ErrRefused)
		}
		return nil
	}
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return fmt.Errorf("resolve %s: %w", host, err)
	}
	for _, a := range addrs {
		if Refused(a) {
			return fmt.Errorf("%s resolves to %s: %w", host, a, ErrRefused)
		}
	}
	return nil
}

// DialContext is d's DialContext under the policy: allowed hosts are
// dialled as they are, anything else only at addresses Refused accepts
// (the check is on the address connected to, after resolution). A client
// using it must use no proxy: a proxy would connect where the check
// cannot see.
func (p *Policy) DialContext(d *net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	guarded := *d
	guarded.Control = func(network, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil || Refused(ap.Addr()) {
			return fmt.Errorf("dial %s: %w", address, ErrRefused)
		}
		return nil
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, port, _ := net.SplitHostPort(addr)
		if p.Allowed(host, port) {
			return d.DialContext(ctx, network, addr)
		}
		return guarded.DialContext(ctx, network, addr)
	}
}
