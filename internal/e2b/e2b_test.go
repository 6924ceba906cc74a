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
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/api"
	"github.com/lizard-build/lizard/internal/apikey"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/sandbox/snapshot"
	"github.com/lizard-build/lizard/internal/sandbox/usage"
	"github.com/lizard-build/lizard/internal/seal"
	"github.com/lizard-build/lizard/internal/secrets"
	"github.com/lizard-build/lizard/internal/store/sqlite"
	"github.com/lizard-build/lizard/internal/template"
	"github.com/lizard-build/lizard/internal/volume"
)

const (
	testKey  = "lz_e2b_test_key_0123456789abcdef"
	otherKey = "lz_e2b_other_key_0123456789abcdef" // of a second project
)

// newTestHandler is the control plane over a real store, key set, template
// registry and sandbox service in a temporary directory, with no template
// and no runtime: every request ends in validation or a lookup.
func newTestHandler(tb testing.TB) http.Handler { return newTestHandlerWith(tb, nil) }

// newTestHandlerWith is newTestHandler with the control plane's templates
// from tmpls (nil: the empty registry's).
func newTestHandlerWith(tb testing.TB, tmpls Templates) http.Handler {
	return newTestHandlerLog(tb, tmpls, io.Discard)
}

// newTestHandlerLog is newTestHandlerWith logging to logw at debug level,
// with secrets under a key of its own, and a second project ("project-1")
// whose key is otherKey.
func newTestHandlerLog(tb testing.TB, tmpls Templates, logw io.Writer) http.Handler {
	return newTestAPILog(tb, func(c *Config, _ *sqlite.Store) {
		if tmpls != nil {
			c.Templates = tmpls
		}
		c.Domain = "sandbox.localhost:8081"
	}, logw, testKey, otherKey)
}

// newTestAPI is the control plane, mounted in the Lizard API, over a real
// store, key set, template registry and sandbox service in a temporary
// directory, with no template and no runtime, and a project for each of
// keys (the first is "default"); configure completes its Config.
func newTestAPI(tb testing.TB, configure func(*Config, *sqlite.Store), keys ...string) http.Handler {
	return newTestAPILog(tb, configure, io.Discard, keys...)
}

// newTestAPILog is newTestAPI logging to logw at debug level.
func newTestAPILog(tb testing.TB, configure func(*Config, *sqlite.Store), logw io.Writer, keys ...string) http.Handler {
	dir := tb.TempDir()
	st, err := sqlite.Open(filepath.Join(dir, "lizard.db"))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { st.Close() })
	ctx := context.Background()
	for i, key := range keys {
		name := "default"
		if i > 0 {
			name = fmt.Sprintf("project-%d", i)
		}
		p, err := st.CreateProject(ctx, name, name)
		if err != nil {
			tb.Fatal(err)
		}
		if _, err := st.CreateKey(ctx, p.ID, key); err != nil {
			tb.Fatal(err)
		}
	}
	log := slog.New(slog.NewTextHandler(logw, &slog.HandlerOptions{Level: slog.LevelDebug}))
	set, err := apikey.Open(ctx, apikey.Config{Store: st, Logger: log})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { set.Close() })
	reg := template.NewRegistry(filepath.Join(dir, "templates"))
	svc := sandbox.New(sandbox.Config{Store: st, Templates: reg, Logger: log, SnapshotDir: filepath.Join(dir, "snapshots")})
	usages := usage.New(svc, nil, log)
	secs := secrets.New(st, seal.NewKeyring(seal.NewKey()))
	vols, err := volume.New(volume.Config{Dir: filepath.Join(dir, "volumes"), Store: st, Logger: log})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(vols.Close)
	snaps := snapshot.New(snapshot.Config{Core: svc, Store: st, Dir: filepath.Join(dir, "snapshots"), Logger: log})
	cfg := Config{Auth: api.Auth{Keys: set}, Sandboxes: svc, Copies: snaps, Usage: usages, Templates: reg, Snapshots: snaps, Volumes: vols, Agents: svc,
		SandboxCLI: "/usr/local/bin/lizard", Logger: log, Secrets: secs}
	configure(&cfg, st)
	return api.Handler(api.Config{E2B: Handler(cfg), Keys: set, Sandboxes: svc, Snapshots: snaps, Copies: snaps, Usage: usages, Templates: reg, Logger: log, Secrets: secs})
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
		{testKey, "POST", "/v2/sandboxes", `{"templateID":"base","volumeMounts":[{"name":"v","path":"/v"}]}`, 400, "volumeMounts[0].path \"/v\": lizard mounts a sandbox's volume at /workspace"},
		{testKey, "POST", "/v2/sandboxes", `{"templateID":"base","volumeMounts":[{"name":"v","path":"/workspace"},{"name":"w","path":"/workspace"}]}`, 400, "volumeMounts: 2 volumes"},
		{testKey, "POST", "/v2/sandboxes", `{"templateID":"base","volumeMounts":[{"path":"/workspace"}]}`, 400, "volumeMounts[0].name: required"},
		{testKey, "POST", "/v2/sandboxes", `{"templateID":"base","volumeMounts":[{"name":"nosuch","path":"/workspace/"}]}`, 404, "base"},
		{testKey, "POST", "/v2/sandboxes", `{"templateID":"base","volumeMounts":{"name":"v"}}`, 400, "volumeMounts"},
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
		{testKey, "POST", "/sandboxes/nosuch/pause", `{"memory":false}`, 404, "nosuch"},
		{testKey, "POST", "/sandboxes/nosuch/pause", `{"memory":"no"}`, 400, "memory"},
		{testKey, "POST", "/v2/sandboxes", `{"templateID":"base","autoPause":true,"autoPauseMemory":false,"autoResume":{"enabled":true}}`, 400, "autoPauseMemory"},
		{testKey, "POST", "/sandboxes/nosuch/resume", "{}", 404, "nosuch"},
		{testKey, "POST", "/sandboxes/nosuch/connect", `{"timeout":30}`, 404, "nosuch"},
		{testKey, "POST", "/v2/sandboxes/nosuch/connect", `{"timeout":0}`, 400, "timeout"},
		{testKey, "POST", "/sandboxes/nosuch/timeout", `{}`, 400, "timeout"},
		{testKey, "POST", "/sandboxes/nosuch/timeout", `{"timeout":60}`, 404, "nosuch"},
		{testKey, "POST", "/sandboxes/nosuch/fork", `{"count":2}`, 404, "nosuch"},
		{testKey, "POST", "/sandboxes/nosuch/fork", `{"count":0}`, 400, "count 0: must be 1 to"},
		{testKey, "GET", "/sandboxes/nosuch/metrics?start=1&end=0", "", 400, "end"},
		{testKey, "GET", "/sandboxes/nosuch/metrics", "", 404, "nosuch"},
		{testKey, "POST", "/v2/sandboxes", `{}`, 400, "templateID: required"},
		{testKey, "POST", "/sandboxes", `{"templateID":"","timeout":30}`, 400, "templateID: required"},
		{testKey, "GET", "/templates/aliases/base", "", 404, "base"},
		{"", "GET", "/templates/aliases/base", "", 401, "API key"},
		{testKey, "PUT", "/sandboxes/nosuch/network", "{}", 400, "cannot change a sandbox's network"},
		{testKey, "POST", "/sandboxes/nosuch/snapshots", "{}", 404, "nosuch"},
		{testKey, "POST", "/sandboxes/nosuch/snapshots", `{"name":"my snap"}`, 400, "name \"my snap\""},
		{testKey, "POST", "/sandboxes/nosuch/snapshots", `{"name":"team/snap:v1"}`, 400, "no team namespace or tag"},
		{testKey, "POST", "/sandboxes/nosuch/snapshots", `{"name":7}`, 400, "name"},
		{testKey, "GET", "/snapshots?limit=0", "", 400, "limit"},
		{testKey, "GET", "/snapshots?nextToken=bm9wZQ", "", 400, "nextToken"},
		{testKey, "DELETE", "/templates/snap_nosuch", "", 404, "snap_nosuch"},
		{testKey, "GET", "/sandboxes/nosuch/no/such/route", "", 400, "not supported by lizard"},
		{testKey, "POST", "/v3/templates", "{}", 400, "this server cannot build templates"},
		{testKey, "GET", "/templates/base/tags", "", 404, "base"},
		{testKey, "GET", "/templates/base/what", "", 400, "not supported by lizard"},
		{testKey, "POST", "/secrets", `{"name":"a b","value":"v"}`, 400, "name:"},
		{testKey, "POST", "/secrets", `{"name":"tok"}`, 400, "value: required"},
		{testKey, "POST", "/secrets", `{"name":"tok","value":"a\nb"}`, 400, "value: must not hold control characters"},
		{testKey, "POST", "/secrets", `{"name":"tok","value":"v"`, 400, "body: malformed JSON"},
		{testKey, "POST", "/secrets", `{"name":"tok","value":"v","metadata":{"k":7}}`, 400, "metadata"},
		{testKey, "GET", "/secrets?limit=0", "", 400, "limit"},
		{testKey, "GET", "/secrets?nextToken=%21", "", 400, "nextToken"},
		{testKey, "GET", "/secrets/nosuch", "", 404, "nosuch"},
		{testKey, "GET", "/secrets/sec_nosuch", "", 404, "sec_nosuch"},
		{testKey, "GET", "/secrets/bad%20name", "", 400, "name"},
		{testKey, "POST", "/secrets/nosuch", `{"value":"v"}`, 404, "nosuch"},
		{testKey, "POST", "/secrets/nosuch", `{"value":""}`, 400, "value"},
		{testKey, "DELETE", "/secrets/nosuch", "", 404, "nosuch"},
		{"", "GET", "/secrets", "", 401, "API key"},
		{testKey, "POST", "/v2/sandboxes", `{"templateID":"base","iam":{"tokens":{"aws":{"audience":"sts","tokenType":"JWT-SVID"}}}}`, 400, "iam.tokens: workload identity is not configured"},
		{testKey, "POST", "/v2/sandboxes", `{"templateID":"base","iam":{"tokens":"aws"}}`, 400, "iam.tokens"},
		{testKey, "POST", "/volumes", `{"name":"Has_Upper"}`, 400, "name \"Has_Upper\""},
		{testKey, "POST", "/volumes", `{}`, 400, "name"},
		{testKey, "GET", "/volumes/nosuch", "", 404, "nosuch"},
		{testKey, "DELETE", "/volumes/nosuch", "", 404, "nosuch"},
		{"", "GET", "/volumes", "", 401, "API key"},
		{"", "GET", "/snapshots", "", 401, "API key"},
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

func (f fakeTemplates) Delete(context.Context, string, string) error {
	return fmt.Errorf("fakeTemplates: no delete: %w", errdefs.ErrInvalid)
}

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
// token, in both versions; templates, snapshots and volumes answer [].
func TestListEmptyAndTemplates(t *testing.T) {
	h := newTestHandler(t)
	for _, path := range []string{"/sandboxes", "/v2/sandboxes", "/v2/sandboxes?state=paused&metadata=a%3D1&limit=5", "/templates",
		"/snapshots", "/snapshots?sandboxID=x&name=y&limit=3", "/volumes"} {
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
			want, _ := listQuery{states: lq.states, metadata: lq.metadata, pageOrder: pageOrder{asc: lq.asc}}.page(all)
			var got []string
			for _, rec := range allPages(t, q, limit, func(after *cursor) ([]sandbox.Record, string) {
				lq.after = after
				return lq.page(all)
			}) {
				got = append(got, rec.ID)
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
		{"POST", "/sandboxes/x/snapshots", "", `{"name":"snap-1"}`},
		{"GET", "/snapshots", "sandboxID=x&name=y&limit=3&nextToken=MTAvYQ", ""},
		{"DELETE", "/templates/snap_x", "", ""},
		{"POST", "/v2/sandboxes", "", `{"templateID":"snap_x","volumeMounts":[{"name":"v","path":"/workspace"}],"secure":false}`},
		{"POST", "/volumes", "", `{"name":"data"}`},
		{"GET", "/volumes/vol_x", "", ""},
		{"GET", "/volumecontent/vol_x/dir", "path=/&depth=2", ""},
		{"PUT", "/volumecontent/vol_x/file", "path=/a&uid=1&gid=2&mode=420&force=true", "data"},
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
		// Only root mounts a volume: a server that is not cannot make one,
		// and says so with a 503 (lizard runs as root).
		mountRefused := os.Geteuid() != 0 && w.Code == http.StatusServiceUnavailable && strings.Contains(w.Body.String(), "mount failed")
		if w.Code >= 500 && !mountRefused {
			t.Fatalf("%s %q ?%q %q: %d %s", method, path, query, body, w.Code, w.Body)
		}
	})
}
