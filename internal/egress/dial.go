package egress

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/net/proxy"
)

// dialTimeout bounds a connection to an upstream, or to a SOCKS5 proxy
// and its CONNECT.
const dialTimeout = 10 * time.Second

// forbiddenError is a dial the proxy refused itself.
type forbiddenError struct{ addr netip.Addr }

func (e *forbiddenError) Error() string {
	return fmt.Sprintf("%s is never reachable from a sandbox (the host, the sandboxes' subnet, link-local)", e.addr)
}

// dial connects to dst, the address the sandbox connected to, for src:
// directly, or through src's SOCKS5 proxy — by name (SOCKS's domain
// address type, resolved by the proxy) when name is one of the allowed
// domains, else by address. Either way a forbidden address is refused,
// the SOCKS5 proxy's own included; a proxy that cannot be reached or
// refuses fails the dial (egress fails closed, never goes direct).
func (p *Proxy) dial(ctx context.Context, src Source, dst netip.AddrPort, name string) (net.Conn, error) {
	if p.cfg.Forbidden(dst.Addr()) {
		return nil, &forbiddenError{dst.Addr()}
	}
	check := func(network, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return err
		}
		if p.cfg.Forbidden(ap.Addr()) {
			return &forbiddenError{ap.Addr()}
		}
		return nil
	}
	d := &net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second, Control: check}
	sp := src.Egress.Proxy
	if sp == nil {
		return d.DialContext(ctx, "tcp4", dst.String())
	}
	var auth *proxy.Auth
	if sp.Username != "" {
		auth = &proxy.Auth{User: sp.Username, Password: sp.Password}
	}
	sd, err := proxy.SOCKS5("tcp4", sp.Address, auth, d)
	if err != nil {
		return nil, fmt.Errorf("egress proxy %s: %w", sp.Address, err)
	}
	target := dst.String()
	if name != "" && src.Egress.AllowsName(name) {
		target = net.JoinHostPort(name, strconv.Itoa(int(dst.Port())))
	}
	c, err := sd.(proxy.ContextDialer).DialContext(ctx, "tcp", target)
	if err != nil {
		return nil, fmt.Errorf("egress proxy %s: %w", sp.Address, err)
	}
	return c, nil
}
