// Package proxy is the preview proxy: it serves https?://<sandbox>-<port>.<domain>
// by forwarding to that port of the sandbox, for requests that carry the
// port's access token (header, one-time query parameter that becomes a
// host-only cookie). It authenticates first: the token is checked before
// anything is resumed, and every refusal looks the same. WebSocket
// upgrades, Server-Sent Events and large bodies stream through. Only
// cmd/lizard wires it; it asks the sandbox service, by a narrow interface,
// for a preview's token and then its address.
package proxy

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// Header, query parameter and cookie that carry the access token.
const (
	TokenHeader = "X-Lizard-Access-Token"
	TokenQuery  = "lizard_token"
	TokenCookie = "lizard_token"
)

// Previews is what the proxy asks the sandbox service, in two steps so
// that nothing happens for a request before it is authenticated.
type Previews interface {
	// PreviewToken returns the access token that admits requests to port
	// of a sandbox. It has no side effects: it never resumes, starts or
	// touches the runtime. An unknown sandbox or a port that is not exposed
	// is errdefs.ErrNotFound.
	PreviewToken(sandboxID string, port int) (string, error)
	// PreviewAddr returns the host:port that serves port of the sandbox,
	// resuming a paused sandbox first. It is called only for authenticated
	// requests; its errors may carry runtime detail, which the proxy logs
	// and never shows.
	PreviewAddr(ctx context.Context, sandboxID string, port int) (string, error)
}

// HTTPSPorts is implemented by Previews that know which sandbox ports serve
// HTTPS themselves (E2B's network.httpsPorts): the proxy reaches those
// over TLS, without verifying the certificate (a sandbox's is its own,
// self-signed as often as not); the client's side is the proxy's either
// way.
type HTTPSPorts interface {
	// PortTLS says whether port of the sandbox serves HTTPS.
	PortTLS(sandboxID string, port int) bool
}

// Runs names the runs of sandboxes that pause and resume in place (see
// Config.Runs): a run names one life of a sandbox's network stack.
// A sandbox restored from a checkpoint answers the connections of its
// earlier life with a reset, so the proxy pools connections per run and
// never sends a request on one pooled before a pause.
type Runs interface {
	// SandboxRun names the sandbox's current run ("" when unknown).
	SandboxRun(sandboxID string) string
}

// SandboxDialer connects to an address of a running sandbox with a
// connection that ends with the sandbox (see Config.Dialer).
type SandboxDialer interface {
	DialSandbox(ctx context.Context, sandboxID, addr string) (net.Conn, error)
}

// LoopbackDialer reaches servers that listen on a sandbox's loopback
// address only (127.0.0.1), which its own address does not serve.
type LoopbackDialer interface {
	// DialLoopback connects to port on the loopback address inside a
	// running sandbox (through its agent).
	DialLoopback(ctx context.Context, sandboxID string, port int) (net.Conn, error)
}

// Config wires the proxy.
type Config struct {
	Domain   string // e.g. "sandbox.localhost"
	TLS      bool   // the proxy is served over TLS: cookies get Secure
	Previews Previews
	// E2B routes E2B-addressed requests (e2b.go); nil serves only
	// lizard-addressed ones.
	E2B E2BTargets
	// Loopback, when not nil, is asked for a connection when nothing
	// listens on the port at the sandbox's address: a server bound to
	// 127.0.0.1 in the sandbox is reachable as if bound to every address.
	Loopback LoopbackDialer
	// Dialer, when not nil, makes the connections to sandboxes, so that
	// the sandbox service closes them when the sandbox is killed or
	// paused: a dead sandbox resets nothing, and a request in flight would
	// otherwise hang; cut, it ends and the client sees the sandbox gone.
	Dialer SandboxDialer
	// Runs, when not nil, tells each sandbox's current run, which names
	// the pool of connections to it; nil: one pool per sandbox.
	Runs   Runs
	Logger *slog.Logger
	// Metrics counts requests and bytes; nil counts nothing.
	Metrics Recorder
	// Cluster sends the previews of sandboxes on other nodes to their
	// node in cluster mode; nil: every sandbox is this server's.
	Cluster Forwarder
	// Public admits requests to the ports it names without a token; nil:
	// every port needs its token.
	Public PublicPorts
	// APIHost, when not "", is a host name (without port) whose requests
	// API answers: the API and the previews on one listener, as a client
	// that derives preview hosts from the API's (api.D, then
	// <sandbox>-<port>.sandbox.D) reaches them.
	APIHost string
	API     http.Handler
}

// PublicPorts names the ports of sandboxes that are served to anyone,
// without a token (a server setting decides which, if any).
type PublicPorts interface {
	// PublicAddr returns the host:port that serves port of a running
	// sandbox when that port is public. It has no side effects: a paused
	// sandbox is errdefs.ErrUnavailable and stays paused; a port that is
	// not public, or an unknown sandbox, is errdefs.ErrNotFound.
	PublicAddr(sandboxID string, port int) (string, error)
}

// Forwarder answers previews of sandboxes that live on another node.
type Forwarder interface {
	// ForwardPreview answers r on the node of sandbox id when that is
	// another node, which then checks the token, and reports whether it
	// did and with which outcome (as Recorder names them). It answers
	// nothing for a sandbox of this node, an unknown or lost one, or a
	// request a peer forwarded.
	ForwardPreview(w http.ResponseWriter, r *http.Request, id string) (outcome string, handled bool)
}

// Recorder is told of each request: its outcome (forwarded, redirected,
// unauthorized, unavailable, upstream_error) and the
// bytes of its body and of its answer. Bytes of an upgraded connection
// (WebSocket) after the upgrade are not counted.
type Recorder interface {
	ProxyRequest(outcome string, in, out int64)
}

type proxy struct {
	cfg Config
	rp  *httputil.ReverseProxy
	// decoy is compared against when there is no real token (unknown
	// sandbox or port, bad host), so that the refusal costs the same.
	decoy string
}

// addrKey holds the target of a request the proxy forwards.
type addrKey struct{}

// target is where a request goes: the sandbox, the address serving the
// port and the sandbox's run (see Runs), which names the connection pool,
// and whether the port speaks TLS (HTTPSPorts, E2BTarget.TLS).
type target struct {
	sandbox, addr, run string
	tls                bool
}

// targetOf is the target of a request to port of sandbox id at addr.
func (p *proxy) targetOf(id string, port int, addr string) target {
	t := target{sandbox: id, addr: addr, run: p.runOf(id)}
	if hp, ok := p.cfg.Previews.(HTTPSPorts); ok {
		t.tls = hp.PortTLS(id, port)
	}
	return t
}

// runOf is the current run of sandbox id, when the service tells.
func (p *proxy) runOf(id string) string {
	if p.cfg.Runs == nil {
		return ""
	}
	return p.cfg.Runs.SandboxRun(id)
}

// dial connects to the address of the request's target; the address in
// the URL only names the pool. A port that nothing listens on at that
// address is tried on the sandbox's loopback address, where servers bound
// to 127.0.0.1 listen (a user starting one expects its preview to work).
func (p *proxy) dial(ctx context.Context, network, _ string) (net.Conn, error) {
	t, ok := ctx.Value(addrKey{}).(target)
	if !ok {
		return nil, errors.New("proxy: dial without a target")
	}
	var c net.Conn
	var err error
	if p.cfg.Dialer != nil {
		c, err = p.cfg.Dialer.DialSandbox(ctx, t.sandbox, t.addr)
	} else {
		c, err = (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext(ctx, network, t.addr)
	}
	if err == nil || p.cfg.Loopback == nil || !errors.Is(err, syscall.ECONNREFUSED) {
		return c, err
	}
	_, ps, _ := net.SplitHostPort(t.addr)
	port, _ := strconv.Atoi(ps)
	lc, lerr := p.cfg.Loopback.DialLoopback(ctx, t.sandbox, port)
	if lerr != nil {
		return nil, fmt.Errorf("%w (loopback: %w)", err, lerr)
	}
	return lc, nil
}

// dialTLS connects as dial does, then speaks TLS to a port that serves
// HTTPS (HTTPSPorts), not verifying the sandbox's certificate. HTTP/1.1
// only, so that upgrades (WebSocket) pass as on plain ports.
func (p *proxy) dialTLS(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := p.dial(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}}) //nolint:gosec // E2B's httpsPorts: not verified, by design
	if err := tc.HandshakeContext(ctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("TLS to the sandbox's port: %w", err)
	}
	return tc, nil
}

// bufferPool lends the reverse proxy 64 KiB copy buffers.
type bufferPool struct{}

var copyBuffers = sync.Pool{New: func() any { return make([]byte, 64<<10) }}

func (bufferPool) Get() []byte  { return copyBuffers.Get().([]byte) }
func (bufferPool) Put(b []byte) { copyBuffers.Put(b) } //nolint:staticcheck // a slice header per Put is fine here

// The answers the proxy gives of its own. Every refusal before
// authentication is the same 401, whatever the reason (no token, a wrong
// one, an unknown sandbox or port, a host that is not a preview's), so it
// tells nothing about which sandboxes and ports exist. Errors after it
// name no cause; the log has it.
const (
	msgUnauthorized = "This preview is private: send its access token in the " + TokenHeader + " header, or open the preview URL with ?" + TokenQuery + "=."
	msgUnavailable  = "The sandbox of this preview could not be started."
	msgBadGateway   = "The sandbox's service did not answer on this port."
)

// Handler returns the preview proxy's handler.
func Handler(cfg Config) http.Handler {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	p := &proxy{cfg: cfg, decoy: rand.Text()}
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			t := pr.In.Context().Value(addrKey{}).(target)
			// Connections are pooled per sandbox and run, not per address:
			// a new sandbox may get the address of one just killed, and a
			// resumed one resets the connections of its life before the
			// pause; neither's pooled connections may carry its requests.
			// dial connects to the address.
			_, port, _ := net.SplitHostPort(t.addr)
			pool := t.sandbox
			if t.run != "" {
				pool += "-" + t.run
			}
			scheme := "http"
			if t.tls {
				scheme = "https"
			}
			pr.SetURL(&url.URL{Scheme: scheme, Host: net.JoinHostPort(pool+".sandbox.invalid", port)})
			pr.SetXForwarded()
			// The app sees the host it was asked for, and no lizard token.
			pr.Out.Host = pr.In.Host
			pr.Out.Header.Del(TokenHeader)
			stripTokenCookie(pr.Out)
			// Nothing from outside speaks to the agent as the server does,
			// nor claims to be envd traffic: only e2b.go sets that header.
			pr.Out.Header.Del(AgentTokenHeader)
			pr.Out.Header.Del(EnvdHeader)
			pr.Out.Header.Del(TrafficTokenHeader)
			if envd, _ := pr.In.Context().Value(envdKey{}).(bool); envd {
				pr.Out.Header.Set(EnvdHeader, "1")
			}
		},
		Transport: &http.Transport{
			DialContext:         p.dial,
			DialTLSContext:      p.dialTLS,
			MaxIdleConnsPerHost: 32,
			IdleConnTimeout:     90 * time.Second,
		},
		// Responses of a known length are copied in large writes; the
		// proxy flushes at once anything of unknown length (streamed or
		// chunked bodies) and Server-Sent Events, which must not wait in a
		// buffer.
		FlushInterval: 0,
		BufferPool:    bufferPool{},
		// Its own complaints (a body cut short) go to the log with the
		// rest, timed to the millisecond.
		ErrorLog: slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if o, ok := r.Context().Value(outcomeKey{}).(*string); ok {
				*o = "upstream_error"
			}
			cfg.Logger.Info("preview upstream failed", "host", r.Host, "err", err)
			if id, ok := r.Context().Value(e2bKey{}).(string); ok {
				e2bBadGateway(w, id, "The sandbox is running but nothing answers on this port.")
				return
			}
			http.Error(w, msgBadGateway, http.StatusBadGateway)
		},
	}
	return p
}

func (p *proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// The API's own requests are the API's (which counts them), not
	// previews.
	if p.cfg.APIHost != "" && p.cfg.API != nil && hostName(r.Host) == strings.ToLower(p.cfg.APIHost) {
		p.cfg.API.ServeHTTP(w, r)
		return
	}
	if p.cfg.Metrics == nil {
		p.serve(w, r)
		return
	}
	cw := &countingWriter{ResponseWriter: w}
	body := &countingBody{ReadCloser: r.Body}
	r.Body = body
	outcome := p.serve(cw, r)
	p.cfg.Metrics.ProxyRequest(outcome, body.n.Load(), cw.n)
}

// serve answers one request and says how it ended.
func (p *proxy) serve(w http.ResponseWriter, r *http.Request) string {
	id, port, hostErr := ParseHost(r.Host, p.cfg.Domain)
	if hostErr != nil && p.cfg.E2B != nil {
		if id, port, ok := e2bAddress(r, p.cfg.Domain); ok {
			if outcome, ok := p.forward(w, r, id); ok {
				return outcome
			}
			return p.serveE2B(w, r, id, port)
		}
		if id, port, ok := signedFile(r, p.cfg.E2B); ok {
			return p.serveE2B(w, r, id, port)
		}
	}
	if hostErr == nil {
		if outcome, ok := p.forward(w, r, id); ok {
			return outcome
		}
	}
	want := p.decoy
	known := false
	if hostErr == nil {
		if tok, err := p.cfg.Previews.PreviewToken(id, port); err == nil && tok != "" {
			want, known = tok, true
		}
	}
	fromQuery := r.URL.Query().Get(TokenQuery)
	if (!admitted(r, fromQuery, want) || !known) && hostErr == nil && p.cfg.Public != nil {
		if outcome, ok := p.servePublic(w, r, id, port); ok {
			return outcome
		}
	}
	if !admitted(r, fromQuery, want) || !known {
		p.cfg.Logger.Debug("preview refused", "host", r.Host, "known", known)
		unauthorized(w)
		return "unauthorized"
	}
	if fromQuery != "" {
		// Once: the token becomes a cookie for this host only, and the
		// browser goes on to the same URL without it. Nothing is resumed
		// for the redirect; the next request does that.
		http.SetCookie(w, &http.Cookie{
			Name: TokenCookie, Value: fromQuery, Path: "/", HttpOnly: true,
			SameSite: http.SameSiteLaxMode, Secure: p.cfg.TLS,
		})
		q := r.URL.Query()
		q.Del(TokenQuery)
		u := *r.URL
		u.RawQuery = q.Encode()
		http.Redirect(w, r, u.RequestURI(), http.StatusFound)
		return "redirected"
	}
	addr, err := p.cfg.Previews.PreviewAddr(r.Context(), id, port)
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			// Killed or unexposed since the token was checked: as if it
			// never existed.
			unauthorized(w)
			return "unauthorized"
		}
		p.cfg.Logger.Warn("preview target unavailable", "sandbox", id, "port", port, "err", err)
		http.Error(w, msgUnavailable, http.StatusServiceUnavailable)
		return "unavailable"
	}
	outcome := "forwarded"
	ctx := context.WithValue(context.WithValue(r.Context(), addrKey{}, p.targetOf(id, port, addr)), outcomeKey{}, &outcome)
	p.rp.ServeHTTP(w, r.WithContext(ctx))
	return outcome
}

// servePublic forwards a request to a public port (Config.Public), which
// needs no token; nothing is resumed for it. It answers nothing, and
// reports false, for a port that is not public.
func (p *proxy) servePublic(w http.ResponseWriter, r *http.Request, id string, port int) (string, bool) {
	addr, err := p.cfg.Public.PublicAddr(id, port)
	if errors.Is(err, errdefs.ErrNotFound) {
		return "", false
	}
	if err != nil {
		p.cfg.Logger.Debug("public port unavailable", "sandbox", id, "port", port, "err", err)
		http.Error(w, msgUnavailable, http.StatusServiceUnavailable)
		return "unavailable", true
	}
	outcome := "forwarded"
	ctx := context.WithValue(context.WithValue(r.Context(), addrKey{}, p.targetOf(id, port, addr)), outcomeKey{}, &outcome)
	p.rp.ServeHTTP(w, r.WithContext(ctx))
	return outcome, true
}

// hostName is a Host header's name, lowercase, without port or final dot.
func hostName(host string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	return strings.ToLower(strings.TrimSuffix(host, "."))
}

// forward sends the request to the sandbox's node when that is another
// one (cluster mode).
func (p *proxy) forward(w http.ResponseWriter, r *http.Request, id string) (string, bool) {
	if p.cfg.Cluster == nil {
		return "", false
	}
	return p.cfg.Cluster.ForwardPreview(w, r, id)
}

// outcomeKey holds the outcome the error handler changes.
type outcomeKey struct{}

// countingWriter counts the bytes of an answer; Unwrap lets the reverse
// proxy's http.ResponseController flush and hijack through it.
type countingWriter struct {
	http.ResponseWriter
	n int64
}

func (w *countingWriter) Write(b []byte) (int, error) {
	n, err := w.ResponseWriter.Write(b)
	w.n += int64(n)
	return n, err
}

func (w *countingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// countingBody counts the bytes read of a request body. The transport
// reads it from a goroutine of its own, which may outlast the answer.
type countingBody struct {
	io.ReadCloser
	n atomic.Int64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	return n, err
}

func unauthorized(w http.ResponseWriter) {
	w.Header().Set("Cache-Control", "no-store")
	http.Error(w, msgUnauthorized, http.StatusUnauthorized)
}

// admitted reports whether the request carries the token want: in the
// query (which wins, and is then turned into a cookie), the header, or a
// cookie. Every comparison is constant-time.
func admitted(r *http.Request, fromQuery, want string) bool {
	if fromQuery != "" {
		return equal(fromQuery, want)
	}
	if h := r.Header.Get(TokenHeader); h != "" {
		return equal(h, want)
	}
	ok := false
	for _, c := range r.Cookies() {
		if c.Name == TokenCookie && equal(c.Value, want) {
			ok = true
		}
	}
	return ok
}

// equal compares in constant time, also in the lengths: both sides are
// hashed first.
func equal(got, want string) bool {
	a, b := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(want))
	return want != "" && subtle.ConstantTimeCompare(a[:], b[:]) == 1
}

// stripTokenCookie removes lizard's cookie from what the app receives.
func stripTokenCookie(r *http.Request) {
	cs := r.Cookies()
	r.Header.Del("Cookie")
	for _, c := range cs {
		if c.Name != TokenCookie {
			r.AddCookie(c)
		}
	}
}

// ParseHost splits "<sandbox>-<port>.<domain>[:listen port]" into the
// sandbox id and port.
func ParseHost(host, domain string) (id string, port int, err error) {
	label, err := previewLabel(host, domain)
	if err != nil {
		return "", 0, err
	}
	i := strings.LastIndexByte(label, '-')
	if i <= 0 {
		return "", 0, hostError(host, "want <sandbox>-<port>."+domain)
	}
	port, err = strconv.Atoi(label[i+1:])
	if err != nil || port < 1 || port > 65535 {
		return "", 0, hostError(host, "bad port")
	}
	return label[:i], port, nil
}

// previewLabel is the one label a preview host has before the domain.
func previewLabel(host, domain string) (string, error) {
	host = hostName(host)
	label, ok := strings.CutSuffix(host, "."+strings.ToLower(domain))
	if !ok || strings.Contains(label, ".") {
		return "", fmt.Errorf("%q is not a preview host of %s: %w", host, domain, errdefs.ErrNotFound)
	}
	return label, nil
}

func hostError(host, why string) error {
	return fmt.Errorf("%q: %s: %w", host, why, errdefs.ErrNotFound)
}
