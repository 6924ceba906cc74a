package api

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/apikey"
	"github.com/lizard-build/lizard/internal/dashboard"
	"github.com/lizard-build/lizard/internal/events"
	"github.com/lizard-build/lizard/internal/runtime/fake"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/sandbox/desktop"
	"github.com/lizard-build/lizard/internal/sandbox/preview"
	"github.com/lizard-build/lizard/internal/sandbox/snapshot"
	"github.com/lizard-build/lizard/internal/sandbox/usage"
	"github.com/lizard-build/lizard/internal/store/sqlite"
	"github.com/lizard-build/lizard/internal/template"
	"github.com/lizard-build/lizard/internal/volume"
	"github.com/lizard-build/lizard/internal/webhook"
)

// fuzzRoutes are the requests FuzzAPI sends, {id} replaced by the fuzzed
// id. Left out: POST /api/templates (a valid one runs a build, which needs
// runsc) and volume creation (a valid one makes and mounts a filesystem).
var fuzzRoutes = []struct{ method, path string }{
	{"POST", "/api/sandboxes"},
	{"GET", "/api/sandboxes"},
	{"GET", "/api/sandboxes/{id}"},
	{"DELETE", "/api/sandboxes/{id}"},
	{"POST", "/api/sandboxes/{id}/timeout"},
	{"POST", "/api/sandboxes/{id}/pause"},
	{"POST", "/api/sandboxes/{id}/resume"},
	{"POST", "/api/sandboxes/{id}/fork"},
	{"POST", "/api/sandboxes/{id}/snapshot"},
	{"POST", "/api/sandboxes/{id}/expose/{id}"},
	{"DELETE", "/api/sandboxes/{id}/expose/{id}"},
	{"POST", "/api/sandboxes/{id}/exec"},
	{"GET", "/api/sandboxes/{id}/processes"},
	{"POST", "/api/sandboxes/{id}/processes/signal"},
	{"GET", "/api/sandboxes/{id}/logs"},
	{"POST", "/api/sandboxes/{id}/files"},
	{"GET", "/api/sandboxes/{id}/files"},
	{"DELETE", "/api/sandboxes/{id}/files"},
	{"GET", "/api/sandboxes/{id}/files/list"},
	{"GET", "/api/sandboxes/{id}/files/stat"},
	{"POST", "/api/sandboxes/{id}/files/move"},
	{"POST", "/api/sandboxes/{id}/files/watch"},
	{"GET", "/api/sandboxes/{id}/files/watch/events"},
	{"DELETE", "/api/sandboxes/{id}/files/watch"},
	{"POST", "/api/sandboxes/{id}/desktop"},
	{"GET", "/api/sandboxes/{id}/desktop"},
	{"DELETE", "/api/sandboxes/{id}/desktop"},
	{"GET", "/api/sandbox-snapshots/{id}"},
	{"PATCH", "/api/sandbox-snapshots/{id}"},
	{"DELETE", "/api/sandbox-snapshots/{id}"},
	{"POST", "/api/sandbox-snapshots/{id}/pause"},
	{"POST", "/api/sandbox-snapshots/{id}/resume"},
	{"GET", "/api/projects/{id}"},
	{"GET", "/api/projects/{id}/sandboxes"},
	{"GET", "/api/projects/{id}/snapshots"},
	{"GET", "/api/projects/{id}/volumes/{id}"},
	{"PATCH", "/api/projects/{id}/volumes/{id}"},
	{"DELETE", "/api/projects/{id}/volumes/{id}"},
	{"GET", "/api/templates"},
	{"GET", "/api/keys"},
	{"POST", "/api/keys"},
	{"DELETE", "/api/keys/{id}"},
	{"GET", "/api/events"},
	{"POST", "/api/webhooks"},
	{"GET", "/api/webhooks"},
	{"GET", "/api/webhooks/{id}"},
	{"DELETE", "/api/webhooks/{id}"},
	{"GET", "/api/webhooks/{id}/deliveries"},
	{"POST", "/dashboard/login"},
	{"GET", "/dashboard/session"},
	{"POST", "/dashboard/logout"},
	// Any path: route is beyond the table, the path is /api/<id>.
}

const fuzzKey = "lz_fuzz_key_0123456789abcdef"

// fuzzTemplates is the registry with one more template, "fuzz", on an
// empty root filesystem (the fake runtime only checks that it is there).
type fuzzTemplates struct {
	*template.Registry
	rootfs string
}

func (t fuzzTemplates) Lookup(project, name string) (template.Template, error) {
	if name == "fuzz" {
		return template.Template{Name: "fuzz", Rootfs: t.rootfs}, nil
	}
	return t.Registry.Lookup(project, name)
}

func (t fuzzTemplates) LookupVersion(project, name, digest string) (template.Template, error) {
	if name == "fuzz" {
		return t.Lookup(project, name)
	}
	return t.Registry.LookupVersion(project, name, digest)
}

// newFuzzHandler is newFuzzAPI's handler.
func newFuzzHandler(f testing.TB) http.Handler {
	h, _ := newFuzzAPI(f)
	return h
}

// newFuzzAPI is the API as the server wires it, over a real store, a real
// template registry, volume manager and sandbox service in a temporary
// directory, the service over the fake runtime (no root). The registry
// holds no template; the service sees one more, "fuzz", and runs one
// sandbox of it, whose id newFuzzAPI returns, so that requests for it
// reach the handlers and the agent past validation and lookups.
func newFuzzAPI(f testing.TB) (http.Handler, string) {
	dir := f.TempDir()
	st, err := sqlite.Open(filepath.Join(dir, "lizard.db"))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { st.Close() })
	ctx := context.Background()
	p, err := st.CreateProject(ctx, "default", "default")
	if err != nil {
		f.Fatal(err)
	}
	if _, err := st.CreateKey(ctx, p.ID, fuzzKey); err != nil {
		f.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	vols, err := volume.New(volume.Config{Dir: filepath.Join(dir, "volumes"), Store: st, Logger: log})
	if err != nil {
		f.Fatal(err)
	}
	keys, err := apikey.Open(ctx, apikey.Config{Store: st, Logger: log})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { keys.Close() })
	reg := template.NewRegistry(filepath.Join(dir, "templates"))
	rt, err := fake.New(fake.Config{Dir: filepath.Join(dir, "runtime"), Logger: log})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() {
		list, _ := rt.List(context.Background())
		for _, sb := range list {
			rt.Destroy(context.Background(), sb.ID)
		}
	})
	svc := sandbox.New(sandbox.Config{Runtime: rt, Store: st, Templates: fuzzTemplates{reg, f.TempDir()}, Volumes: vols, Logger: log,
		SnapshotDir: filepath.Join(dir, "snapshots"), LogDir: filepath.Join(dir, "logs"), MaxSandboxes: 8})
	if err := svc.Recover(ctx); err != nil {
		f.Fatal(err)
	}
	f.Cleanup(svc.Close)
	snaps := snapshot.New(snapshot.Config{Core: svc, Runtime: rt, Store: st, Dir: filepath.Join(dir, "snapshots"), Logger: log})
	if err := snaps.Recover(ctx); err != nil {
		f.Fatal(err)
	}
	f.Cleanup(snaps.Close)
	live, err := svc.Create(ctx, sandbox.CreateRequest{ProjectID: p.ID, Template: "fuzz"})
	if err != nil {
		f.Fatal(err)
	}
	assets, err := dashboard.NewAssets()
	if err != nil {
		f.Fatal(err)
	}
	ports := preview.New(svc)
	// The service tells the log nothing: no event, so no webhook
	// delivery leaves the host.
	evlog, err := events.New(events.Config{Store: st, Logger: log})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(evlog.Close)
	hooks := webhook.New(webhook.Config{Store: st, Logger: log})
	f.Cleanup(hooks.Close)
	return Handler(Config{Keys: keys, Sandboxes: svc, Snapshots: snaps, Copies: snaps, Usage: usage.New(svc, rt, log), Ports: ports, Desktops: desktop.New(svc, ports), Templates: reg, Volumes: vols,
		Previews: PreviewURLs{Domain: "sandbox.localhost", Scheme: "http"}, Logger: log,
		KeyStore: st, Sessions: dashboard.NewSessions(0, 0), Dashboard: assets, Events: evlog, Webhooks: hooks}), live.ID
}

// hostEffects says whether a request would run a command or change files
// on the host: the fake runtime's sandboxes are the test's own user on
// the host, so those are not fuzzed on a live sandbox (the validation in
// front of them is, on other ids).
func hostEffects(method, path, live string) bool {
	if !strings.Contains(path, live) {
		return false
	}
	for _, suffix := range []string{"/exec", "/processes", "/files", "/files/move", "/desktop"} {
		if strings.HasSuffix(path, suffix) && method != "GET" {
			return true
		}
	}
	return false
}

// FuzzAPI sends arbitrary ids, queries, bodies and headers to the routes
// and asserts that the API never panics or answers 5xx (a panic becomes a
// 500), and that every refusal is a JSON error with a code and a message.
func FuzzAPI(f *testing.F) {
	h, live := newFuzzAPI(f)
	route := func(method, path string) uint8 {
		for i, r := range fuzzRoutes {
			if r.method == method && r.path == path {
				return uint8(i)
			}
		}
		panic("no route " + method + " " + path)
	}
	create, exec, write := route("POST", "/api/sandboxes"), route("POST", "/api/sandboxes/{id}/exec"), route("POST", "/api/sandboxes/{id}/files")
	for _, seed := range []struct {
		route uint8
		body  string
	}{
		{create, `{"template":"base","timeoutMs":300000,"envs":{"A":"1"},"metadata":{"k":"v"}}`},
		{create, `{"template":"base","internetAccess":false,"allowedHosts":["pypi.org","*.github.com","10.0.0.0/8"]}`},
		{create, `{"template":"base","size":"huge","timeoutMs":-1}`},
		{create, `{"snapshotId":"snap_x","poolSize":3}`},
		{create, `{"volumeName":"v","template":"../../etc"}`},
		{create, `{"timeoutMs":1e400}`},
		{create, `{"template":"base","lizardToken":"lz_x","environment":"prod","region":"eu-west-1","metadata":{"":"x"}}`},
		{create, `[`}, {create, `null`}, {create, ``}, {create, `{"template":1}`},
		{exec, `{"cmd":"echo hi","timeout":30,"envs":{"X":"y"},"user":"root","cwd":"/tmp"}`},
		{exec, `{"cmd":["ls","-l"],"timeout":0}`},
		{exec, `{"cmd":{"a":1}}`},
		{write, `{"path":"/tmp/a","content":"aGk=","encoding":"base64"}`},
		{route("POST", "/api/sandboxes/{id}/files/move"), `{"from":"/a","to":"/b"}`},
		{route("POST", "/api/sandboxes/{id}/processes/signal"), `{"pid":1,"signal":"SIGKILL"}`},
		{route("POST", "/api/sandboxes/{id}/timeout"), `{"timeout":-5}`},
		{route("POST", "/api/sandboxes/{id}/fork"), `{"count":100000}`},
		{route("POST", "/api/sandboxes/{id}/files/watch"), `{"path":"/","recursive":true}`},
		{route("POST", "/api/webhooks"), `{"url":"https://93.184.215.14/hook","events":["sandbox.paused"],"secret":"0123456789abcdef"}`},
		{route("POST", "/api/webhooks"), `{"url":"http://[::1]:80/","events":[]}`},
		{route("GET", "/api/events"), ``},
	} {
		f.Add(seed.route, "sb1", "path=/tmp&user=root&tail=5", []byte(seed.body), false)
	}
	// The live sandbox: its routes past lookups.
	for _, seed := range []struct {
		route       uint8
		query, body string
	}{
		{route("GET", "/api/sandboxes/{id}"), "", ``},
		{route("GET", "/api/sandboxes/{id}/files"), "path=/etc/hostname", ``},
		{route("GET", "/api/sandboxes/{id}/files/list"), "path=/", ``},
		{route("GET", "/api/sandboxes/{id}/files/stat"), "path=/tmp", ``},
		{route("POST", "/api/sandboxes/{id}/files/watch"), "", `{"path":"/tmp","recursive":false}`},
		{route("GET", "/api/sandboxes/{id}/processes"), "", ``},
		{route("POST", "/api/sandboxes/{id}/processes/signal"), "", `{"pid":1,"signal":"SIGTERM"}`},
		{route("GET", "/api/sandboxes/{id}/logs"), "tail=5", ``},
		{route("POST", "/api/sandboxes/{id}/timeout"), "", `{"timeout":600}`},
		{route("POST", "/api/sandboxes/{id}/snapshot"), "", `{"name":"s","poolSize":1}`},
		{route("POST", "/api/sandboxes/{id}/fork"), "", `{"count":1}`},
		{route("POST", "/api/sandboxes/{id}/pause"), "", ``},
		{route("POST", "/api/sandboxes/{id}/resume"), "", ``},
	} {
		f.Add(seed.route, live, seed.query, []byte(seed.body), false)
	}
	f.Add(create, "", "", []byte(`{"template":"fuzz","timeoutMs":2000}`), false)
	f.Add(uint8(0), "", "", []byte(`{}`), true)
	f.Add(exec, "x", "", []byte(`{"cmd":"true"}`), true)
	f.Add(uint8(200), "sandboxes/../projects", "a=%zz", []byte(`{}`), false)
	f.Fuzz(func(t *testing.T, route uint8, id, query string, body []byte, sse bool) {
		var method, path string
		if int(route) < len(fuzzRoutes) {
			r := fuzzRoutes[route]
			method, path = r.method, strings.ReplaceAll(r.path, "{id}", id)
		} else {
			method, path = []string{"GET", "POST", "DELETE", "PATCH", "PUT"}[int(route)%5], "/api/"+id
			if (method == "POST" || method == "PUT") && (strings.Contains(path, "volumes") || strings.Contains(path, "templates")) {
				t.Skip("volume creation and template builds are not fuzzed")
			}
		}
		if hostEffects(method, path, live) {
			t.Skip("commands and file changes would run on the host")
		}
		req := httptest.NewRequest(method, "/", bytes.NewReader(body))
		req.URL.Path, req.URL.RawQuery = path, query
		req.Header.Set("X-API-Key", fuzzKey)
		req.Header.Set("Content-Type", "application/json")
		if sse {
			req.Header.Set("Accept", "text/event-stream")
		}
		// Streams (logs, watch events, exec) of the live sandbox end when
		// their client goes: this one goes after 2 s.
		ctx, cancel := context.WithTimeout(req.Context(), 2*time.Second)
		defer cancel()
		w := httptest.NewRecorder()
		done := make(chan struct{})
		go func() {
			defer close(done)
			h.ServeHTTP(w, req.WithContext(ctx))
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s %q ?%q %q: no answer within 10 s", method, path, query, body)
		}
		// A full node answers 503 with code capacity (and Retry-After):
		// the fuzzer's creates fill its 8 places, and that is the answer
		// a client retries, not a fault.
		full := w.Code == http.StatusServiceUnavailable && strings.Contains(w.Body.String(), `"code":"capacity"`) && w.Header().Get("Retry-After") != ""
		if w.Code >= 500 && !full {
			t.Fatalf("%s %q ?%q %q: %d %s", method, path, query, body, w.Code, w.Body)
		}
		if w.Code >= 400 {
			if !strings.HasPrefix(w.Header().Get("Content-Type"), "application/json") ||
				!strings.Contains(w.Body.String(), `"code":`) || !strings.Contains(w.Body.String(), `"message":`) {
				t.Fatalf("%s %q: %d without a JSON error: %q", method, path, w.Code, w.Body)
			}
		}
	})
}
