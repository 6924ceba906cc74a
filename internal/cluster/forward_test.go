package cluster

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/lizard-build/lizard/internal/api"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/sandbox/snapshot"
	"github.com/lizard-build/lizard/internal/sandbox/usage"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/volume"
)

// fakeCluster answers owners and nodes as the database would. It is the
// store boundary; the other methods are not called by the router.
type fakeCluster struct {
	store.Cluster
	mu         sync.Mutex
	owners     map[string]store.Owner
	nodes      []store.Node
	ownerCalls int
	down       bool // the database cannot be reached
	rows       map[string][]store.Sandbox
}

func (f *fakeCluster) SandboxesOn(_ context.Context, node string) ([]store.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]store.Sandbox(nil), f.rows[node]...), nil
}

func (f *fakeCluster) SandboxOwner(_ context.Context, id string) (store.Owner, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ownerCalls++
	if f.down {
		return store.Owner{}, errors.New("connection refused")
	}
	o, ok := f.owners[id]
	if !ok {
		return store.Owner{}, fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	return o, nil
}

func (f *fakeCluster) Nodes(context.Context) ([]store.Node, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return nil, errors.New("connection refused")
	}
	return append([]store.Node(nil), f.nodes...), nil
}

func (f *fakeCluster) calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ownerCalls
}

func (f *fakeCluster) set(fn func(f *fakeCluster)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

// fakeRows is the shared store's snapshot and volume rows.
type fakeRows struct {
	store.Store
	snapshots []store.Snapshot
	volumes   []store.Volume
}

func (f *fakeRows) Snapshots(context.Context) ([]store.Snapshot, error) { return f.snapshots, nil }
func (f *fakeRows) Volumes(context.Context) ([]store.Volume, error)     { return f.volumes, nil }

// fakeLocal is a node's part of the lists.
type fakeLocal struct {
	calls     atomic.Int64
	sandboxes []api.NodeSandbox
	snapshots []snapshot.Info
	volumes   []volume.Volume
}

func (l *fakeLocal) Sandboxes(string) []api.NodeSandbox {
	l.calls.Add(1)
	return append([]api.NodeSandbox{}, l.sandboxes...)
}

func (l *fakeLocal) Snapshots(string) []snapshot.Info {
	l.calls.Add(1)
	return append([]snapshot.Info{}, l.snapshots...)
}

func (l *fakeLocal) Holds(id string) bool {
	for _, sb := range l.sandboxes {
		if sb.Record.ID == id {
			return true
		}
	}
	return false
}

func (l *fakeLocal) Volumes(context.Context, string) ([]volume.Volume, error) {
	l.calls.Add(1)
	return append([]volume.Volume{}, l.volumes...), nil
}

// peer starts node name's internal listener serving apiH and proxyH.
func peer(t *testing.T, name string, apiH, proxyH http.Handler, local Local) *httptest.Server {
	t.Helper()
	if local == nil {
		local = &fakeLocal{}
	}
	srv := httptest.NewServer(InternalHandler(InternalConfig{Signer: newTestSigner(t, name, testSecret), API: apiH, Proxy: proxyH, Local: local, Logger: quiet()}))
	t.Cleanup(srv.Close)
	return srv
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func readyNode(name, addr string) store.Node {
	return store.Node{NodeInfo: store.NodeInfo{Name: name, Address: addr}, State: store.NodeReady}
}

func addrOf(srv *httptest.Server) string { return strings.TrimPrefix(srv.URL, "http://") }

func newTestRouter(t *testing.T, self string, fc *fakeCluster, rows store.Store, local Local) *Router {
	t.Helper()
	if rows == nil {
		rows = &fakeRows{}
	}
	if local == nil {
		local = &fakeLocal{}
	}
	seed := rand.Uint64()
	t.Logf("placement seed %d", seed)
	return NewRouter(RouterConfig{Self: self, Directory: fc, Store: rows, Signer: newTestSigner(t, self, testSecret), Local: local,
		Logger: quiet(), Rand: rand.New(rand.NewPCG(seed, seed))})
}

// front is node a's public API for the tests: per-sandbox routes go
// through Forward as api.Handler's do; what is not forwarded answers
// "local"; errors answer as api does.
func front(t *testing.T, rt *Router) *httptest.Server {
	t.Helper()
	return frontFor(t, rt, "p1")
}

// frontFor is front for the keys of project projectID.
func frontFor(t *testing.T, rt *Router, projectID string) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	h := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(api.RequestIDHeader, "req-1")
		ok, err := rt.Forward(w, r, projectID, api.RefOf(r))
		if err != nil {
			status, code, msg := api.StatusOf(err)
			api.WriteJSON(w, status, map[string]string{"code": code, "message": msg})
			return
		}
		if !ok {
			w.Write([]byte("local"))
		}
	}
	mux.HandleFunc("/api/sandboxes/{id}/{rest...}", h)
	mux.HandleFunc("/api/sandbox-snapshots/{sid}", h)
	mux.HandleFunc("/api/projects/{pid}/volumes/{vid}", h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// send sends one request (to host, when not "") and returns the answer
// with its body read.
func send(t *testing.T, method, url, host string, header http.Header, body io.Reader) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

func get(t *testing.T, url string) (*http.Response, string) {
	t.Helper()
	return send(t, http.MethodGet, url, "", nil, nil)
}

// twoNodes: a sandbox sbx1 of project p1 lives on b, whose API answers
// with apiH.
func twoNodes(t *testing.T, apiH, proxyH http.Handler) (*fakeCluster, *Router, *httptest.Server) {
	t.Helper()
	b := peer(t, "b", apiH, proxyH, nil)
	fc := &fakeCluster{owners: map[string]store.Owner{"sbx1": {Node: "b", ProjectID: "p1", Status: "running"}},
		nodes: []store.Node{readyNode("a", "127.0.0.1:1"), readyNode("b", addrOf(b))}}
	rt := newTestRouter(t, "a", fc, nil, nil)
	return fc, rt, front(t, rt)
}

func TestForwardRoutesToOwner(t *testing.T) {
	var seen atomic.Value
	fc, _, a := twoNodes(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Store(r.Header.Get(api.RequestIDHeader) + " " + r.Header.Get("X-Api-Key") + " " + fmt.Sprint(Forwarded(r.Context())))
		w.Header().Set(api.RequestIDHeader, "b's own")
		w.Write([]byte("from b " + r.URL.RequestURI()))
	}), nil)

	resp, body := send(t, http.MethodGet, a.URL+"/api/sandboxes/sbx1/files?path=%2Ftmp%2Fa%20b", "", http.Header{"X-Api-Key": {"k1"}}, nil)
	if body != "from b /api/sandboxes/sbx1/files?path=%2Ftmp%2Fa%20b" {
		t.Fatalf("answer %q", body)
	}
	if got := seen.Load(); got != "req-1 k1 true" {
		t.Fatalf("b saw request id, key, forwarded = %q", got)
	}
	if ids := resp.Header.Values(api.RequestIDHeader); len(ids) != 1 || ids[0] != "req-1" {
		t.Fatalf("request ids of the answer: %q", ids)
	}

	// The owner is cached: a second request asks the database no more.
	calls := fc.calls()
	if _, body := get(t, a.URL+"/api/sandboxes/sbx1/metrics"); !strings.HasPrefix(body, "from b") {
		t.Fatalf("second answer %q", body)
	}
	if fc.calls() != calls {
		t.Fatalf("owner asked again within its TTL")
	}
}

func TestForwardLeavesLocalUnknownAndOthersAlone(t *testing.T) {
	fc, _, a := twoNodes(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("b reached for %s", r.URL.Path)
	}), nil)
	fc.set(func(f *fakeCluster) {
		f.owners["here"] = store.Owner{Node: "a", ProjectID: "p1"}
		f.owners["theirs"] = store.Owner{Node: "b", ProjectID: "p2"}
	})
	for _, id := range []string{"here", "theirs", "unknown"} {
		if resp, body := get(t, a.URL+"/api/sandboxes/"+id+"/exec"); resp.StatusCode != 200 || body != "local" {
			t.Errorf("%s: %d %q, want it answered here", id, resp.StatusCode, body)
		}
	}
}

func TestForwardLostSuspectUnreachable(t *testing.T) {
	fc, rt, a := twoNodes(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("from b")) }), nil)

	// Lost with its node: 404 sandbox_lost naming the node.
	fc.set(func(f *fakeCluster) {
		f.owners["gone"] = store.Owner{Node: "c", ProjectID: "p1", Lost: true, Status: store.SandboxLost}
	})
	resp, body := get(t, a.URL+"/api/sandboxes/gone/exec")
	if resp.StatusCode != 404 || !strings.Contains(body, `"code":"sandbox_lost"`) || !strings.Contains(body, `node \"c\"`) {
		t.Fatalf("lost: %d %s", resp.StatusCode, body)
	}

	// The owner's lease lapsed: 503 with Retry-After.
	fc.set(func(f *fakeCluster) { f.nodes[1].State = store.NodeSuspect })
	rt.dropNodes()
	resp, body = get(t, a.URL+"/api/sandboxes/sbx1/exec")
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || !strings.Contains(body, "node_unavailable") {
		t.Fatalf("suspect: %d %q %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}

	// Declared dead since the owner was cached: the row says lost now.
	fc.set(func(f *fakeCluster) {
		f.nodes[1].State = store.NodeDead
		f.owners["sbx1"] = store.Owner{Node: "b", ProjectID: "p1", Lost: true}
	})
	rt.dropNodes()
	resp, body = get(t, a.URL+"/api/sandboxes/sbx1/exec")
	if resp.StatusCode != 404 || !strings.Contains(body, "sandbox_lost") {
		t.Fatalf("dead: %d %s", resp.StatusCode, body)
	}

	// Ready by its lease but not answering: 503 with Retry-After, and the
	// owner is asked again next time.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	fc.set(func(f *fakeCluster) {
		f.nodes[1] = readyNode("b", closed)
		f.owners["sbx1"] = store.Owner{Node: "b", ProjectID: "p1"}
	})
	rt.dropNodes()
	rt.dropOwner("sbx1")
	resp, body = get(t, a.URL+"/api/sandboxes/sbx1/exec")
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || !strings.Contains(body, "node_unavailable") {
		t.Fatalf("unreachable: %d %q %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	calls := fc.calls()
	get(t, a.URL+"/api/sandboxes/sbx1/exec")
	if fc.calls() == calls {
		t.Fatal("the owner of an unreachable node stayed cached")
	}
}

func TestForwardCacheCorrectedOnMiss(t *testing.T) {
	var n atomic.Int64
	fc, _, a := twoNodes(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		http.Error(w, `{"code":"sandbox_not_found"}`, http.StatusNotFound)
	}), nil)
	get(t, a.URL+"/api/sandboxes/sbx1/exec")
	calls := fc.calls()
	get(t, a.URL+"/api/sandboxes/sbx1/exec")
	if fc.calls() != calls+1 || n.Load() != 2 {
		t.Fatalf("after the owner's 404: %d owner lookups (want %d), %d forwards", fc.calls(), calls+1, n.Load())
	}
}

// heldLocal is a node's part that holds sandbox sbx1 while held is set.
type heldLocal struct {
	fakeLocal
	held atomic.Bool
}

func (l *heldLocal) Holds(id string) bool { return id == "sbx1" && l.held.Load() }

// TestForwardOwnerCachedAsSelfLetGo: a sandbox whose owner this node cached
// as itself, and which it let go since (drain --move, taken over by b), is
// sent to b at once, not answered here with a 404 until the entry expires.
func TestForwardOwnerCachedAsSelfLetGo(t *testing.T) {
	b := peer(t, "b", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("from b")) }), nil, nil)
	fc := &fakeCluster{owners: map[string]store.Owner{"sbx1": {Node: "a", ProjectID: "p1", Status: "running"}},
		nodes: []store.Node{readyNode("a", "127.0.0.1:1"), readyNode("b", addrOf(b))}}
	local := &heldLocal{}
	local.held.Store(true)
	rt := NewRouter(RouterConfig{Self: "a", Directory: fc, Store: &fakeRows{}, Signer: newTestSigner(t, "a", testSecret), Local: local,
		Logger: quiet(), OwnerTTL: time.Hour})
	a := front(t, rt)
	if _, body := get(t, a.URL+"/api/sandboxes/sbx1/exec"); body != "local" {
		t.Fatalf("held here: answer %q", body)
	}
	// Held here: the cached owner is used, the database not asked again.
	calls := fc.calls()
	if _, body := get(t, a.URL+"/api/sandboxes/sbx1/exec"); body != "local" || fc.calls() != calls {
		t.Fatalf("held here, cached: answer %q, %d owner lookups (want %d)", body, fc.calls(), calls)
	}
	local.held.Store(false)
	fc.set(func(f *fakeCluster) { f.owners["sbx1"] = store.Owner{Node: "b", ProjectID: "p1", Status: "running"} })
	if _, body := get(t, a.URL+"/api/sandboxes/sbx1/exec"); body != "from b" {
		t.Fatalf("let go and taken over by b: answer %q, want b's", body)
	}
}

// TestForwardResumeAfterReleaseNotToOldOwner: a resume through a node
// that cached the owner before that node let the paused sandbox go (drain
// --move) is placed like a create, not sent to the old owner, which is
// draining and would take the sandbox back.
func TestForwardResumeAfterReleaseNotToOldOwner(t *testing.T) {
	b := peer(t, "b", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("from b")) }), nil, nil)
	c := peer(t, "c", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("from c")) }), nil, nil)
	fc := &fakeCluster{owners: map[string]store.Owner{"sbx1": {Node: "b", ProjectID: "p1", Status: store.SandboxPaused}},
		nodes: []store.Node{readyNode("a", "127.0.0.1:1"), readyNode("b", addrOf(b)), readyNode("c", addrOf(c))}}
	rt := NewRouter(RouterConfig{Self: "a", Directory: fc, Store: &fakeRows{}, Signer: newTestSigner(t, "a", testSecret), Local: &fakeLocal{},
		Logger: quiet(), OwnerTTL: time.Hour, NodesTTL: time.Nanosecond})
	a := front(t, rt)
	if _, body := get(t, a.URL+"/api/sandboxes/sbx1"); body != "from b" {
		t.Fatalf("before the move: answer %q", body)
	}
	fc.set(func(f *fakeCluster) {
		f.nodes[1].Draining = true
		f.owners["sbx1"] = store.Owner{Node: store.Orphan, ProjectID: "p1", Status: store.SandboxPaused}
	})
	for _, path := range []string{"/resume", "/connect"} {
		if _, body := send(t, http.MethodPost, a.URL+"/api/sandboxes/sbx1"+path, "", nil, nil); body != "local" && body != "from c" {
			t.Fatalf("POST %s of the released sandbox: answer %q, want it placed on a or c", path, body)
		}
	}
}

func TestForwardUsesStaleOwnerWhileDatabaseDown(t *testing.T) {
	b := peer(t, "b", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("from b")) }), nil, nil)
	fc := &fakeCluster{owners: map[string]store.Owner{"sbx1": {Node: "b", ProjectID: "p1"}},
		nodes: []store.Node{readyNode("a", "127.0.0.1:1"), readyNode("b", addrOf(b))}}
	rt := NewRouter(RouterConfig{Self: "a", Directory: fc, Store: &fakeRows{}, Signer: newTestSigner(t, "a", testSecret), Local: &fakeLocal{},
		Logger: quiet(), OwnerTTL: time.Nanosecond, NodesTTL: time.Nanosecond})
	a := front(t, rt)
	if _, body := get(t, a.URL+"/api/sandboxes/sbx1/exec"); body != "from b" {
		t.Fatalf("answer %q", body)
	}
	fc.set(func(f *fakeCluster) { f.down = true })
	if _, body := get(t, a.URL+"/api/sandboxes/sbx1/exec"); body != "from b" {
		t.Fatalf("database down: answer %q, want b's from what was known", body)
	}
	// Nothing known of a sandbox: this node answers for what it has.
	if _, body := get(t, a.URL+"/api/sandboxes/other/exec"); body != "local" {
		t.Fatalf("database down, unknown sandbox: %q", body)
	}
}

func TestForwardSnapshotAndVolumeRoutes(t *testing.T) {
	b := peer(t, "b", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("from b")) }), nil, nil)
	fc := &fakeCluster{nodes: []store.Node{readyNode("a", "127.0.0.1:1"), readyNode("b", addrOf(b))}}
	rows := &fakeRows{
		snapshots: []store.Snapshot{{ID: "snap1", ProjectID: "p1", Node: "b"}, {ID: "snap2", ProjectID: "p2", Node: "b"}, {ID: "snap3", ProjectID: "p1", Node: "a"}},
		volumes:   []store.Volume{{ID: "vol1", Name: "data", ProjectID: "p1", Node: "b"}, {ID: "vol2", Name: "data", ProjectID: "p2", Node: "b"}},
	}
	a := front(t, newTestRouter(t, "a", fc, rows, nil))
	for path, want := range map[string]string{
		"/api/sandbox-snapshots/snap1":   "from b",
		"/api/sandbox-snapshots/snap2":   "local", // another project's
		"/api/sandbox-snapshots/snap3":   "local",
		"/api/sandbox-snapshots/none":    "local",
		"/api/projects/p1/volumes/vol1":  "from b",
		"/api/projects/p1/volumes/data":  "from b", // by name
		"/api/projects/p1/volumes/vol2":  "local",
		"/api/projects/p1/volumes/other": "local",
	} {
		if _, body := get(t, a.URL+path); body != want {
			t.Errorf("%s: %q, want %q", path, body, want)
		}
	}
}

// TestForwardSSEStreams: each event reaches the client while the owner
// still holds the stream open (the next one is written only after the
// client has read the first).
func TestForwardSSEStreams(t *testing.T) {
	next := make(chan struct{})
	_, _, a := twoNodes(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: one\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-next:
		case <-r.Context().Done():
			return
		}
		fmt.Fprint(w, "data: two\n\n")
	}), nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, a.URL+"/api/sandboxes/sbx1/exec", strings.NewReader(`{"cmd":"x"}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	line, err := rd.ReadString('\n')
	if err != nil || line != "data: one\n" {
		t.Fatalf("first event: %q, %v (held in a buffer?)", line, err)
	}
	close(next)
	rest, err := io.ReadAll(rd)
	if err != nil || string(rest) != "\ndata: two\n\n" {
		t.Fatalf("rest: %q, %v", rest, err)
	}
}

// pattern is a deterministic stream of n bytes.
type pattern struct{ off, n int64 }

func (p *pattern) Read(b []byte) (int, error) {
	if p.off >= p.n {
		return 0, io.EOF
	}
	b = b[:min(int64(len(b)), p.n-p.off)]
	for i := range b {
		x := p.off + int64(i)
		b[i] = byte(x ^ x>>8 ^ x>>16)
	}
	p.off += int64(len(b))
	return len(b), nil
}

func sumOf(r io.Reader) (string, int64) {
	h := sha256.New()
	n, _ := io.Copy(h, r)
	return hex.EncodeToString(h.Sum(nil)), n
}

// TestForwardLargeBodies: 100 MiB up and down through the forwarder
// arrive whole, and the forwarder holds neither in memory (what the
// process allocates meanwhile is a fraction of it).
func TestForwardLargeBodies(t *testing.T) {
	const size = 100 << 20
	_, _, a := twoNodes(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodPost:
			sum, n := sumOf(r.Body)
			fmt.Fprintf(w, "%s %d", sum, n)
		case http.MethodGet:
			w.Header().Set("Content-Type", "application/octet-stream")
			io.Copy(w, &pattern{n: size})
		}
	}), nil)
	want, _ := sumOf(&pattern{n: size})

	allocated := func() uint64 {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.TotalAlloc
	}
	before := allocated()
	resp, err := http.Post(a.URL+"/api/sandboxes/sbx1/files?path=/big", "application/octet-stream", &pattern{n: size})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(got) != fmt.Sprintf("%s %d", want, size) {
		t.Fatalf("upload: owner read %q, want %s %d", got, want, size)
	}
	resp, err = http.Get(a.URL + "/api/sandboxes/sbx1/files?path=/big")
	if err != nil {
		t.Fatal(err)
	}
	sum, n := sumOf(resp.Body)
	resp.Body.Close()
	if sum != want || n != size {
		t.Fatalf("download: %d bytes, sum %s, want %d %s", n, sum, size, want)
	}
	if alloc := allocated() - before; alloc > size/4 {
		t.Fatalf("200 MiB through the forwarder allocated %d MiB: bodies are buffered", alloc>>20)
	}
}

// echoWebSocket accepts a WebSocket and answers each message with prefix
// and the message.
func echoWebSocket(w http.ResponseWriter, r *http.Request, prefix string) {
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer c.CloseNow()
	for {
		typ, b, err := c.Read(r.Context())
		if err != nil {
			return
		}
		if err := c.Write(r.Context(), typ, append([]byte(prefix), b...)); err != nil {
			return
		}
	}
}

func TestForwardWebSocket(t *testing.T) {
	_, _, a := twoNodes(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { echoWebSocket(w, r, "echo ") }), nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(a.URL, "http")+"/api/sandboxes/sbx1/terminal", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	for _, msg := range []string{"ls\n", "exit\n"} {
		if err := c.Write(ctx, websocket.MessageBinary, []byte(msg)); err != nil {
			t.Fatal(err)
		}
		_, b, err := c.Read(ctx)
		if err != nil || string(b) != "echo "+msg {
			t.Fatalf("echo of %q: %q, %v", msg, b, err)
		}
	}
	c.Close(websocket.StatusNormalClosure, "")
}

func TestForwardedIsNotForwardedAgain(t *testing.T) {
	fc, rt, _ := twoNodes(t, nil, nil)
	_ = fc
	r := httptest.NewRequest(http.MethodGet, "/api/sandboxes/sbx1/exec", nil)
	r = r.WithContext(context.WithValue(r.Context(), forwardedKey{}, "c"))
	if ok, err := rt.Forward(httptest.NewRecorder(), r, "p1", api.Ref{Kind: api.RefSandbox, ID: "sbx1"}); ok || err != nil {
		t.Fatalf("a forwarded request was forwarded again: %v %v", ok, err)
	}
	if _, ok := rt.ForwardPreview(httptest.NewRecorder(), r, "sbx1"); ok {
		t.Fatal("a forwarded preview was forwarded again")
	}
}

func TestListsMergeNodes(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	sb := func(id string, at int, node string) api.NodeSandbox {
		return api.NodeSandbox{Node: node, Record: sandbox.Record{ID: id, StartedAt: t0.Add(time.Duration(at) * time.Second), AgentToken: "secret-" + id, Envs: map[string]string{"K": "secret"}}}
	}
	bLocal := &fakeLocal{sandboxes: []api.NodeSandbox{sb("s2", 2, "b"), sb("s4", 4, "b")},
		snapshots: []snapshot.Info{{Snapshot: snapshot.Snapshot{ID: "sn-b", CreatedAt: t0.Add(time.Second), Saved: sandbox.Saved{AgentToken: "secret"}}}},
		volumes:   []volume.Volume{{ID: "v-b", CreatedAt: t0.Add(3 * time.Second)}}}
	b := peer(t, "b", nil, nil, bLocal)
	aLocal := &fakeLocal{sandboxes: []api.NodeSandbox{sb("s1", 1, "a"), sb("s3", 3, "a")},
		snapshots: []snapshot.Info{{Snapshot: snapshot.Snapshot{ID: "sn-a", CreatedAt: t0.Add(2 * time.Second)}}},
		volumes:   []volume.Volume{{ID: "v-a", CreatedAt: t0.Add(time.Second)}}}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	silent := ln.Addr().String()
	ln.Close()
	fc := &fakeCluster{nodes: []store.Node{readyNode("a", "127.0.0.1:1"), readyNode("b", addrOf(b)), readyNode("c", silent),
		{NodeInfo: store.NodeInfo{Name: "d", Address: "127.0.0.1:2"}, State: store.NodeDead}}}
	rt := newTestRouter(t, "a", fc, nil, aLocal)

	sbs, err := rt.Sandboxes(context.Background(), "p1")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range sbs {
		got = append(got, s.Node+"/"+s.Record.ID)
		if s.Node == "b" && (s.Record.AgentToken != "" || s.Record.Envs != nil) {
			t.Errorf("%s came with its secrets", s.Record.ID)
		}
	}
	if strings.Join(got, " ") != "a/s1 b/s2 a/s3 b/s4" {
		t.Fatalf("sandboxes: %v (c, silent, left out; d, dead, not asked)", got)
	}
	sns, err := rt.Snapshots(context.Background(), "p1")
	if err != nil || len(sns) != 2 || sns[0].ID != "sn-b" || sns[1].ID != "sn-a" || sns[0].AgentToken != "" {
		t.Fatalf("snapshots: %+v, %v", sns, err)
	}
	vs, err := rt.Volumes(context.Background(), "p1")
	if err != nil || len(vs) != 2 || vs[0].ID != "v-a" || vs[1].ID != "v-b" {
		t.Fatalf("volumes: %+v, %v", vs, err)
	}

	// The database is down: this node's part.
	fc.set(func(f *fakeCluster) { f.down = true })
	rt.dropNodes()
	rt.nodeSet = nil
	sbs, err = rt.Sandboxes(context.Background(), "p1")
	if err != nil || len(sbs) != 2 {
		t.Fatalf("database down: %d sandboxes, %v", len(sbs), err)
	}
}

func TestInternalListsOverHTTPDecode(t *testing.T) {
	// The JSON of a sandbox survives the hop.
	rec := sandbox.Record{ID: "s1", ProjectID: "p1", Template: "base", Status: "running", Metadata: map[string]string{"a": "b"}, E2B: true}
	u := usage.Sample{DiskTotal: 5 << 30}
	b := peer(t, "b", nil, nil, &fakeLocal{sandboxes: []api.NodeSandbox{{Node: "b", Record: rec, Usage: &u}}})
	rt := newTestRouter(t, "a", &fakeCluster{nodes: []store.Node{readyNode("b", addrOf(b))}}, nil, nil)
	var part []api.NodeSandbox
	if err := rt.internalCall(context.Background(), http.MethodGet, readyNode("b", addrOf(b)), "/internal/v1/sandboxes?project=p1", listTimeout, &part); err != nil {
		t.Fatal(err)
	}
	want, _ := json.Marshal([]api.NodeSandbox{{Node: "b", Record: rec, Usage: &u}})
	got, _ := json.Marshal(part)
	if string(got) != string(want) {
		t.Fatalf("got %s\nwant %s", got, want)
	}
}

// slowNodes answers Nodes with the list as it was when the call began,
// after release is closed: a read in flight while the list changes.
type slowNodes struct {
	*fakeCluster
	release chan struct{}
}

func (s *slowNodes) Nodes(ctx context.Context) ([]store.Node, error) {
	ns, err := s.fakeCluster.Nodes(ctx)
	<-s.release
	return ns, err
}

// TestNodesCachedFromReadStart: a list of nodes read while a node was
// being drained is not kept for NodesTTL after the read returned: its age
// counts from the read's start, so a read slower than NodesTTL is
// followed by a fresh one (a drain is seen at most NodesTTL after it).
func TestNodesCachedFromReadStart(t *testing.T) {
	fc := &fakeCluster{nodes: []store.Node{readyNode("a", "127.0.0.1:1"), readyNode("b", "127.0.0.1:2")}}
	dir := &slowNodes{fakeCluster: fc, release: make(chan struct{})}
	const ttl = 100 * time.Millisecond
	rt := NewRouter(RouterConfig{Self: "a", Directory: dir, Store: &fakeRows{}, Signer: newTestSigner(t, "a", testSecret), Local: &fakeLocal{},
		Logger: quiet(), NodesTTL: ttl})
	type answer struct {
		ns  []store.Node
		err error
	}
	first := make(chan answer, 1)
	go func() {
		ns, err := rt.nodes(context.Background())
		first <- answer{ns, err}
	}()
	time.Sleep(ttl / 2)
	fc.set(func(f *fakeCluster) { f.nodes[1].Draining = true })
	time.Sleep(ttl) // the read takes longer than NodesTTL
	close(dir.release)
	if a := <-first; a.err != nil || a.ns[1].Draining {
		t.Fatalf("the read begun before the drain: err %v, b draining %v", a.err, a.err == nil && a.ns[1].Draining)
	}
	ns, err := rt.nodes(context.Background())
	if err != nil || !ns[1].Draining {
		t.Fatalf("the next call, %s after the drain: err %v, b draining %v; want true", ttl, err, err == nil && ns[1].Draining)
	}
}
