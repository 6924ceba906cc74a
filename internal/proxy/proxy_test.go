package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
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

type fakePreviews struct{ t Target }

func (f fakePreviews) Preview(_ context.Context, id string, port int) (Target, error) {
	if id != "sb" || port != 80 {
		return Target{}, errdefs.ErrNotFound
	}
	return f.t, nil
}

// TestAdmission checks who gets through, against a real upstream.
func TestAdmission(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("app saw host " + r.Host + " cookie " + r.Header.Get("Cookie") + " token " + r.Header.Get(TokenHeader)))
	}))
	defer up.Close()
	h := Handler(Config{Domain: "d.test", Previews: fakePreviews{Target{Addr: strings.TrimPrefix(up.URL, "http://"), Token: "secret-token"}}})
	do := func(host, path string, hdr map[string]string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("GET", "http://"+host+path, nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	if r := do("sb-80.d.test", "/", nil); r.Code != 401 {
		t.Errorf("no token: %d", r.Code)
	}
	if r := do("sb-81.d.test", "/", map[string]string{TokenHeader: "secret-token"}); r.Code != 404 {
		t.Errorf("unexposed port: %d", r.Code)
	}
	if r := do("nope", "/", nil); r.Code != 404 {
		t.Errorf("foreign host: %d", r.Code)
	}
	r := do("sb-80.d.test", "/x", map[string]string{TokenHeader: "secret-token", "Cookie": "lizard_token=secret-token; keep=1"})
	if r.Code != 200 || r.Body.String() != "app saw host sb-80.d.test cookie keep=1 token " {
		t.Errorf("with token: %d %q", r.Code, r.Body.String())
	}
	r = do("sb-80.d.test", "/x?a=1&lizard_token=secret-token", nil)
	if r.Code != 302 || r.Header().Get("Location") != "/x?a=1" || !strings.Contains(r.Header().Get("Set-Cookie"), "HttpOnly") {
		t.Errorf("query token: %d %v", r.Code, r.Header())
	}
	if r := do("sb-80.d.test", "/", map[string]string{"Cookie": "lizard_token=wrong"}); r.Code != 401 {
		t.Errorf("wrong cookie: %d", r.Code)
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
	addr := strings.TrimPrefix(up.URL, "http://")
	dead := httptest.NewServer(http.NotFoundHandler())
	deadAddr := strings.TrimPrefix(dead.URL, "http://")
	dead.Close()
	rec := &countRecorder{outcomes: map[string]int{}}
	for _, tc := range []struct {
		previews Previews
		host     string
		path     string
		token    string
		body     string
		outcome  string
	}{
		{fakePreviews{Target{Addr: addr, Token: "tok"}}, "sb-80.d.test", "/", "tok", "hello", "forwarded"},
		{fakePreviews{Target{Addr: addr, Token: "tok"}}, "sb-80.d.test", "/", "", "", "unauthorized"},
		{fakePreviews{Target{Addr: addr, Token: "tok"}}, "sb-80.d.test", "/?lizard_token=tok", "", "", "redirected"},
		{fakePreviews{Target{Addr: addr, Token: "tok"}}, "sb-81.d.test", "/", "tok", "", "not_found"},
		{fakePreviews{Target{Addr: addr, Token: "tok"}}, "elsewhere", "/", "tok", "", "bad_host"},
		{fakePreviews{Target{Addr: deadAddr, Token: "tok"}}, "sb-80.d.test", "/", "tok", "", "upstream_error"},
	} {
		h := Handler(Config{Domain: "d.test", Previews: tc.previews, Metrics: rec})
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
