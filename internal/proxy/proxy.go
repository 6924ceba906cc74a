// Package proxy is the preview proxy: it serves https?://<sandbox>-<port>.<domain>
// by forwarding to that port of the sandbox, for requests that carry the
// sandbox's access token (header, one-time query parameter that becomes a
// host-only cookie). WebSocket upgrades, Server-Sent Events and large bodies
// stream through. Only cmd/lizard wires it; it asks the sandbox service, by
// a narrow interface, where a preview goes.
package proxy

import (
	"context"
	"crypto/subtle"
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
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// Header, query parameter and cookie that carry the access token.
const (
	TokenHeader = "X-Lizard-Access-Token"
	TokenQuery  = "lizard_token"
	TokenCookie = "lizard_token"
)

// Target is where a preview goes.
type Target struct {
	Addr  string // host:port of the sandbox's service
	Token string // the sandbox's access token
}

// Previews resolves a preview host to its target. It resumes a paused
// sandbox. An unknown sandbox or a port that is not exposed is
// errdefs.ErrNotFound.
type Previews interface {
	Preview(ctx context.Context, sandboxID string, port int) (Target, error)
}

// Config wires the proxy.
type Config struct {
	Domain   string // e.g. "sandbox.localhost"
	TLS      bool   // the proxy is served over TLS: cookies get Secure
	Previews Previews
	Logger   *slog.Logger
	// Metrics counts requests and bytes; nil counts nothing.
	Metrics Recorder
}

// Recorder is told of each request: its outcome (forwarded, bad_host,
// not_found, unavailable, unauthorized, redirected, upstream_error) and the
// bytes of its body and of its answer. Bytes of an upgraded connection
// (WebSocket) after the upgrade are not counted.
type Recorder interface {
	ProxyRequest(outcome string, in, out int64)
}

type proxy struct {
	cfg Config
	rp  *httputil.ReverseProxy
}

type targetKey struct{}

// bufferPool lends the reverse proxy 64 KiB copy buffers.
type bufferPool struct{}

var copyBuffers = sync.Pool{New: func() any { return make([]byte, 64<<10) }}

func (bufferPool) Get() []byte  { return copyBuffers.Get().([]byte) }
func (bufferPool) Put(b []byte) { copyBuffers.Put(b) } //nolint:staticcheck // a slice header per Put is fine here

// Handler returns the preview proxy's handler.
func Handler(cfg Config) http.Handler {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	p := &proxy{cfg: cfg}
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			t := pr.In.Context().Value(targetKey{}).(Target)
			pr.SetURL(&url.URL{Scheme: "http", Host: t.Addr})
			pr.SetXForwarded()
			// The app sees the host it was asked for, and no lizard token.
			pr.Out.Host = pr.In.Host
			pr.Out.Header.Del(TokenHeader)
			stripTokenCookie(pr.Out)
		},
		Transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConnsPerHost: 32,
			IdleConnTimeout:     90 * time.Second,
		},
		// Responses of a known length are copied in large writes; the
		// proxy flushes at once anything of unknown length (streamed or
		// chunked bodies) and Server-Sent Events, which must not wait in a
		// buffer.
		FlushInterval: 0,
		BufferPool:    bufferPool{},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if o, ok := r.Context().Value(outcomeKey{}).(*string); ok {
				*o = "upstream_error"
			}
			cfg.Logger.Debug("preview upstream failed", "host", r.Host, "err", err)
			http.Error(w, "the sandbox's service did not answer: "+err.Error(), http.StatusBadGateway)
		},
	}
	return p
}

func (p *proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
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
	id, port, err := ParseHost(r.Host, p.cfg.Domain)
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return "bad_host"
	}
	t, err := p.cfg.Previews.Preview(r.Context(), id, port)
	if err != nil {
		status, outcome := http.StatusBadGateway, "unavailable"
		if errors.Is(err, errdefs.ErrNotFound) {
			status, outcome = http.StatusNotFound, "not_found"
		}
		http.Error(w, err.Error(), status)
		return outcome
	}
	q := r.URL.Query()
	if tok := q.Get(TokenQuery); tok != "" {
		if !equal(tok, t.Token) {
			http.Error(w, "wrong access token", http.StatusUnauthorized)
			return "unauthorized"
		}
		// Once: the token becomes a cookie for this host only, and the
		// browser goes on to the same URL without it.
		http.SetCookie(w, &http.Cookie{
			Name: TokenCookie, Value: tok, Path: "/", HttpOnly: true,
			SameSite: http.SameSiteLaxMode, Secure: p.cfg.TLS,
		})
		q.Del(TokenQuery)
		u := *r.URL
		u.RawQuery = q.Encode()
		http.Redirect(w, r, u.RequestURI(), http.StatusFound)
		return "redirected"
	}
	if !authorized(r, t.Token) {
		http.Error(w, "this preview is private: send "+TokenHeader+" or open the URL with ?"+TokenQuery+"=", http.StatusUnauthorized)
		return "unauthorized"
	}
	outcome := "forwarded"
	ctx := context.WithValue(context.WithValue(r.Context(), targetKey{}, t), outcomeKey{}, &outcome)
	p.rp.ServeHTTP(w, r.WithContext(ctx))
	return outcome
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

func authorized(r *http.Request, token string) bool {
	if h := r.Header.Get(TokenHeader); h != "" {
		return equal(h, token)
	}
	for _, c := range r.Cookies() {
		if c.Name == TokenCookie && equal(c.Value, token) {
			return true
		}
	}
	return false
}

func equal(a, b string) bool {
	return b != "" && subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
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
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	label, ok := strings.CutSuffix(host, "."+strings.ToLower(domain))
	if !ok || strings.Contains(label, ".") {
		return "", 0, fmt.Errorf("%q is not a preview host of %s: %w", host, domain, errdefs.ErrNotFound)
	}
	i := strings.LastIndexByte(label, '-')
	if i <= 0 {
		return "", 0, fmt.Errorf("%q: want <sandbox>-<port>.%s: %w", host, domain, errdefs.ErrNotFound)
	}
	port, err = strconv.Atoi(label[i+1:])
	if err != nil || port < 1 || port > 65535 {
		return "", 0, fmt.Errorf("%q: bad port: %w", host, errdefs.ErrNotFound)
	}
	return label[:i], port, nil
}
