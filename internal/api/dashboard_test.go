package api

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/apikey"
	"github.com/lizard-build/lizard/internal/dashboard"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/store/sqlite"
)

// dashboardServer is the API with the dashboard on a real store and key
// set, and two projects with one key each.
type dashboardServer struct {
	h           http.Handler
	st          *sqlite.Store
	key, other  string
	project, op store.Project
}

func newDashboardServer(t *testing.T) *dashboardServer {
	t.Helper()
	ctx := context.Background()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "lizard.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	d := &dashboardServer{st: st}
	if d.project, err = st.CreateProject(ctx, "default", "default"); err != nil {
		t.Fatal(err)
	}
	if d.op, err = st.CreateProject(ctx, "other", "other"); err != nil {
		t.Fatal(err)
	}
	if d.key, err = st.CreateKey(ctx, d.project.ID, ""); err != nil {
		t.Fatal(err)
	}
	if d.other, err = st.CreateKey(ctx, d.op.ID, ""); err != nil {
		t.Fatal(err)
	}
	keys, err := apikey.Open(ctx, apikey.Config{Store: st, Poll: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { keys.Close() })
	assets, err := dashboard.NewAssets()
	if err != nil {
		t.Fatal(err)
	}
	d.h = Handler(Config{Keys: keys, Templates: fakeTemplates{}, KeyStore: st, Sessions: dashboard.NewSessions(time.Hour, time.Hour), Dashboard: assets})
	return d
}

// req sends a request; hdr are header pairs.
func (d *dashboardServer) req(method, path string, body any, hdr ...string) *httptest.ResponseRecorder {
	var b []byte
	if body != nil {
		b, _ = json.Marshal(body)
	}
	r := httptest.NewRequest(method, path, bytes.NewReader(b))
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Add(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	d.h.ServeHTTP(w, r)
	return w
}

func errCode(t *testing.T, w *httptest.ResponseRecorder) string {
	t.Helper()
	var e errorBody
	if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil {
		t.Fatalf("error answer is not JSON: %d %q", w.Code, w.Body)
	}
	return e.Code
}

// login signs in and returns the cookie header and the CSRF token.
func (d *dashboardServer) login(t *testing.T, key string) (cookie, csrf string) {
	t.Helper()
	w := d.req("POST", "/dashboard/login", map[string]string{"apiKey": key})
	if w.Code != 200 {
		t.Fatalf("login: %d %s", w.Code, w.Body)
	}
	var info sessionInfo
	json.Unmarshal(w.Body.Bytes(), &info)
	c := w.Result().Cookies()
	if len(c) != 1 || c[0].Name != SessionCookie || !c[0].HttpOnly || c[0].SameSite != http.SameSiteStrictMode || c[0].MaxAge != 3600 || c[0].Path != "/" {
		t.Fatalf("session cookie %+v", c)
	}
	if info.CSRFToken == "" || info.Project.ID != d.project.ID && info.Project.ID != d.op.ID {
		t.Fatalf("login answer %s", w.Body)
	}
	return SessionCookie + "=" + c[0].Value, info.CSRFToken
}

func TestDashboardAssets(t *testing.T) {
	d := newDashboardServer(t)
	w := d.req("GET", "/", nil)
	if w.Code != 200 || !strings.Contains(w.Body.String(), "/dashboard/static/app.js") ||
		!strings.Contains(w.Header().Get("Content-Security-Policy"), "default-src 'self'") {
		t.Fatalf("GET /: %d %v", w.Code, w.Header())
	}
	etag := w.Header().Get("ETag")
	if w := d.req("GET", "/", nil, "If-None-Match", etag); w.Code != http.StatusNotModified {
		t.Fatalf("revalidation: %d", w.Code)
	}
	w = d.req("GET", "/dashboard/static/vendor/xterm.js", nil, "Accept-Encoding", "gzip")
	if w.Code != 200 || w.Header().Get("Content-Encoding") != "gzip" || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/javascript") {
		t.Fatalf("xterm.js: %d %v", w.Code, w.Header())
	}
	if w := d.req("GET", "/dashboard/static/nope.js", nil); w.Code != 404 {
		t.Fatalf("missing asset: %d", w.Code)
	}
	if w := d.req("GET", "/nope", nil); w.Code != 404 || errCode(t, w) != "route_not_found" {
		t.Fatalf("other path: %d %s", w.Code, w.Body)
	}
}

func TestDashboardSession(t *testing.T) {
	d := newDashboardServer(t)
	if w := d.req("POST", "/dashboard/login", map[string]string{"apiKey": "lz_wrong_key_0123456789"}); w.Code != 401 || errCode(t, w) != "invalid_api_key" {
		t.Fatalf("wrong key: %d %s", w.Code, w.Body)
	}
	if w := d.req("POST", "/dashboard/login", map[string]string{}); w.Code != 400 || !strings.Contains(w.Body.String(), "apiKey") {
		t.Fatalf("no key: %d %s", w.Code, w.Body)
	}
	if w := d.req("POST", "/dashboard/login", map[string]string{"apiKey": d.key}, "Origin", "http://evil.example"); w.Code != 403 || errCode(t, w) != "origin_refused" {
		t.Fatalf("login from another origin: %d %s", w.Code, w.Body)
	}
	cookie, csrf := d.login(t, d.key)

	if w := d.req("GET", "/api/projects", nil, "Cookie", cookie); w.Code != 200 || !strings.Contains(w.Body.String(), d.project.ID) {
		t.Fatalf("GET with the cookie: %d %s", w.Code, w.Body)
	}
	if w := d.req("GET", "/dashboard/session", nil, "Cookie", cookie); w.Code != 200 || !strings.Contains(w.Body.String(), csrf) {
		t.Fatalf("session: %d %s", w.Code, w.Body)
	}
	if w := d.req("GET", "/dashboard/session", nil, "X-API-Key", d.key); w.Code != 401 {
		t.Fatalf("session without a cookie: %d %s", w.Code, w.Body)
	}
	// State changes need the CSRF token; a cross-origin request is refused
	// even with it.
	for _, c := range []struct {
		hdr  []string
		code string
	}{
		{[]string{"Cookie", cookie}, "csrf_token_invalid"},
		{[]string{"Cookie", cookie, CSRFHeader, csrf + "x"}, "csrf_token_invalid"},
		{[]string{"Cookie", cookie, CSRFHeader, csrf, "Origin", "http://evil.example"}, "origin_refused"},
	} {
		if w := d.req("POST", "/api/keys", nil, c.hdr...); w.Code != 403 || errCode(t, w) != c.code {
			t.Fatalf("POST %v: %d %s", c.hdr, w.Code, w.Body)
		}
	}
	// A WebSocket (a GET) from another page carries the cookie and its Origin.
	if w := d.req("GET", "/api/projects", nil, "Cookie", cookie, "Origin", "http://evil.example"); w.Code != 403 {
		t.Fatalf("GET from another origin: %d", w.Code)
	}
	if w := d.req("GET", "/api/projects", nil, "Cookie", cookie, "Origin", "http://example.com"); w.Code != 200 {
		t.Fatalf("GET from this origin (httptest's host): %d %s", w.Code, w.Body)
	}

	if w := d.req("POST", "/dashboard/logout", nil, "Cookie", cookie); w.Code != 204 || !strings.Contains(w.Header().Get("Set-Cookie"), "Max-Age=0") {
		t.Fatalf("logout: %d %v", w.Code, w.Header())
	}
	if w := d.req("GET", "/api/projects", nil, "Cookie", cookie); w.Code != 401 || errCode(t, w) != "session_expired" {
		t.Fatalf("after logout: %d %s", w.Code, w.Body)
	}
}

// TestKeysRoutes: a project's keys listed, created (secret once) and
// revoked through the API; another project's key is not found; revoking the
// key of a session ends the session at its next request.
func TestKeysRoutes(t *testing.T) {
	d := newDashboardServer(t)
	w := d.req("GET", "/api/keys", nil, "X-API-Key", d.key)
	var keys []keyInfo
	json.Unmarshal(w.Body.Bytes(), &keys)
	if w.Code != 200 || len(keys) != 1 || !keys[0].Current || keys[0].Key != "" || keys[0].Prefix != d.key[:10] || keys[0].RevokedAt != nil {
		t.Fatalf("list: %d %s", w.Code, w.Body)
	}
	self := keys[0].ID
	w = d.req("POST", "/api/keys", nil, "X-API-Key", d.key)
	var made keyInfo
	json.Unmarshal(w.Body.Bytes(), &made)
	if w.Code != 201 || !strings.HasPrefix(made.Key, made.Prefix) || made.Current || !strings.HasPrefix(made.ID, "key_") {
		t.Fatalf("create: %d %s", w.Code, w.Body)
	}
	// The new key works at once (the set reloads), and is of this project.
	if w := d.req("GET", "/api/keys", nil, "X-API-Key", made.Key); w.Code != 200 || !strings.Contains(w.Body.String(), self) {
		t.Fatalf("new key: %d %s", w.Code, w.Body)
	}
	w = d.req("GET", "/api/keys", nil, "X-API-Key", d.other)
	var others []keyInfo
	json.Unmarshal(w.Body.Bytes(), &others)
	if len(others) != 1 || others[0].ID == self || others[0].ID == made.ID {
		t.Fatalf("other project's keys: %s", w.Body)
	}
	if w := d.req("DELETE", "/api/keys/"+others[0].ID, nil, "X-API-Key", d.key); w.Code != 404 || errCode(t, w) != "key_not_found" {
		t.Fatalf("revoke another project's key: %d %s", w.Code, w.Body)
	}

	cookie, csrf := d.login(t, made.Key)
	if w := d.req("DELETE", "/api/keys/"+made.ID, nil, "X-API-Key", d.key); w.Code != 204 {
		t.Fatalf("revoke: %d %s", w.Code, w.Body)
	}
	if w := d.req("GET", "/api/projects", nil, "X-API-Key", made.Key); w.Code != 401 {
		t.Fatalf("revoked key, the very next request: %d", w.Code)
	}
	if w := d.req("GET", "/api/projects", nil, "Cookie", cookie, CSRFHeader, csrf); w.Code != 401 || errCode(t, w) != "session_ended" {
		t.Fatalf("session of a revoked key: %d %s", w.Code, w.Body)
	}
	if w := d.req("GET", "/api/projects", nil, "Cookie", cookie); w.Code != 401 || errCode(t, w) != "session_expired" {
		t.Fatalf("the ended session again: %d %s", w.Code, w.Body)
	}
	w = d.req("GET", "/api/keys", nil, "X-API-Key", d.key)
	if !strings.Contains(w.Body.String(), `"revokedAt":"`) {
		t.Fatalf("revoked key listed without revokedAt: %s", w.Body)
	}
	if w := d.req("DELETE", "/api/keys/"+made.ID, nil, "X-API-Key", d.key); w.Code != 204 {
		t.Fatalf("revoke again: %d %s", w.Code, w.Body)
	}
}
