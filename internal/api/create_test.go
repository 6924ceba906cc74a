package api

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lizard-build/lizard/internal/apikey"
	"github.com/lizard-build/lizard/internal/metrics"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/sandbox/desktop"
	"github.com/lizard-build/lizard/internal/sandbox/preview"
	"github.com/lizard-build/lizard/internal/sandbox/snapshot"
	"github.com/lizard-build/lizard/internal/sandbox/usage"
	"github.com/lizard-build/lizard/internal/store/sqlite"
	"github.com/lizard-build/lizard/internal/template"
)

// post sends body to path with the fuzz handler's key.
func post(t *testing.T, h http.Handler, path, body string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest("POST", path, strings.NewReader(body))
	req.Header.Set("X-API-Key", fuzzKey)
	req.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w
}

func manyKeys(n int) string {
	m := map[string]string{}
	for i := range n {
		m[fmt.Sprintf("k%d", i)] = "v"
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// TestCreateValidation: a create's fields are checked before anything is
// looked up, each refusal a 400 naming the field.
func TestCreateValidation(t *testing.T) {
	h := newFuzzHandler(t)
	tests := []struct {
		body    string
		status  int
		mention string
	}{
		{`{"template":"base","metadata":` + manyKeys(10000) + `}`, 400, "metadata: 10000 keys, at most 64"},
		{`{"template":"base","metadata":{"` + strings.Repeat("k", 300) + `":"v"}}`, 400, "300 bytes, at most 256"},
		{`{"template":"base","metadata":{"k":"` + strings.Repeat("v", 3000) + `"}}`, 400, `metadata[\"k\"]: the value is 3000 bytes, at most 2048`},
		{`{"snapshotId":"snap_x","metadata":` + manyKeys(65) + `}`, 400, "metadata: 65 keys"},
		{`{"template":"base","envs":{"A=B":"x"}}`, 400, "envs"},
		{`{"template":"base","envs":{"A":"` + strings.Repeat("v", 70000) + `"}}`, 400, "at most 65536"},
		{`{"template":"base","metadata":` + manyKeys(64) + `}`, 404, "base"},
		{`{"template":"base","region":"us-east-1"}`, 404, "base"},
		{`{"template":"base","environment":"staging"}`, 400, `environment \"staging\": unknown`},
		{`{"template":"base","environment":"staging"}`, 400, `"code":"unknown_environment"`},
		{`{"snapshotId":"snap_x","environment":"prod"}`, 400, "environment"},
		{`{"template":"base","environment":7}`, 400, "environment"},
		{`{"template":"base","environment":"default"}`, 404, "base"},
		{`{"template":"base","environment":""}`, 404, "base"},
	}
	for _, tt := range tests {
		w := post(t, h, "/api/sandboxes", tt.body)
		if w.Code != tt.status || !strings.Contains(w.Body.String(), tt.mention) {
			t.Errorf("POST /api/sandboxes %.80s: %d %.300s, want %d mentioning %q", tt.body, w.Code, w.Body, tt.status, tt.mention)
		}
	}
}

const otherKey = "lz_other_project_key_0123456789"

// newTokenHandler is the API over an empty registry with two projects
// (fuzzKey's, default, and otherKey's, other), its sandboxes reaching it at
// sandboxURL.
func newTokenHandler(t *testing.T, sandboxURL string) http.Handler {
	dir := t.TempDir()
	st, err := sqlite.Open(filepath.Join(dir, "lizard.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	for _, pk := range []struct{ slug, key string }{{"default", fuzzKey}, {"other", otherKey}} {
		p, err := st.CreateProject(ctx, pk.slug, pk.slug)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.CreateKey(ctx, p.ID, pk.key); err != nil {
			t.Fatal(err)
		}
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	keys, err := apikey.Open(ctx, apikey.Config{Store: st, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { keys.Close() })
	reg := template.NewRegistry(filepath.Join(dir, "templates"))
	svc := sandbox.New(sandbox.Config{Store: st, Templates: reg, Logger: log, SnapshotDir: filepath.Join(dir, "snapshots")})
	ports := preview.New(svc)
	snaps := snapshot.New(snapshot.Config{Core: svc, Store: st, Dir: filepath.Join(dir, "snapshots"), Logger: log})
	return Handler(Config{Keys: keys, Sandboxes: svc, Snapshots: snaps, Copies: snaps, Usage: usage.New(svc, nil, log), Ports: ports, Desktops: desktop.New(svc, ports), Templates: reg, Logger: log, KeyStore: st, SandboxURL: sandboxURL,
		ServeMetrics: true, Metrics: metrics.New()})
}

// TestLizardToken: a create may give its sandbox a key of its own project
// only; every refusal names the field and never shows the key.
func TestLizardToken(t *testing.T) {
	h := newTokenHandler(t, "http://10.250.0.1:8080")
	tests := []struct {
		body    string
		status  int
		mention string
	}{
		{`{"template":"base","lizardToken":"lz_no_such_key_at_all"}`, 400, `"code":"invalid_lizard_token"`},
		{`{"template":"base","lizardToken":"` + otherKey + `"}`, 403, `"code":"lizard_token_project"`},
		{`{"template":"base","lizardToken":"` + otherKey + `"}`, 403, "lizardToken: the key is another project's"},
		{`{"snapshotId":"snap_x","lizardToken":"` + fuzzKey + `"}`, 400, "lizardToken: not taken with snapshotId"},
		{`{"template":"base","lizardToken":7}`, 400, "lizardToken"},
		// Accepted: the create goes on to the template, which this
		// registry lacks.
		{`{"template":"base","lizardToken":"` + fuzzKey + `"}`, 404, "base"},
	}
	for _, tt := range tests {
		w := post(t, h, "/api/sandboxes", tt.body)
		if w.Code != tt.status || !strings.Contains(w.Body.String(), tt.mention) {
			t.Errorf("POST /api/sandboxes %s: %d %s, want %d mentioning %q", tt.body, w.Code, w.Body, tt.status, tt.mention)
		}
		if strings.Contains(w.Body.String(), otherKey) || strings.Contains(w.Body.String(), "lz_no_such_key_at_all") {
			t.Errorf("POST /api/sandboxes %s: the answer shows the key: %s", tt.body, w.Body)
		}
	}
	// A server whose sandboxes cannot reach it refuses the field.
	w := post(t, newTokenHandler(t, ""), "/api/sandboxes", `{"template":"base","lizardToken":"`+fuzzKey+`"}`)
	if w.Code != 400 || !strings.Contains(w.Body.String(), "lizardToken: this server's sandboxes cannot reach its API") {
		t.Errorf("without a sandbox URL: %d %s", w.Code, w.Body)
	}
}

// TestSandboxSide: requests that arrive at the sandboxes' address of the
// API reach the /api/ routes only; elsewhere every route is there.
func TestSandboxSide(t *testing.T) {
	var h http.Handler
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h.ServeHTTP(w, r) }))
	defer srv.Close()
	h = newTokenHandler(t, srv.URL)
	other := httptest.NewServer(newTokenHandler(t, srv.URL))
	defer other.Close()
	get := func(base, path string) int {
		req, _ := http.NewRequest("GET", base+path, nil)
		req.Header.Set("X-API-Key", fuzzKey)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	for _, tt := range []struct {
		base, path string
		status     int
	}{
		{srv.URL, "/api/sandboxes", 200},
		{srv.URL, "/api/keys", 200},
		{srv.URL, "/metrics", 404},
		{srv.URL, "/healthz", 404},
		{srv.URL, "/v2/sandboxes", 404},
		{other.URL, "/metrics", 200},
		{other.URL, "/healthz", 200},
	} {
		if got := get(tt.base, tt.path); got != tt.status {
			t.Errorf("GET %s (sandbox side: %v): %d, want %d", tt.path, tt.base == srv.URL, got, tt.status)
		}
	}
}
