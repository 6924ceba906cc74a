package api

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/lizard-build/lizard/internal/apikey"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/metrics"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/store/sqlite"
)

const testKey = "lz_secret_key_never_logged"

type fakeKeys struct{}

func (fakeKeys) Lookup(secret string) (apikey.Key, error) {
	if secret != testKey {
		return apikey.Key{}, fmt.Errorf("key: %w", errdefs.ErrUnauthenticated)
	}
	return apikey.Key{ID: "key_test", Project: store.Project{ID: "prj_test", Slug: "default", Name: "default"}}, nil
}

// syncBuffer is a log sink the handler writes from its goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// requestLines returns the JSON request log lines.
func requestLines(t *testing.T, logs string) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(logs))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("log line %q: %v", sc.Text(), err)
		}
		if m["msg"] == "request" {
			out = append(out, m)
		}
	}
	return out
}

func newTestServer(t *testing.T, cfg Config) (*httptest.Server, *syncBuffer) {
	t.Helper()
	logs := &syncBuffer{}
	cfg.Keys = fakeKeys{}
	cfg.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv := httptest.NewServer(Handler(cfg))
	t.Cleanup(srv.Close)
	return srv, logs
}

func get(t *testing.T, url string, header map[string]string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func TestRequestLog(t *testing.T) {
	m := metrics.New()
	srv, logs := newTestServer(t, Config{Metrics: m, ServeMetrics: true})

	resp, body := get(t, srv.URL+"/api/projects?lizard_token=querysecret", map[string]string{"X-API-Key": testKey, "X-Request-Id": "req-1.a:b_c"})
	if resp.StatusCode != 200 || resp.Header.Get("X-Request-Id") != "req-1.a:b_c" {
		t.Fatalf("GET /api/projects: %d, X-Request-Id %q", resp.StatusCode, resp.Header.Get("X-Request-Id"))
	}
	resp, _ = get(t, srv.URL+"/api/projects/nope", map[string]string{"Authorization": "Bearer " + testKey, "X-Request-Id": strings.Repeat("x", 129)})
	generated := resp.Header.Get("X-Request-Id")
	if resp.StatusCode != 404 || len(generated) != 32 {
		t.Fatalf("GET /api/projects/nope: %d, X-Request-Id %q, want 404 and a fresh id", resp.StatusCode, generated)
	}
	resp, _ = get(t, srv.URL+"/api/projects", map[string]string{"X-API-Key": "wrong-" + testKey, "X-Request-Id": "a b"})
	if resp.StatusCode != 401 || resp.Header.Get("X-Request-Id") == "a b" {
		t.Fatalf("wrong key: %d, X-Request-Id %q", resp.StatusCode, resp.Header.Get("X-Request-Id"))
	}
	get(t, srv.URL+"/no/such/route", nil)

	all := logs.String()
	for _, secret := range []string{testKey, "querysecret"} {
		if strings.Contains(all, secret) {
			t.Errorf("the log holds %q:\n%s", secret, all)
		}
	}
	lines := requestLines(t, all)
	if len(lines) != 4 {
		t.Fatalf("%d request lines, want 4:\n%s", len(lines), all)
	}
	want := []map[string]any{
		{"method": "GET", "route": "GET /api/projects", "status": 200.0, "project": "prj_test", "request_id": "req-1.a:b_c"},
		{"method": "GET", "route": "GET /api/projects/{pid}", "status": 404.0, "project": "prj_test", "request_id": generated},
		{"method": "GET", "route": "GET /api/projects", "status": 401.0, "project": ""},
		{"method": "GET", "route": "/", "status": 404.0, "project": ""},
	}
	for i, w := range want {
		for k, v := range w {
			if lines[i][k] != v {
				t.Errorf("line %d: %s = %v, want %v (%v)", i, k, lines[i][k], v, lines[i])
			}
		}
		if b, _ := lines[i]["bytes"].(float64); b <= 0 {
			t.Errorf("line %d: bytes %v", i, lines[i]["bytes"])
		}
		if _, ok := lines[i]["duration_ms"].(float64); !ok {
			t.Errorf("line %d: no duration_ms", i)
		}
	}
	if n, _ := lines[0]["bytes"].(float64); int(n) != len(body) {
		t.Errorf("bytes %v, the body had %d", n, len(body))
	}

	// /metrics on this listener, counted by route pattern.
	resp, text := get(t, srv.URL+"/metrics", nil)
	if resp.StatusCode != 200 {
		t.Fatalf("/metrics: %d", resp.StatusCode)
	}
	for _, line := range []string{
		`lizard_api_requests_total{route="GET /api/projects",status="200"} 1`,
		`lizard_api_requests_total{route="GET /api/projects",status="401"} 1`,
		`lizard_api_requests_total{route="GET /api/projects/{pid}",status="404"} 1`,
		`lizard_api_requests_total{route="/",status="404"} 1`,
	} {
		if !strings.Contains(text, line+"\n") {
			t.Errorf("/metrics lacks %s", line)
		}
	}
}

func TestMetricsOffTheAPIListener(t *testing.T) {
	srv, _ := newTestServer(t, Config{Metrics: metrics.New(), ServeMetrics: false})
	if resp, _ := get(t, srv.URL+"/metrics", nil); resp.StatusCode != 404 {
		t.Fatalf("/metrics without ServeMetrics: %d, want 404", resp.StatusCode)
	}
}

func TestPanicIsLoggedAnd500(t *testing.T) {
	logs := &syncBuffer{}
	s := &server{log: slog.New(slog.NewJSONHandler(logs, nil))}
	h := s.logged(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { panic("boom") }))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/x", nil))
	if rec.Code != 500 || rec.Header().Get("X-Request-Id") == "" {
		t.Fatalf("panic: %d, X-Request-Id %q", rec.Code, rec.Header().Get("X-Request-Id"))
	}
	lines := requestLines(t, logs.String())
	if len(lines) != 1 || lines[0]["status"] != 500.0 {
		t.Fatalf("request lines after a panic: %v", lines)
	}
}

// TestReadyz runs the store check on a real database: ready while it
// answers, not ready when its file is moved away (and ready again when it
// is back) or when it is closed; /healthz stays 200 throughout.
func TestReadyz(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lizard.db")
	st, err := sqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	srv, logs := newTestServer(t, Config{Ready: []ReadyCheck{{Name: "store", Check: st.Ping}}})
	check := func(what string, wantReady bool) {
		t.Helper()
		resp, body := get(t, srv.URL+"/healthz", nil)
		if resp.StatusCode != 200 || body != "ok\n" {
			t.Fatalf("%s: /healthz %d %q", what, resp.StatusCode, body)
		}
		resp, body = get(t, srv.URL+"/readyz", nil)
		if wantReady && (resp.StatusCode != 200 || body != "ok\n") {
			t.Fatalf("%s: /readyz %d %q, want 200 ok", what, resp.StatusCode, body)
		}
		if !wantReady && (resp.StatusCode != 503 || body != "not ready\n") {
			t.Fatalf("%s: /readyz %d %q, want 503 not ready", what, resp.StatusCode, body)
		}
	}
	check("open store", true)
	if err := os.Rename(path, path+".away"); err != nil {
		t.Fatal(err)
	}
	check("database moved away", false)
	if !strings.Contains(logs.String(), "store: ") {
		t.Errorf("the log does not name the failed check:\n%s", logs)
	}
	if err := os.Rename(path+".away", path); err != nil {
		t.Fatal(err)
	}
	check("database back", true)
	st.Close()
	check("closed store", false)
}
