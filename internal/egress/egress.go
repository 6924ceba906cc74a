// Package egress is the node's transparent egress proxy: the firewall
// (internal/network) redirects the outbound TCP of sandboxes whose network
// configuration needs it — ports 80 and 443 where names decide or requests
// are transformed, every port where a SOCKS5 proxy tunnels it — to a
// listener on the gateway, and the proxy decides each connection on the
// wire:
//
//   - TLS by the SNI of its ClientHello, plain HTTP by the Host of each
//     request, checked against the sandbox's configuration at that moment
//     (network.Egress.Allows), not against what its DNS answered: a name
//     that is not allowed is refused even on the address of one that is;
//   - an allowed TLS connection to a host without transform rules is
//     spliced byte for byte (never decrypted: the sandbox sees the
//     upstream's own certificate);
//   - one to a host with rules is terminated with a certificate of the
//     node's CA (CA), whose certificate every sandbox trusts, and
//     re-originated to the same address with TLS verified against the
//     host's trust store plus the operator's extra CAs; each request gets
//     its transform's headers, placeholders resolved at that moment
//     (Secrets, Tokens), or a 502 naming what could not be resolved;
//   - HTTP/1.1, HTTP/2, WebSocket upgrades and large bodies stream;
//   - with a SOCKS5 proxy the upstream connection goes through it,
//     domain-matched ones by name.
//
// Every decision goes to the sandbox's egress log (Log) and to the
// Recorder. Only cmd/lizard wires it; internal/sandbox/netconf reads its
// logs.
package egress

import (
	"context"
	"crypto/x509"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/lizard-build/lizard/internal/network"
)

// Source is the sandbox a connection comes from, as the proxy decides by.
type Source struct {
	SandboxID string
	ProjectID string
	Egress    network.Egress
	// Learned are the addresses the gateway's resolver answered for the
	// names the configuration allows (network.Egress.AllowsAddr).
	Learned []netip.Prefix
}

// Sources tells the proxy which sandbox an address is.
type Sources interface {
	// Source is the sandbox whose address is a, with its configuration
	// now; false for an address of no known sandbox (its connections are
	// refused).
	Source(a netip.Addr) (Source, bool)
	// Exists says whether sandbox id is still there (its log is dropped
	// once it is not).
	Exists(id string) bool
}

// Secrets resolves ${e2b.secrets.NAME} for a project: the current value, or
// an error wrapping errdefs.ErrNotFound when there is none. name is as the
// placeholder writes it.
type Secrets interface {
	SecretValue(ctx context.Context, projectID, name string) (string, error)
}

// Tokens mints ${e2b.identity.tokens.NAME} for a sandbox: a fresh
// short-lived JWT, or errdefs.ErrNotFound for an unknown token name.
type Tokens interface {
	MintToken(ctx context.Context, projectID, sandboxID, name string) (string, error)
}

// Recorder counts what the proxy does (internal/metrics).
type Recorder interface {
	// EgressConnection counts a connection by decision: spliced,
	// intercepted, http, tcp (allowed, by how), denied, error.
	EgressConnection(decision string)
	// EgressRequest counts a request of a parsed connection by outcome:
	// forwarded, denied, unresolved, misdirected, upstream_error.
	EgressRequest(outcome string)
	// EgressBytes counts bytes by direction: out (sandbox to upstream),
	// in.
	EgressBytes(direction string, n int64)
}

// Config wires the proxy.
type Config struct {
	// Listener is where the firewall sends redirected connections
	// (network.Manager.EgressListener); Serve closes it.
	Listener net.Listener
	Sources  Sources
	// Forbidden says which addresses are never dialled whatever a
	// configuration allows (network.Manager.Forbidden): the host, the
	// sandboxes' subnet, link-local ranges.
	Forbidden func(netip.Addr) bool
	// CA signs the certificates of intercepted hosts.
	CA *CA
	// RootCAs verifies the hosts intercepted connections are
	// re-originated to: the host's trust store plus the operator's
	// --egress-ca-file (RootPool); nil is the host's alone.
	RootCAs *x509.CertPool
	// Secrets and Tokens resolve placeholders; nil leaves those of the
	// kind unresolvable (their requests get the 502).
	Secrets Secrets
	Tokens  Tokens
	// Recorder counts; nil counts nothing.
	Recorder Recorder
	// Log keeps the decisions; nil makes one of DefaultLogEntries per
	// sandbox.
	Log    *Log
	Logger *slog.Logger
	// OriginalDst is where a redirected connection was going; nil reads
	// SO_ORIGINAL_DST (conntrack's record of the redirect). Tests of the
	// proxy without a firewall pass their own.
	OriginalDst func(net.Conn) (netip.AddrPort, error)
	// NamedPorts are the ports whose connections are decided by name (the
	// SNI, the Host); nil is 80 and 443, as E2B's. Connections to other
	// ports (a tunnelled sandbox's) are decided by address.
	NamedPorts []uint16
	// PeekTimeout bounds the wait for a ClientHello or a request line on
	// ports 80 and 443 before the connection is decided by its address
	// alone; 0 is 10 s.
	PeekTimeout time.Duration
}

// DefaultLogEntries is how many entries each sandbox's log keeps.
const DefaultLogEntries = 1000

// Proxy is the egress proxy. It is safe for concurrent use.
type Proxy struct {
	cfg        Config
	log        *slog.Logger
	transports *transports

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

// New returns a proxy; Serve runs it.
func New(cfg Config) *Proxy {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Recorder == nil {
		cfg.Recorder = noRecorder{}
	}
	if cfg.Log == nil {
		cfg.Log = NewLog(0)
	}
	if cfg.PeekTimeout <= 0 {
		cfg.PeekTimeout = 10 * time.Second
	}
	if cfg.NamedPorts == nil {
		cfg.NamedPorts = []uint16{80, 443}
	}
	if cfg.OriginalDst == nil {
		cfg.OriginalDst = originalDst
	}
	if cfg.Forbidden == nil {
		cfg.Forbidden = func(netip.Addr) bool { return false }
	}
	p := &Proxy{cfg: cfg, log: cfg.Logger, conns: map[net.Conn]struct{}{}}
	p.transports = newTransports(p)
	return p
}

// Serve accepts redirected connections until Close; it returns nil then.
func (p *Proxy) Serve() error {
	for {
		c, err := p.cfg.Listener.Accept()
		if err != nil {
			p.mu.Lock()
			closed := p.closed
			p.mu.Unlock()
			if closed || errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		if !p.track(c) {
			c.Close()
			return nil
		}
		go func() {
			defer p.untrack(c)
			p.handle(c)
		}()
	}
}

// Close stops accepting and cuts every connection.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	conns := p.conns
	p.conns = map[net.Conn]struct{}{}
	p.mu.Unlock()
	err := p.cfg.Listener.Close()
	for c := range conns {
		c.Close()
	}
	p.transports.closeAll()
	return err
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	c.Close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// record adds e to sandbox id's log.
func (p *Proxy) record(id string, e Entry) { p.cfg.Log.add(id, e, p.cfg.Sources.Exists) }

type noRecorder struct{}

func (noRecorder) EgressConnection(string)   {}
func (noRecorder) EgressRequest(string)      {}
func (noRecorder) EgressBytes(string, int64) {}
