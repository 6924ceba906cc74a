package proxy

import (
	"context"
	"errors"
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
