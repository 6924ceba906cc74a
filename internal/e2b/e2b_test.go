package e2b

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/api"
	"github.com/lizard-build/lizard/internal/apikey"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/sandbox/usage"
	"github.com/lizard-build/lizard/internal/store/sqlite"
	"github.com/lizard-build/lizard/internal/template"
)

const testKey = "lz_e2b_test_key_0123456789abcdef"

// newTestHandler is the control plane over a real store, key set, template
// registry and sandbox service in a temporary directory, with no template
// and no runtime: every request ends in validation or a lookup.
func newTestHandler(tb testing.TB) http.Handler { return newTestHandlerWith(tb, nil) }

// newTestHandlerWith is newTestHandler with the control plane's templates
// from tmpls (nil: the empty registry's).
func newTestHandlerWith(tb testing.TB, tmpls Templates) http.Handler {
	dir := tb.TempDir()
	st, err := sqlite.Open(filepath.Join(dir, "lizard.db"))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { st.Close() })
	ctx := context.Background()
	p, err := st.CreateProject(ctx, "default", "default")
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := st.CreateKey(ctx, p.ID, testKey); err != nil {
		tb.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	keys, err := apikey.Open(ctx, apikey.Config{Store: st, Logger: log})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { keys.Close() })
	reg := template.NewRegistry(filepath.Join(dir, "templates"))
	svc := sandbox.New(sandbox.Config{Store: st, Templates: reg, Logger: log, SnapshotDir: filepath.Join(dir, "snapshots")})
	if tmpls == nil {
		tmpls = reg
	}
	usages := usage.New(svc, nil, log)
	e2b := Handler(Config{Auth: api.Auth{Keys: keys}, Sandboxes: svc, Usage: usages, Templates: tmpls, Domain: "sandbox.localhost:8081", Logger: log})
	return api.Handler(api.Config{E2B: e2b, Keys: keys, Sandboxes: svc, Usage: usages, Templates: reg, Logger: log})
}

func send(h http.Handler, key, method, target, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, target, strings.NewReader(body))
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	req.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w
}

// TestErrors: refusals are E2B's {code, message} with the status the SDK
// maps (404 → not found, 409 → pause false, 401 → authentication), and
// bad input names the field.
func TestErrors(t *testing.T) {
	h := newTestHandler(t)
	tests := []struct {
		key, method, path, body string
		status                  int
		mention                 string
	}{
		{"", "GET", "/v2/sandboxes", "", 401, "API key"},
		{"lz_wrong", "POST", "/v2/sandboxes", "{}", 401, "invalid API key"},
		{testKey, "POST", "/v2/sandboxes", `{"templateID":"base","timeout":0}`, 400, "timeout"},
		{testKey, "POST", "/sandboxes", `{"templateID":"base","timeout":-3}`, 400, "timeout"},
		{testKey, "POST", "/v2/sandboxes", `{"timeout":"300"}`, 400, "timeout"},
		{testKey, "POST", "/v2/sandboxes", `{"templateID":"base","network":{"denyOut":["example.com"]}}`, 400, `network.denyOut[0] "example.com"`},
		{testKey, "POST", "/v2/sandboxes", `{"templateID":"base","network":{"allowOut":["*"]}}`, 400, "network.allowOut[0]"},
		{testKey, "POST", "/v2/sandboxes", `{"templateID":"base","network":{"rules":{"a.example.com":[{"transform":{"headers":{"Bad Name":"x"}}}]}}}`, 400, "not an HTTP token"},
		{testKey, "POST", "/v2/sandboxes", `{"templateID":"base","network":{"rules":{"a.example.com":[{"transform":{"headers":{"X":"${e2b.secrets.tok}"}}}]}}}`, 400, "network.rules"},
		{testKey, "PUT", "/sandboxes/nosuch/network", `{"denyOut":["example.com"]}`, 400, "network.denyOut[0]"},
		{testKey, "POST", "/v2/sandboxes", `{"templateID":"base","autoResume":{"enabled":true}}`, 400, "autoResume"},
		{testKey, "POST", "/v2/sandboxes", `{"templateID":"base","mcp":{"github":{}}}`, 400, "mcp"},
		{testKey, "POST", "/v2/sandboxes", `{"templateID":"base","volumeMounts":[{"name":"v","path":"/v"}]}`, 400, "volumeMounts"},
		{testKey, "POST", "/v2/sandboxes", `{`, 400, "JSON"},
		{testKey, "POST", "/v2/sandboxes", `{"templateID":"base","metadata":` + manyKeys(100) + `}`, 400, "metadata: 100 keys, at most 64"},
		{testKey, "POST", "/v2/sandboxes", `{"templateID":"base","metadata":{"k":"` + strings.Repeat("v", 2049) + `"}}`, 400, "at most 2048"},
		{testKey, "POST", "/v2/sandboxes", `{"templateID":"base","envVars":{"A=B":"x"}}`, 400, "envVars"},
		{testKey, "POST", "/v2/sandboxes", `{"templateID":"base","envVars":` + manyKeys(600) + `}`, 400, "envVars: 600 variables, at most 512"},
		{testKey, "POST", "/v2/sandboxes", `{"templateID":"base"}`, 404, "base"},
		{testKey, "POST", "/v2/sandboxes", `{"templateID":"code-interpreter-v1"}`, 404, "interpreter"},
		{testKey, "GET", "/v2/sandboxes?state=running,dead", "", 400, "state"},
		{testKey, "GET", "/v2/sandboxes?limit=101", "", 400, "limit"},
		{testKey, "GET", "/v2/sandboxes?order=up", "", 400, "order"},
		{testKey, "GET", "/v2/sandboxes?startedAfter=yesterday", "", 400, "startedAfter"},
		{testKey, "GET", "/v2/sandboxes?nextToken=bm9wZQ", "", 400, "nextToken"},
		{testKey, "GET", "/v2/sandboxes?nextToken=%%%", "", 400, "query"},
		{testKey, "GET", "/sandboxes/nosuch", "", 404, "nosuch"},
		{testKey, "DELETE", "/sandboxes/nosuch", "", 404, "nosuch"},
		{testKey, "POST", "/sandboxes/nosuch/pause", "", 404, "nosuch"},
		{testKey, "POST", "/sandboxes/nosuch/pause", `{"memory":false}`, 400, "memory"},
		{testKey, "POST", "/sandboxes/nosuch/resume", "{}", 404, "nosuch"},
		{testKey, "POST", "/sandboxes/nosuch/connect", `{"timeout":30}`, 404, "nosuch"},
		{testKey, "POST", "/v2/sandboxes/nosuch/connect", `{"timeout":0}`, 400, "timeout"},
		{testKey, "POST", "/sandboxes/nosuch/timeout", `{}`, 400, "timeout"},
		{testKey, "POST", "/sandboxes/nosuch/timeout", `{"timeout":60}`, 404, "nosuch"},
		{testKey, "POST", "/sandboxes/nosuch/fork", `{"count":2}`, 404, "nosuch"},
		{testKey, "GET", "/sandboxes/nosuch/metrics?start=1&end=0", "", 400, "end"},
		{testKey, "GET", "/sandboxes/nosuch/metrics", "", 404, "nosuch"},
		{testKey, "POST", "/v2/sandboxes", `{}`, 400, "templateID: required"},
		{testKey, "POST", "/sandboxes", `{"templateID":"","timeout":30}`, 400, "templateID: required"},
		{testKey, "GET", "/templates/aliases/base", "", 404, "base"},
		{"", "GET", "/templates/aliases/base", "", 401, "API key"},
		{testKey, "PUT", "/sandboxes/nosuch/network", "{}", 400, "cannot change a sandbox's network"},
		{testKey, "POST", "/sandboxes/nosuch/snapshots", "{}", 400, "not supported by lizard"},
		{testKey, "GET", "/sandboxes/nosuch/no/such/route", "", 400, "not supported by lizard"},
		{testKey, "GET", "/snapshots", "", 400, "GET /snapshots is not supported by lizard"},
		{testKey, "POST", "/v3/templates", "{}", 400, "not supported by lizard"},
		{testKey, "GET", "/templates/base/tags", "", 400, "not supported by lizard"},
		{testKey, "GET", "/volumes", "", 400, "not supported by lizard"},
		{testKey, "GET", "/secrets", "", 400, "not supported by lizard"},
		{"", "GET", "/volumes", "", 401, "API key"},
	}
	for _, tt := range tests {
		w := send(h, tt.key, tt.method, tt.path, tt.body)
		var body errorBody
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
			t.Errorf("%s %s: %d %q: not JSON: %v", tt.method, tt.path, w.Code, w.Body, err)
			continue
		}
		if w.Code != tt.status || body.Code != tt.status || !strings.Contains(body.Message, tt.mention) {
			t.Errorf("%s %s %s: %d %+v, want %d mentioning %q", tt.method, tt.path, tt.body, w.Code, body, tt.status, tt.mention)
		}
	}
}

type fakeTemplates []template.Template

func (f fakeTemplates) ListFor(string) ([]template.Template, error) { return f, nil }

// TestTemplateAlias: Template.exists() is true for a template the project
// sees by any of its names (E2B's TemplateAliasResponse), false (404) for
// anything else.
func TestTemplateAlias(t *testing.T) {
	h := newTestHandlerWith(t, fakeTemplates{
		{Name: "base"},
		{Name: "python", Aliases: []string{"python312"}},
		{Name: "mine", Project: "prj_1"},
	})
	tests := []struct {
		alias  string
		status int
		body   string
	}{
		{"base", 200, `{"templateID":"base","public":true}`},
		{"python312", 200, `{"templateID":"python","public":true}`},
		{"mine", 200, `{"templateID":"mine","public":false}`},
		{"nosuch", 404, `"code":404`},
		{"Base", 404, `"code":404`},
	}
	for _, tt := range tests {
		w := send(h, testKey, "GET", "/templates/aliases/"+tt.alias, "")
		if w.Code != tt.status || !strings.Contains(w.Body.String(), tt.body) {
			t.Errorf("GET /templates/aliases/%s: %d %s, want %d %s", tt.alias, w.Code, w.Body, tt.status, tt.body)
		}
	}
}

func manyKeys(n int) string {
	m := map[string]string{}
	for i := range n {
		m[fmt.Sprintf("K%d", i)] = "v"
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// TestListEmptyAndTemplates: an empty project lists [] without a next
// token, in both versions; templates answer [].
func TestListEmptyAndTemplates(t *testing.T) {
	h := newTestHandler(t)
	for _, path := range []string{"/sandboxes", "/v2/sandboxes", "/v2/sandboxes?state=paused&metadata=a%3D1&limit=5", "/templates"} {
		w := send(h, testKey, "GET", path, "")
		if w.Code != 200 || strings.TrimSpace(w.Body.String()) != "[]" || w.Header().Get("X-Next-Token") != "" {
			t.Errorf("GET %s: %d %q next %q", path, w.Code, w.Body, w.Header().Get("X-Next-Token"))
		}
	}
}

// TestPages: pages of any size cover the matching sandboxes once each, in
// order, for both orders; filters apply before paging.
func TestPages(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var all []sandbox.Record
	for i := range 40 {
		rec := sandbox.Record{
			ID: fmt.Sprintf("s%02d", i), StartedAt: base.Add(time.Duration(rng.IntN(10)) * time.Second), // ties
			Status: []string{sandbox.StatusRunning, sandbox.StatusPaused}[rng.IntN(2)], E2B: i%7 != 0,
			Metadata: map[string]string{"even": fmt.Sprint(i%2 == 0)}, Template: "base",
		}
		all = append(all, rec)
	}
	for _, q := range []string{"", "order=asc", "state=paused", "metadata=even%3Dtrue", "state=running&order=asc&metadata=even%3Dfalse"} {
		for _, limit := range []int{1, 3, 7, 100} {
			r := httptest.NewRequest("GET", fmt.Sprintf("/v2/sandboxes?%s&limit=%d", q, limit), nil)
			lq, err := parseList(r)
			if err != nil {
				t.Fatal(err)
			}
			want, _ := listQuery{states: lq.states, metadata: lq.metadata, asc: lq.asc}.page(all)
			var got []string
			for n := 0; ; n++ {
				recs, next := lq.page(all)
				if len(recs) > limit || (next != "" && len(recs) != limit) {
					t.Fatalf("%s limit %d: page of %d, next %q", q, limit, len(recs), next)
				}
				for _, rec := range recs {
					got = append(got, rec.ID)
				}
				if next == "" {
					break
				}
				if lq.after, err = parseCursor(next); err != nil || n > 100 {
					t.Fatalf("%s: token %q: %v", q, next, err)
				}
			}
			var wantIDs []string
			for _, rec := range want {
				if !rec.E2B {
					t.Fatalf("%s: lists %s, which is not an E2B sandbox", q, rec.ID)
				}
				wantIDs = append(wantIDs, rec.ID)
			}
			if !slices.Equal(got, wantIDs) || len(wantIDs) == 0 {
				t.Errorf("%s limit %d: pages gave %v, want %v", q, limit, got, wantIDs)
			}
			for i := 1; i < len(want); i++ {
				a, b := want[i-1].StartedAt, want[i].StartedAt
				if (lq.asc && a.After(b)) || (!lq.asc && a.Before(b)) {
					t.Fatalf("%s: out of order at %d", q, i)
				}
			}
		}
	}
}

// FuzzE2B: no request makes the control plane answer 5xx or anything but
// E2B's JSON error when it refuses.
func FuzzE2B(f *testing.F) {
	h := newTestHandler(f)
	for _, s := range []struct{ method, path, query, body string }{
		{"POST", "/v2/sandboxes", "", `{"templateID":"base","timeout":300,"metadata":{"a":"b"},"envVars":{"X":"1"},"secure":true}`},
		{"POST", "/sandboxes", "", `{"templateID":"x","network":{"allowPublicTraffic":false,"allowOut":["pypi.org"]},"allow_internet_access":false}`},
		{"GET", "/v2/sandboxes", "state=running,paused&metadata=a%3Db&limit=2&nextToken=MTAvYQ&order=asc&startedAfter=2026-01-01T00:00:00Z", ""},
		{"POST", "/sandboxes/x/connect", "", `{"timeout":1e99}`},
		{"POST", "/sandboxes/x/fork", "", `{"count":-1,"timeout":2}`},
		{"GET", "/sandboxes/x/metrics", "start=99999999999999&end=1", ""},
	} {
		f.Add(s.method, s.path, s.query, []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, method, path, query string, body []byte) {
		if !strings.HasPrefix(path, "/") || strings.HasPrefix(path, "/api/") || strings.ContainsAny(path, " \r\n?#") {
			t.Skip()
		}
		req := httptest.NewRequest("GET", "/", bytes.NewReader(body))
		req.Method, req.URL.Path, req.URL.RawQuery = method, path, query
		req.Header.Set("X-API-Key", testKey)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code >= 500 {
			t.Fatalf("%s %q ?%q %q: %d %s", method, path, query, body, w.Code, w.Body)
		}
	})
}
