package egress

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/textproto"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http2"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/network"
)

// intercept terminates a TLS connection whose host has transform rules with
// a certificate of the CA for its SNI, then serves its requests (HTTP/2
// when the client offered it, else HTTP/1.1).
func (p *Proxy) intercept(c net.Conn, src Source, dst netip.AddrPort, hello clientHello) {
	tc := tls.Server(c, &tls.Config{
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return p.cfg.CA.Leaf(hello.name) },
		NextProtos:     []string{"h2", "http/1.1"},
		MinVersion:     tls.VersionTLS12,
	})
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.PeekTimeout)
	err := tc.HandshakeContext(ctx)
	cancel()
	if err != nil {
		p.log.Debug("egress: TLS with the sandbox failed", "sandbox", src.SandboxID, "host", hello.name, "err", err)
		p.record(src.SandboxID, Entry{Time: time.Now().UTC(), Host: hello.name, Addr: dst.Addr().String(), Port: int(dst.Port()),
			Decision: Allowed, Via: "intercepted", Proxied: src.Egress.Proxy != nil, Reason: "TLS with the sandbox failed (does it trust the node's egress CA?)"})
		return
	}
	h := &requestHandler{p: p, srcAddr: netip.Addr{}, dst: dst, tls: true, sni: hello.name, proxied: src.Egress.Proxy != nil}
	h.srcAddr, _ = addrOf(c.RemoteAddr())
	h.serve(tc)
}

func addrOf(a net.Addr) (netip.Addr, error) {
	ap, err := netip.ParseAddrPort(a.String())
	return ap.Addr().Unmap(), err
}

// requestHandler serves the requests of one parsed connection (plain HTTP,
// or TLS the proxy terminated): each is decided by its Host against the
// sandbox's configuration at that moment, gets its host's transform, and
// goes to the address the sandbox connected to.
type requestHandler struct {
	p       *Proxy
	srcAddr netip.Addr
	dst     netip.AddrPort
	tls     bool
	sni     string // the connection's name when tls
	proxied bool
	// active are the handlers still running: an upgraded connection's
	// copy outlives the server's loop.
	active sync.WaitGroup
}

// serve runs the connection's requests to its end.
func (h *requestHandler) serve(c net.Conn) {
	defer h.active.Wait()
	if tc, ok := c.(*tls.Conn); ok && tc.ConnectionState().NegotiatedProtocol == "h2" {
		srv := &http2.Server{IdleTimeout: 2 * time.Minute}
		srv.ServeConn(c, &http2.ServeConnOpts{Handler: h, BaseConfig: &http.Server{ErrorLog: quiet}})
		return
	}
	l := &oneConn{c: c, done: make(chan struct{})}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute, ErrorLog: quiet,
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateClosed || s == http.StateHijacked {
				l.close()
			}
		}}
	srv.Serve(l)
}

// quiet drops net/http's own log lines (a client that goes away).
var quiet = log.New(io.Discard, "", 0)

func (h *requestHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.active.Add(1)
	defer h.active.Done()
	p := h.p
	host := hostOnly(r.Host)
	entry := Entry{Time: time.Now().UTC(), Host: host, Addr: h.dst.Addr().String(), Port: int(h.dst.Port()), Via: "http", Proxied: h.proxied}
	if h.tls {
		entry.Via = "intercepted"
	}
	src, ok := p.cfg.Sources.Source(h.srcAddr)
	if !ok {
		h.refuse(w, Source{}, entry, "misdirected", http.StatusForbidden, "this sandbox is not known to the node")
		return
	}
	if h.tls && host != h.sni {
		h.refuse(w, src, entry, "misdirected", http.StatusMisdirectedRequest,
			fmt.Sprintf("the request is for %q on a connection to %q", host, h.sni))
		return
	}
	if !src.Egress.Allows(h.dst.Addr(), host) {
		why := fmt.Sprintf("host %q is not allowed", host)
		if host == "" {
			why = "no Host, and the address is not allowed"
		}
		h.refuse(w, src, entry, Denied, http.StatusForbidden, why)
		return
	}
	key, rules, _ := src.Egress.RulesFor(host)
	headers, err := p.transform(r.Context(), src, rules)
	if err != nil {
		entry.Rule = key
		h.refuse(w, src, entry, "unresolved", http.StatusBadGateway, err.Error()+"; the request was not sent")
		return
	}
	if len(rules) > 0 {
		entry.Rule = key
	}
	entry.Decision = Allowed
	body := &countingReader{r: r.Body}
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = body
	}
	cw := &countingWriter{ResponseWriter: w}
	failed := ""
	rp := &httputil.ReverseProxy{
		Director: func(out *http.Request) {
			out.URL.Scheme = "http"
			if h.tls {
				out.URL.Scheme = "https"
			}
			out.URL.Host = r.Host
			if out.URL.Host == "" {
				out.URL.Host = h.dst.String()
			}
			for name, v := range headers {
				out.Header[name] = []string{v}
			}
		},
		Transport:  p.transports.get(src, h.dst, host, h.tls, isUpgrade(r)),
		BufferPool: bufferPool{},
		ErrorLog:   quiet,
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			failed = upstreamError(err)
			writeRefusal(w, http.StatusBadGateway, "the upstream failed: "+failed)
		},
	}
	// No X-Forwarded-For: the proxy is transparent.
	r.RemoteAddr = ""
	rp.ServeHTTP(cw, r)
	entry.BytesOut, entry.BytesIn = body.n, cw.n
	p.cfg.Recorder.EgressBytes("out", body.n)
	p.cfg.Recorder.EgressBytes("in", cw.n)
	if failed != "" {
		entry.Reason = "upstream: " + failed
		p.cfg.Recorder.EgressRequest("upstream_error")
	} else {
		p.cfg.Recorder.EgressRequest("forwarded")
	}
	p.record(src.SandboxID, entry)
}

// refuse answers a request the proxy does not send on, and records it.
func (h *requestHandler) refuse(w http.ResponseWriter, src Source, entry Entry, outcome string, status int, why string) {
	entry.Decision, entry.Reason = Denied, why
	if outcome == "unresolved" {
		entry.Decision = Allowed
	}
	if src.SandboxID != "" {
		h.p.record(src.SandboxID, entry)
	}
	h.p.cfg.Recorder.EgressRequest(outcome)
	writeRefusal(w, status, why)
}

// writeRefusal is the proxy's own answer to the sandbox, marked as such.
func writeRefusal(w http.ResponseWriter, status int, why string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Lizard-Egress", "refused")
	w.Header().Set("Connection", "close")
	w.WriteHeader(status)
	io.WriteString(w, "lizard egress: "+why+"\n")
}

// transform is the headers a request gets from its host's rules, in order
// (a later rule's header replaces an earlier one's), placeholders
// resolved now. An unresolvable placeholder fails the whole request.
func (p *Proxy) transform(ctx context.Context, src Source, rules []network.Rule) (map[string]string, error) {
	if len(rules) == 0 {
		return nil, nil
	}
	out := map[string]string{}
	resolve := func(ph network.Placeholder) (string, error) {
		switch ph.Kind {
		case network.SecretPlaceholder:
			if p.cfg.Secrets == nil {
				return "", fmt.Errorf("this server keeps no secrets: %w", errdefs.ErrUnavailable)
			}
			return p.cfg.Secrets.SecretValue(ctx, src.ProjectID, ph.Name)
		case network.TokenPlaceholder:
			if p.cfg.Tokens == nil {
				return "", fmt.Errorf("this server mints no workload tokens: %w", errdefs.ErrUnavailable)
			}
			return p.cfg.Tokens.MintToken(ctx, src.ProjectID, src.SandboxID, ph.Name)
		}
		return "", errdefs.ErrInvalid
	}
	for _, r := range rules {
		if r.Transform == nil {
			continue
		}
		for name, v := range r.Transform.Headers {
			value, err := network.Expand(v, resolve)
			if err != nil {
				return nil, unresolved(err)
			}
			out[textproto.CanonicalMIMEHeaderKey(name)] = value
		}
	}
	return out, nil
}

// unresolved is what the sandbox is told of a placeholder that could not
// be resolved: which one and the class of the failure, never a cause that
// could say more.
func unresolved(err error) error {
	var ue *network.UnresolvedError
	if !errors.As(err, &ue) {
		return errors.New("a header value could not be made")
	}
	kind := "secret"
	if ue.Kind == network.TokenPlaceholder {
		kind = "workload token"
	}
	why := "could not be resolved"
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		why = "does not exist"
	case errors.Is(err, errdefs.ErrUnavailable):
		why = "is not available on this server"
	case errors.Is(err, errdefs.ErrInvalid):
		why = "cannot go in a header"
	}
	return fmt.Errorf("%s %q (%s) %s", kind, ue.Name, ue.Placeholder, why)
}

// upstreamError is an upstream failure as the sandbox and the log see it.
func upstreamError(err error) string {
	var ce *tls.CertificateVerificationError
	var fe *forbiddenError
	switch {
	case errors.As(err, &fe):
		return fe.Error()
	case errors.As(err, &ce):
		return "its certificate is not trusted (the host's trust store and --egress-ca-file): " + ce.Err.Error()
	case errors.Is(err, context.Canceled):
		return "the sandbox went away"
	}
	return err.Error()
}

func isUpgrade(r *http.Request) bool {
	return r.Header.Get("Upgrade") != "" && httpHeaderHas(r.Header, "Connection", "upgrade")
}

func httpHeaderHas(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// hostOnly is a Host header's name, canonical, without its port.
func hostOnly(host string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	return strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
}

// transports keeps an http.Transport per sandbox, upstream address, name,
// scheme, protocol and SOCKS5 proxy, so that a sandbox's requests reuse
// their upstream connections (never another sandbox's).
type transports struct {
	p  *Proxy
	mu sync.Mutex
	m  map[transportKey]*http.Transport
}

type transportKey struct {
	sandbox string
	dst     netip.AddrPort
	name    string
	tls     bool
	h1      bool
	proxy   [sha256.Size]byte
}

// maxTransports bounds the transports kept; over it they all go (their
// idle connections closed) and are made again as requests need them.
const maxTransports = 1024

func newTransports(p *Proxy) *transports {
	return &transports{p: p, m: map[transportKey]*http.Transport{}}
}

func (t *transports) get(src Source, dst netip.AddrPort, name string, useTLS, h1 bool) *http.Transport {
	k := transportKey{sandbox: src.SandboxID, dst: dst, name: name, tls: useTLS, h1: h1}
	if sp := src.Egress.Proxy; sp != nil {
		k.proxy = sha256.Sum256([]byte(sp.Address + "\x00" + sp.Username + "\x00" + sp.Password))
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if tr, ok := t.m[k]; ok {
		return tr
	}
	if len(t.m) >= maxTransports {
		for _, tr := range t.m {
			tr.CloseIdleConnections()
		}
		t.m = map[transportKey]*http.Transport{}
	}
	p := t.p
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return p.dial(ctx, src, dst, name)
		},
		MaxIdleConnsPerHost:   16,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
		// Transparent: no Accept-Encoding of the proxy's, no decoding.
		DisableCompression: true,
		ForceAttemptHTTP2:  useTLS && !h1,
	}
	if useTLS {
		protos := []string{"h2", "http/1.1"}
		if h1 {
			protos = []string{"http/1.1"}
		}
		tr.DialTLSContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			c, err := p.dial(ctx, src, dst, name)
			if err != nil {
				return nil, err
			}
			tc := tls.Client(c, &tls.Config{ServerName: name, RootCAs: p.cfg.RootCAs, NextProtos: protos, MinVersion: tls.VersionTLS12})
			if err := tc.HandshakeContext(ctx); err != nil {
				c.Close()
				return nil, err
			}
			return tc, nil
		}
	}
	t.m[k] = tr
	return tr
}

func (t *transports) closeAll() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, tr := range t.m {
		tr.CloseIdleConnections()
	}
	t.m = map[transportKey]*http.Transport{}
}

// oneConn is a listener of one connection, for an http.Server to serve
// it: Accept gives it once, then waits until it is closed or hijacked.
type oneConn struct {
	c    net.Conn
	once sync.Once
	done chan struct{}
	used bool
	mu   sync.Mutex
}

func (l *oneConn) Accept() (net.Conn, error) {
	l.mu.Lock()
	if !l.used {
		l.used = true
		l.mu.Unlock()
		return l.c, nil
	}
	l.mu.Unlock()
	<-l.done
	return nil, net.ErrClosed
}

func (l *oneConn) close()         { l.once.Do(func() { close(l.done) }) }
func (l *oneConn) Close() error   { l.close(); return nil }
func (l *oneConn) Addr() net.Addr { return l.c.LocalAddr() }

type countingReader struct {
	r io.ReadCloser
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func (c *countingReader) Close() error { return c.r.Close() }

type countingWriter struct {
	http.ResponseWriter
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.ResponseWriter.Write(p)
	c.n += int64(n)
	return n, err
}

// Unwrap lets http.ResponseController flush and hijack through it.
func (c *countingWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// bufferPool lends ReverseProxy 64 KiB copy buffers.
type bufferPool struct{}

var buffers = sync.Pool{New: func() any { b := make([]byte, 64<<10); return &b }}

func (bufferPool) Get() []byte  { return *(buffers.Get().(*[]byte)) }
func (bufferPool) Put(b []byte) { buffers.Put(&b) }

var _ http.Handler = (*requestHandler)(nil)
