package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/lizard-build/lizard/internal/errdefs"
)

func TestParseHost(t *testing.T) {
	tests := []struct {
		host    string
		id      string
		port    int
		wantErr bool
	}{
		{"abc123-8000.sandbox.localhost", "abc123", 8000, false},
		{"abc123-8000.sandbox.localhost:8081", "abc123", 8000, false},
		{"ABC123-3000.Sandbox.Localhost.", "abc123", 3000, false},
		{"a-b-c-80.sandbox.localhost", "a-b-c", 80, false},
		{"abc123.sandbox.localhost", "", 0, true},
		{"abc123-0.sandbox.localhost", "", 0, true},
		{"abc123-70000.sandbox.localhost", "", 0, true},
		{"x.abc123-80.sandbox.localhost", "", 0, true},
		{"abc123-80.other.example", "", 0, true},
		{"-80.sandbox.localhost", "", 0, true},
	}
	for _, tt := range tests {
		id, port, err := ParseHost(tt.host, "sandbox.localhost")
		if tt.wantErr {
			if !errors.Is(err, errdefs.ErrNotFound) {
				t.Errorf("%q: err %v, want ErrNotFound", tt.host, err)
			}
			continue
		}
		if err != nil || id != tt.id || port != tt.port {
			t.Errorf("%q: %q %d %v, want %q %d", tt.host, id, port, err, tt.id, tt.port)
		}
	}
}

// fakePreviews serves sandbox "sb": port 80 by the sandbox's token, 6081
// by a token of its own, and "paused" whose resume fails with runsc's
// words. It counts the calls that would resume.
type fakePreviews struct {
	addr      string
	addrCalls int
}

var fakeTokens = map[string]map[int]string{
	"sb":     {80: "secret-token", 6081: "view-token"},
	"paused": {80: "paused-token"},
	"down":   {80: "down-token"},
}

func (f *fakePreviews) PreviewToken(id string, port int) (string, error) {
	tok, ok := fakeTokens[id][port]
	if !ok {
		return "", errdefs.ErrNotFound
	}
	return tok, nil
}

func (f *fakePreviews) PreviewAddr(_ context.Context, id string, port int) (string, error) {
	f.addrCalls++
	switch id {
	case "paused":
		return "", fmt.Errorf("runsc restore: exit status 128: loading checkpoint: /var/lib/lizard/sandboxes/paused: %w", errdefs.ErrUnavailable)
	case "down":
		return "127.0.0.1:1", nil // nothing listens on port 1
	}
	return f.addr, nil
}

// TestDecisions: every request that is not authenticated gets the same
// answer and resumes nothing; authenticated ones are served, or told of a
// failure without its cause.
func TestDecisions(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("app saw host " + r.Host + " cookie " + r.Header.Get("Cookie") + " token " + r.Header.Get(TokenHeader)))
	}))
	defer up.Close()
	f := &fakePreviews{addr: strings.TrimPrefix(up.URL, "http://")}
	h := Handler(Config{Domain: "d.test", Previews: f})
	do := func(host, path string, hdr map[string]string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("GET", "http://"+host+path, nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	tok := func(v string) map[string]string { return map[string]string{TokenHeader: v} }

	ref := do("nosuch-80.d.test", "/", nil)
	if ref.Code != http.StatusUnauthorized {
		t.Fatalf("unknown sandbox: %d", ref.Code)
	}
	refused := []struct {
		name, host, path string
		hdr              map[string]string
	}{
		{"no token", "sb-80.d.test", "/", nil},
		{"wrong header", "sb-80.d.test", "/", tok("wrong")},
		{"wrong cookie", "sb-80.d.test", "/", map[string]string{"Cookie": "lizard_token=wrong"}},
		{"wrong query", "sb-80.d.test", "/?lizard_token=wrong", nil},
		{"empty header", "sb-80.d.test", "/", tok("")},
		{"right cookie, wrong header", "sb-80.d.test", "/", map[string]string{TokenHeader: "wrong", "Cookie": "lizard_token=secret-token"}},
		{"unknown sandbox with a real token", "nosuch-80.d.test", "/", tok("secret-token")},
		{"unexposed port with the sandbox's token", "sb-81.d.test", "/", tok("secret-token")},
		{"a port with its own token, sandbox token", "sb-6081.d.test", "/", tok("secret-token")},
		{"a port's own token on another port", "sb-80.d.test", "/", tok("view-token")},
		{"paused, no token", "paused-80.d.test", "/", nil},
		{"paused, wrong token", "paused-80.d.test", "/", tok("secret-token")},
		{"paused, unknown port", "paused-81.d.test", "/", tok("paused-token")},
		{"foreign host", "example.com", "/", tok("secret-token")},
		{"no port", "sb.d.test", "/", tok("secret-token")},
		{"bad port", "sb-99999.d.test", "/", tok("secret-token")},
		{"empty host", "", "/", nil},
	}
	for _, c := range refused {
		r := do(c.host, c.path, c.hdr)
		if r.Code != ref.Code || r.Body.String() != ref.Body.String() || !reflect.DeepEqual(r.Header(), ref.Header()) {
			t.Errorf("%s: %d %v %q, want the same as an unknown sandbox: %d %v %q", c.name, r.Code, r.Header(), r.Body, ref.Code, ref.Header(), ref.Body)
		}
	}
	if f.addrCalls != 0 {
		t.Fatalf("refused requests asked for an address (resumed) %d times", f.addrCalls)
	}

	r := do("sb-80.d.test", "/x", map[string]string{TokenHeader: "secret-token", "Cookie": "lizard_token=secret-token; keep=1"})
	if r.Code != 200 || r.Body.String() != "app saw host sb-80.d.test cookie keep=1 token " {
		t.Errorf("with token: %d %q", r.Code, r.Body.String())
	}
	if r := do("sb-6081.d.test", "/", map[string]string{"Cookie": "other=1; lizard_token=view-token"}); r.Code != 200 {
		t.Errorf("port token by cookie: %d", r.Code)
	}
	calls := f.addrCalls
	r = do("sb-80.d.test", "/x?a=1&lizard_token=secret-token", nil)
	if r.Code != 302 || r.Header().Get("Location") != "/x?a=1" || !strings.Contains(r.Header().Get("Set-Cookie"), "HttpOnly") {
		t.Errorf("query token: %d %v", r.Code, r.Header())
	}
	if f.addrCalls != calls {
		t.Error("the redirect that sets the cookie resumed the sandbox")
	}

	r = do("paused-80.d.test", "/", tok("paused-token"))
	if r.Code != http.StatusServiceUnavailable || strings.Contains(r.Body.String(), "runsc") || strings.Contains(r.Body.String(), "/var/lib") {
		t.Errorf("resume failed: %d %q", r.Code, r.Body)
	}
	r = do("down-80.d.test", "/", tok("down-token"))
	if r.Code != http.StatusBadGateway || strings.Contains(r.Body.String(), "127.0.0.1") || strings.Contains(r.Body.String(), "refused") {
		t.Errorf("app not listening: %d %q", r.Code, r.Body)
	}
}

type countRecorder struct {
	outcomes map[string]int
	in, out  int64
}

func (c *countRecorder) ProxyRequest(outcome string, in, out int64) {
	c.outcomes[outcome]++
	c.in += in
	c.out += out
}

// TestMetrics checks the outcome and the bytes of each kind of request.
func TestMetrics(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Write(append([]byte("got "), b...))
	}))
	defer up.Close()
	rec := &countRecorder{outcomes: map[string]int{}}
	h := Handler(Config{Domain: "d.test", Previews: &fakePreviews{addr: strings.TrimPrefix(up.URL, "http://")}, Metrics: rec})
	for _, tc := range []struct {
		host, path, token, body string
		outcome                 string
	}{
		{"sb-80.d.test", "/", "secret-token", "hello", "forwarded"},
		{"sb-80.d.test", "/", "", "", "unauthorized"},
		{"sb-80.d.test", "/", "wrong", "", "unauthorized"},
		{"sb-81.d.test", "/", "secret-token", "", "unauthorized"},
		{"elsewhere", "/", "secret-token", "", "unauthorized"},
		{"sb-80.d.test", "/?lizard_token=secret-token", "", "", "redirected"},
		{"paused-80.d.test", "/", "paused-token", "", "unavailable"},
		{"down-80.d.test", "/", "down-token", "", "upstream_error"},
	} {
		req := httptest.NewRequest("POST", "http://"+tc.host+tc.path, strings.NewReader(tc.body))
		if tc.token != "" {
			req.Header.Set(TokenHeader, tc.token)
		}
		before := rec.outcomes[tc.outcome]
		h.ServeHTTP(httptest.NewRecorder(), req)
		if rec.outcomes[tc.outcome] != before+1 {
			t.Errorf("%s %s: outcomes %v, want one more %s", tc.host, tc.path, rec.outcomes, tc.outcome)
		}
	}
	// Only the forwarded request's body was read; its answer was "got hello".
	if rec.in != int64(len("hello")) {
		t.Errorf("bytes in %d, want %d", rec.in, len("hello"))
	}
	if rec.out < int64(len("got hello")) {
		t.Errorf("bytes out %d, want at least %d", rec.out, len("got hello"))
	}
}

// loopbackTo is a LoopbackDialer that reaches one address for sandbox
// "down" and records what it was asked.
type loopbackTo struct {
	addr  string
	asked []string
}

func (l *loopbackTo) DialLoopback(ctx context.Context, id string, port int) (net.Conn, error) {
	l.asked = append(l.asked, fmt.Sprintf("%s:%d", id, port))
	if id != "down" {
		return nil, errdefs.ErrNotFound
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", l.addr)
}

// TestLoopbackFallback: a port nothing listens on at the sandbox's
// address is tried on its loopback address; if nothing answers there
// either, the answer is the usual 502.
func TestLoopbackFallback(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("loopback server"))
	}))
	defer up.Close()
	lb := &loopbackTo{addr: strings.TrimPrefix(up.URL, "http://")}
	h := Handler(Config{Domain: "d.test", Previews: &fakePreviews{}, Loopback: lb})
	req := httptest.NewRequest("GET", "http://down-80.d.test/", nil)
	req.Header.Set(TokenHeader, "down-token")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK || rec.Body.String() != "loopback server" {
		t.Fatalf("through the loopback: %d %q", rec.Code, rec.Body)
	}
	if len(lb.asked) != 1 || lb.asked[0] != "down:1" {
		t.Fatalf("loopback asked for %v, want [down:1] (the port of the refused address)", lb.asked)
	}

	lb.addr = "127.0.0.1:1"
	h = Handler(Config{Domain: "d.test", Previews: &fakePreviews{}, Loopback: lb})
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusBadGateway {
		t.Fatalf("nothing on the loopback either: %d %q", rec.Code, rec.Body)
	}
}

// runPreviews is fakePreviews whose sandbox tells its run (proxy.Runs).
type runPreviews struct {
	fakePreviews
	run string
}

func (f *runPreviews) SandboxRun(string) string { return f.run }

// TestPoolPerRun: requests to a sandbox reuse a pooled connection within
// one run, and never one pooled before its run changed (a resume: the
// restored sandbox resets those).
func TestPoolPerRun(t *testing.T) {
	var conns atomic.Int32
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) }))
	up.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	up.Start()
	defer up.Close()
	f := &runPreviews{fakePreviews: fakePreviews{addr: strings.TrimPrefix(up.URL, "http://")}, run: "1"}
	h := Handler(Config{Domain: "d.test", Previews: f, Runs: f})
	get := func() {
		t.Helper()
		req := httptest.NewRequest("GET", "http://sb-80.d.test/", nil)
		req.Header.Set(TokenHeader, "secret-token")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			t.Fatalf("GET: %d %s", rec.Code, rec.Body)
		}
	}
	get()
	get()
	if n := conns.Load(); n != 1 {
		t.Fatalf("%d upstream connections for two requests of one run, want 1 (pooled)", n)
	}
	f.run = "2"
	get()
	if n := conns.Load(); n != 2 {
		t.Fatalf("%d upstream connections after the run changed, want 2 (a fresh one)", n)
	}
}

// fakePublic makes port 8080 of "sb" public, and of "paused" too, which
// is not running.
type fakePublic struct{ addr string }

func (f fakePublic) PublicAddr(id string, port int) (string, error) {
	switch {
	case port != 8080:
		return "", errdefs.ErrNotFound
	case id == "sb":
		return f.addr, nil
	case id == "paused":
		return "", fmt.Errorf("sandbox %q is paused: %w", id, errdefs.ErrUnavailable)
	}
	return "", errdefs.ErrNotFound
}

// TestPublicPortsAndAPIHost: a public port is served without a token (and
// a paused sandbox is not resumed for it), other ports still need theirs;
// the API host goes to the API handler, with its path and host.
func TestPublicPortsAndAPIHost(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("app " + r.URL.Path))
	}))
	defer up.Close()
	f := &fakePreviews{addr: strings.TrimPrefix(up.URL, "http://")}
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("api " + r.Host + r.URL.Path)) })
	h := Handler(Config{Domain: "sandbox.d.test", Previews: f, Public: fakePublic{addr: f.addr}, APIHost: "api.d.test", API: api})
	do := func(host string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "http://"+host+"/p", nil))
		return rec
	}
	for _, c := range []struct {
		host string
		code int
		body string
	}{
		{"sb-8080.sandbox.d.test", 200, "app /p"},
		{"sb-8080.sandbox.d.test:8443", 200, "app /p"},
		{"sb-80.sandbox.d.test", 401, ""},
		{"other-8080.sandbox.d.test", 401, ""},
		{"paused-8080.sandbox.d.test", 503, ""},
		{"API.d.test:8443", 200, "api API.d.test:8443/p"},
		{"api.sandbox.d.test", 401, ""},
	} {
		r := do(c.host)
		if r.Code != c.code || (c.body != "" && r.Body.String() != c.body) {
			t.Errorf("%s: %d %q, want %d %q", c.host, r.Code, r.Body, c.code, c.body)
		}
	}
	if f.addrCalls != 0 {
		t.Errorf("a public port asked the previews for an address (would resume) %d times", f.addrCalls)
	}
}
