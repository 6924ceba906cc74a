package egress

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/egress/egresstest"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/network"
)

// The proxy's tests run it in process, on loopback, without a firewall:
// OriginalDst answers the upstream the test points it at, and the
// "sandbox" is the test's own client at 127.0.0.1. The upstreams are TLS
// and plain HTTP servers of the test's own, with certificates of a test CA
// for several names on one address, echoing what they received.

// echo is what the upstreams answer: what they received.
type echo struct {
	Host    string            `json:"host"`
	Proto   string            `json:"proto"`
	Headers map[string]string `json:"headers"`
	Bytes   int64             `json:"bytes"`
	SHA256  string            `json:"sha256"`
}

// echoHandler echoes a request; /download?n= answers n bytes; /ws upgrades
// and echoes the stream.
func echoHandler(hits *atomic.Int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		switch r.URL.Path {
		case "/download":
			egresstest.WriteBytes(w, r)
			return
		case "/ws":
			if r.Header.Get("Upgrade") != "websocket" {
				http.Error(w, "not an upgrade", 400)
				return
			}
			c, rw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
			rw.Flush()
			io.Copy(c, rw)
			return
		}
		h := sha256.New()
		n, _ := io.Copy(h, r.Body)
		e := echo{Host: r.Host, Proto: r.Proto, Headers: map[string]string{}, Bytes: n, SHA256: hex.EncodeToString(h.Sum(nil))}
		for k := range r.Header {
			e.Headers[k] = r.Header.Get(k)
		}
		json.NewEncoder(w).Encode(e)
	})
}

type testSources struct {
	mu  sync.Mutex
	src Source
}

func (s *testSources) Source(a netip.Addr) (Source, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.src, a.IsLoopback()
}
func (s *testSources) Exists(string) bool { return true }
func (s *testSources) set(e network.Egress) {
	s.mu.Lock()
	s.src.Egress = e
	s.mu.Unlock()
}

// mapSecrets is Secrets over a map, for the proxy's tests (the server
// wires the secrets store).
type mapSecrets struct {
	mu sync.Mutex
	m  map[string]string // project/name → value
}

func (s *mapSecrets) SecretValue(ctx context.Context, projectID, name string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.m[projectID+"/"+name]
	if !ok {
		return "", fmt.Errorf("secret %q: %w", name, errdefs.ErrNotFound)
	}
	return v, nil
}

type env struct {
	t        *testing.T
	ca       *egresstest.CA
	sources  *testSources
	secrets  *mapSecrets
	proxy    *Proxy
	addr     string // the proxy's
	upTLS    *httptest.Server
	upHTTP   *httptest.Server
	hits     *atomic.Int64
	dst      atomic.Pointer[netip.AddrPort]
	lizardCA *x509.CertPool
}

func newEnv(t *testing.T) *env {
	testCA, err := egresstest.NewCA("egress test CA")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := testCA.ServerCert([]string{"allowed.test", "rules.test", "denied.test", "a.wild.test"})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, ca: testCA, sources: &testSources{src: Source{SandboxID: "sb1", ProjectID: "p1"}},
		secrets: &mapSecrets{m: map[string]string{"p1/tok": "s3cr3t-value"}}, hits: &atomic.Int64{}}
	e.upTLS = httptest.NewUnstartedServer(echoHandler(e.hits))
	e.upTLS.EnableHTTP2 = true
	e.upTLS.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	e.upTLS.StartTLS()
	t.Cleanup(e.upTLS.Close)
	e.upHTTP = httptest.NewServer(echoHandler(e.hits))
	t.Cleanup(e.upHTTP.Close)
	ca, err := OpenCA(t.TempDir(), "test")
	if err != nil {
		t.Fatal(err)
	}
	e.lizardCA = x509.NewCertPool()
	e.lizardCA.AddCert(ca.Certificate())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.addr = ln.Addr().String()
	port := func(s *httptest.Server) uint16 { return netip.MustParseAddrPort(s.Listener.Addr().String()).Port() }
	e.proxy = New(Config{Listener: ln, NamedPorts: []uint16{port(e.upTLS), port(e.upHTTP)}, Sources: e.sources, CA: ca, RootCAs: e.ca.Pool(), Secrets: e.secrets, PeekTimeout: 2 * time.Second,
		OriginalDst: func(net.Conn) (netip.AddrPort, error) { return *e.dst.Load(), nil }})
	go e.proxy.Serve()
	t.Cleanup(func() { e.proxy.Close() })
	return e
}

// to points redirected connections at the TLS upstream, or the plain one.
func (e *env) to(plain bool) {
	u := e.upTLS.Listener.Addr().String()
	if plain {
		u = e.upHTTP.Listener.Addr().String()
	}
	ap := netip.MustParseAddrPort(u)
	e.dst.Store(&ap)
}

// client is the sandbox's HTTPS client for name, trusting roots, through
// the proxy (as the firewall's redirect would take it there).
func (e *env) client(roots *x509.CertPool, h2 bool) *http.Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", e.addr)
		},
		TLSClientConfig:   &tls.Config{RootCAs: roots},
		ForceAttemptHTTP2: h2,
		DisableKeepAlives: false,
	}
	if !h2 {
		tr.TLSClientConfig.NextProtos = []string{"http/1.1"}
	}
	return &http.Client{Transport: tr, Timeout: 20 * time.Second}
}

func getEcho(t *testing.T, c *http.Client, url string, header http.Header) (echo, *http.Response) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	for k, v := range header {
		req.Header[k] = v
	}
	res, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	var out echo
	if res.StatusCode == 200 {
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatalf("GET %s: %v: %s", url, err, b)
		}
	} else {
		res.Body = io.NopCloser(bytes.NewReader(b))
	}
	return out, res
}

func lastEntry(t *testing.T, p *Proxy) Entry {
	t.Helper()
	// A spliced connection is logged when it ends: wait for it.
	deadline := time.Now().Add(5 * time.Second)
	for {
		l := p.cfg.Log.Entries("sb1")
		if len(l) > 0 {
			return l[len(l)-1]
		}
		if time.Now().After(deadline) {
			t.Fatal("no log entry")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSpliced: an allowed name without rules is spliced: the client
// verifies the upstream's own certificate (the test CA, not the node's),
// and the proxy never sees the request.
func TestSpliced(t *testing.T) {
	e := newEnv(t)
	e.to(false)
	e.sources.set(network.Egress{Restricted: true, Allowed: []string{"allowed.test"}})
	c := e.client(e.ca.Pool(), true)
	got, res := getEcho(t, c, "https://allowed.test/", http.Header{"X-Mine": {"1"}})
	if res.StatusCode != 200 || got.Host != "allowed.test" || got.Proto != "HTTP/2.0" || got.Headers["X-Mine"] != "1" {
		t.Fatalf("echo %+v (%d)", got, res.StatusCode)
	}
	if res.TLS.PeerCertificates[0].Issuer.CommonName != "egress test CA" {
		t.Fatalf("the sandbox saw a certificate of %q", res.TLS.PeerCertificates[0].Issuer.CommonName)
	}
	c.CloseIdleConnections()
	if l := lastEntry(t, e.proxy); l.Via != "spliced" || l.Decision != Allowed || l.Host != "allowed.test" || l.BytesIn == 0 || l.BytesOut == 0 {
		t.Fatalf("log %+v", l)
	}
}

// TestRefusedByName: a name that is not allowed is refused on the address
// of one that is, by SNI (a TLS alert) and by Host (a 403); a name that
// is allowed still goes.
func TestRefusedByName(t *testing.T) {
	e := newEnv(t)
	e.sources.set(network.Egress{Restricted: true, Allowed: []string{"allowed.test", "*.wild.test"}})
	e.to(false)
	_, err := e.client(e.ca.Pool(), false).Get("https://denied.test/")
	if err == nil || !strings.Contains(err.Error(), "access denied") {
		t.Fatalf("denied.test by SNI: %v", err)
	}
	if l := lastEntry(t, e.proxy); l.Decision != Denied || l.Host != "denied.test" {
		t.Fatalf("log %+v", l)
	}
	if got, res := getEcho(t, e.client(e.ca.Pool(), false), "https://a.wild.test/", nil); res.StatusCode != 200 || got.Host != "a.wild.test" {
		t.Fatalf("wildcard: %d %+v", res.StatusCode, got)
	}

	e.to(true)
	plain := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "tcp", e.addr)
	}}}
	// One connection, two Hosts: the second is refused on its own.
	if got, res := getEcho(t, plain, "http://allowed.test/", nil); res.StatusCode != 200 || got.Host != "allowed.test" {
		t.Fatalf("allowed.test by Host: %d %+v", res.StatusCode, got)
	}
	before := e.hits.Load()
	_, res := getEcho(t, plain, "http://denied.test/", nil)
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != 403 || res.Header.Get("X-Lizard-Egress") != "refused" || !strings.Contains(string(b), `"denied.test" is not allowed`) {
		t.Fatalf("denied.test by Host: %d %s", res.StatusCode, b)
	}
	if e.hits.Load() != before {
		t.Fatal("a refused request reached the upstream")
	}
}

// TestTransform: a host with rules is intercepted: the sandbox trusts the
// node's CA, the upstream gets the header with the secret's value (a new
// value at the next request), over HTTP/1.1 and HTTP/2; a secret that is
// gone is a 502 naming it, and nothing is sent.
func TestTransform(t *testing.T) {
	e := newEnv(t)
	e.to(false)
	e.sources.set(network.Egress{Restricted: true, Allowed: []string{"rules.test"}, Rules: map[string][]network.Rule{
		"rules.test": {{Transform: &network.Transform{Headers: map[string]string{"Authorization": "Bearer ${e2b.secrets.tok}", "X-Fixed": "a"}}},
			{Transform: &network.Transform{Headers: map[string]string{"x-fixed": "b"}}}},
	}})
	for _, h2 := range []bool{false, true} {
		c := e.client(e.lizardCA, h2)
		got, res := getEcho(t, c, "https://rules.test/", http.Header{"Authorization": {"Bearer from-the-sandbox"}})
		if res.StatusCode != 200 || got.Headers["Authorization"] != "Bearer s3cr3t-value" || got.Headers["X-Fixed"] != "b" {
			t.Fatalf("h2 %v: %d %+v", h2, res.StatusCode, got)
		}
		if wantProto := map[bool]string{false: "HTTP/1.1", true: "HTTP/2.0"}[h2]; res.Proto != wantProto {
			t.Fatalf("the sandbox spoke %s, want %s", res.Proto, wantProto)
		}
		if iss := res.TLS.PeerCertificates[0].Issuer.CommonName; iss != "lizard egress CA test" {
			t.Fatalf("intercepted with a certificate of %q", iss)
		}
	}
	if l := lastEntry(t, e.proxy); l.Via != "intercepted" || l.Rule != "rules.test" || l.Decision != Allowed {
		t.Fatalf("log %+v", l)
	}
	c := e.client(e.lizardCA, false)
	e.secrets.mu.Lock()
	e.secrets.m["p1/tok"] = "second-value"
	e.secrets.mu.Unlock()
	if got, _ := getEcho(t, c, "https://rules.test/", nil); got.Headers["Authorization"] != "Bearer second-value" {
		t.Fatalf("after an update: %+v", got)
	}
	e.secrets.mu.Lock()
	delete(e.secrets.m, "p1/tok")
	e.secrets.mu.Unlock()
	before := e.hits.Load()
	_, res := getEcho(t, c, "https://rules.test/", nil)
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != 502 || !strings.Contains(string(b), `secret "tok"`) || !strings.Contains(string(b), "does not exist") {
		t.Fatalf("a destroyed secret: %d %s", res.StatusCode, b)
	}
	if e.hits.Load() != before {
		t.Fatal("a request whose secret could not be resolved was sent")
	}
	if l := lastEntry(t, e.proxy); !strings.Contains(l.Reason, `secret "tok"`) || strings.Contains(l.Reason, "s3cr3t") {
		t.Fatalf("log %+v", l)
	}
}

// TestStreams: large bodies both ways and a WebSocket upgrade go through an
// intercepted connection.
func TestStreams(t *testing.T) {
	e := newEnv(t)
	e.to(false)
	e.sources.set(network.Egress{Rules: map[string][]network.Rule{"rules.test": {{Transform: &network.Transform{Headers: map[string]string{"X-T": "1"}}}}}})
	c := e.client(e.lizardCA, true)
	body := bytes.Repeat([]byte("0123456789abcdef"), 2<<20) // 32 MiB
	sum := sha256.Sum256(body)
	res, err := c.Post("https://rules.test/", "application/octet-stream", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var got echo
	json.NewDecoder(res.Body).Decode(&got)
	res.Body.Close()
	if got.Bytes != int64(len(body)) || got.SHA256 != hex.EncodeToString(sum[:]) || got.Headers["X-T"] != "1" {
		t.Fatalf("upload: %+v", got)
	}
	res, err = c.Get("https://rules.test/download?n=" + strconv.Itoa(48<<20))
	if err != nil {
		t.Fatal(err)
	}
	n, _ := io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if n != 48<<20 {
		t.Fatalf("download: %d bytes", n)
	}

	// A WebSocket upgrade over HTTP/1.1.
	conn, err := tls.Dial("tcp", e.addr, &tls.Config{ServerName: "rules.test", RootCAs: e.lizardCA, NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET /ws HTTP/1.1\r\nHost: rules.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: x\r\nSec-WebSocket-Version: 13\r\n\r\n")
	buf := make([]byte, 4096)
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	k, err := conn.Read(buf)
	if err != nil || !strings.HasPrefix(string(buf[:k]), "HTTP/1.1 101") {
		t.Fatalf("upgrade: %q %v", buf[:k], err)
	}
	for _, msg := range []string{"ping", "pong"} {
		conn.Write([]byte(msg))
		k, err = io.ReadAtLeast(conn, buf, len(msg))
		if err != nil || string(buf[:k]) != msg {
			t.Fatalf("echo %q: %q %v", msg, buf[:k], err)
		}
	}
}

// TestSOCKS: with an egress proxy the upstream connection goes through the
// SOCKS5 server, by name for an allowed domain and by address otherwise;
// an unreachable proxy fails the connection (never direct).
func TestSOCKS(t *testing.T) {
	e := newEnv(t)
	e.to(false)
	up := e.upTLS.Listener.Addr().String()
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	s := egresstest.ServeSOCKS5(ln, egresstest.WithAuth("u", "pw"), egresstest.WithDial(func(network, addr string) (net.Conn, error) {
		return net.Dial(network, up) // the test's names all live on the upstream
	}))
	defer s.Close()
	e.sources.set(network.Egress{Restricted: true, Allowed: []string{"allowed.test", "127.0.0.0/8"},
		Proxy: &network.SOCKSProxy{Address: s.Addr(), Username: "u", Password: "pw"}})
	if got, res := getEcho(t, e.client(e.ca.Pool(), false), "https://allowed.test/", nil); res.StatusCode != 200 || got.Host != "allowed.test" {
		t.Fatalf("through SOCKS: %d %+v", res.StatusCode, got)
	}
	reqs := s.Requests()
	if len(reqs) != 1 || !reqs[0].ByName || reqs[0].Target != net.JoinHostPort("allowed.test", strconv.Itoa(int(e.dst.Load().Port()))) {
		t.Fatalf("SOCKS requests %+v", reqs)
	}
	s.Close()
	_, err := e.client(e.ca.Pool(), false).Get("https://allowed.test/")
	if err == nil {
		t.Fatal("a connection went out with its SOCKS5 proxy down")
	}
}

// TestForbidden: an address Forbidden names is never dialled, whatever the
// configuration says.
func TestForbidden(t *testing.T) {
	e := newEnv(t)
	e.proxy.cfg.Forbidden = func(a netip.Addr) bool { return a.IsLoopback() }
	e.to(false)
	e.sources.set(network.Egress{Rules: map[string][]network.Rule{"rules.test": nil}})
	_, err := e.client(e.ca.Pool(), false).Get("https://allowed.test/")
	if err == nil {
		t.Fatal("reached a forbidden address")
	}
	if l := lastEntry(t, e.proxy); !strings.Contains(l.Reason, "never reachable") {
		t.Fatalf("log %+v", l)
	}
}
