package cluster

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/lizard-build/lizard/internal/api"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
)

func node(name string, state string, vcpus, reserved float64, templates ...string) store.Node {
	return store.Node{NodeInfo: store.NodeInfo{Name: name, VCPUs: vcpus, MemoryMB: 1000, Templates: templates},
		State: state, ReservedVCPUs: reserved}
}

func names(ns []store.Node) string {
	var out []string
	for _, n := range ns {
		out = append(out, n.Name)
	}
	return strings.Join(out, " ")
}

func TestPlaceFilters(t *testing.T) {
	draining := node("drain", store.NodeReady, 10, 0, "base")
	draining.Draining = true
	nodes := []store.Node{
		node("ready", store.NodeReady, 10, 0, "base", "p1/mine"),
		node("suspect", store.NodeSuspect, 10, 0, "base", "p1/mine"),
		node("dead", store.NodeDead, 10, 0, "base", "p1/mine"),
		node("removed", store.NodeRemoved, 10, 0, "base", "p1/mine"),
		draining,
		node("other", store.NodeReady, 10, 0, "base"),
		node("python", store.NodeReady, 10, 0, "base", "python"),
	}
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rnd := rand.New(rand.NewPCG(seed, 1))
	for _, tc := range []struct {
		want Want
		got  string // as a set, sorted by name
	}{
		{Want{ProjectID: "p1", Template: "mine"}, "ready"},
		{Want{ProjectID: "p2", Template: "mine"}, "other python ready"}, // nobody holds p2's: every ready node
		{Want{ProjectID: "p1", Template: "base"}, "other python ready"},
		{Want{ProjectID: "p1"}, "other python ready"},
		{Want{ProjectID: "p1", Template: "nope"}, "other python ready"}, // a name nobody lists: the node chosen says so
		{Want{ProjectID: "p1", Template: "python312"}, "python"},        // an alias of a built-in
	} {
		got := strings.Fields(names(Place(nodes, tc.want, rnd)))
		slices.Sort(got)
		if strings.Join(got, " ") != tc.got {
			t.Errorf("%+v: %v, want %s", tc.want, got, tc.got)
		}
	}
	if got := Place([]store.Node{nodes[1], nodes[2], draining}, Want{}, rnd); got != nil {
		t.Errorf("no ready node: %v", names(got))
	}
}

func TestFree(t *testing.T) {
	for _, tc := range []struct {
		n    store.Node
		want float64
	}{
		{store.Node{}, 1}, // no limits
		{store.Node{NodeInfo: store.NodeInfo{VCPUs: 8, MemoryMB: 1000}, ReservedVCPUs: 2, ReservedMemoryMB: 500}, 0.5},
		{store.Node{NodeInfo: store.NodeInfo{VCPUs: 8, MemoryMB: 1000}, ReservedVCPUs: 6, ReservedMemoryMB: 100}, 0.25},
		{store.Node{NodeInfo: store.NodeInfo{VCPUs: 8, MaxSandboxes: 10}, Sandboxes: 9}, 0.1},
		{store.Node{NodeInfo: store.NodeInfo{VCPUs: 8}, ReservedVCPUs: 10}, -0.25},
	} {
		if got := free(tc.n); fmt.Sprintf("%.3f", got) != fmt.Sprintf("%.3f", tc.want) {
			t.Errorf("free(%+v) = %v, want %v", tc.n, got, tc.want)
		}
	}
}

// TestPlaceBestOfK: of the two sampled, the freer comes first; over many
// draws the freest node wins most and the fullest never comes first
// (it is never the freer of two).
func TestPlaceBestOfK(t *testing.T) {
	nodes := []store.Node{
		node("empty", store.NodeReady, 10, 0),
		node("half", store.NodeReady, 10, 5),
		node("full", store.NodeReady, 10, 10),
	}
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rnd := rand.New(rand.NewPCG(seed, 2))
	first := map[string]int{}
	for range 300 {
		order := Place(append([]store.Node(nil), nodes...), Want{}, rnd)
		if len(order) != 3 {
			t.Fatalf("order %s", names(order))
		}
		if free(order[0]) < free(order[1]) {
			t.Fatalf("sampled pair out of order: %s", names(order))
		}
		first[order[0].Name]++
	}
	if first["full"] != 0 || first["empty"] <= first["half"] {
		t.Fatalf("first choices %v", first)
	}
	// With one candidate, it is the choice.
	if got := names(Place(nodes[:1], Want{}, rnd)); got != "empty" {
		t.Fatalf("one node: %s", got)
	}
}

// createFront is node a's create route: rt.Create with local() counting
// and answering as told.
func createFront(t *testing.T, rt *Router, want api.Placement, localErr error) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var locals atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			t.Error(err)
		}
		err = rt.Create(w, r, "p1", want, body, func() error {
			locals.Add(1)
			if localErr != nil {
				return localErr
			}
			w.WriteHeader(http.StatusCreated)
			w.Write([]byte("created on a"))
			return nil
		})
		if err != nil {
			status, code, _ := api.StatusOf(err)
			w.WriteHeader(status)
			w.Write([]byte(code))
		}
	}))
	t.Cleanup(srv.Close)
	return srv, &locals
}

// creator is a peer whose create answers status with body, counting.
func creator(t *testing.T, name string, status int, body string) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var n atomic.Int64
	return peer(t, name, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		b, _ := io.ReadAll(r.Body)
		if string(b) != `{"template":"base"}` || r.Header.Get("X-Api-Key") != "k1" || !Forwarded(r.Context()) {
			t.Errorf("%s got body %q key %q forwarded %v", name, b, r.Header.Get("X-Api-Key"), Forwarded(r.Context()))
		}
		w.WriteHeader(status)
		fmt.Fprint(w, body)
	}), nil, nil), &n
}

func post(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, body := send(t, http.MethodPost, url+"/api/sandboxes", "", http.Header{"X-Api-Key": {"k1"}}, strings.NewReader(`{"template":"base"}`))
	return resp.StatusCode, body
}

func TestCreateSkipsRefusingNodes(t *testing.T) {
	full, nFull := creator(t, "b", http.StatusServiceUnavailable, `{"code":"capacity"}`)
	ok, nOK := creator(t, "c", http.StatusCreated, `{"sandboxId":"on-c"}`)
	self := node("a", store.NodeReady, 10, 10) // the fullest: tried last
	self.Draining = true                       // not at all
	b, c := node("b", store.NodeReady, 10, 0), node("c", store.NodeReady, 10, 5)
	b.Address, c.Address = addrOf(full), addrOf(ok)
	fc := &fakeCluster{nodes: []store.Node{self, b, c}}
	rt := newTestRouter(t, "a", fc, nil, nil)
	a, locals := createFront(t, rt, api.Placement{Template: "base"}, nil)

	status, body := post(t, a.URL)
	if status != http.StatusCreated || body != `{"sandboxId":"on-c"}` || nFull.Load() != 1 || nOK.Load() != 1 || locals.Load() != 0 {
		t.Fatalf("%d %q; b tried %d, c %d, a %d", status, body, nFull.Load(), nOK.Load(), locals.Load())
	}

	// b unreachable: c.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	b.Address = ln.Addr().String()
	ln.Close()
	fc.set(func(f *fakeCluster) { f.nodes = []store.Node{self, b, c} })
	rt.dropNodes()
	if status, body := post(t, a.URL); status != http.StatusCreated || body != `{"sandboxId":"on-c"}` {
		t.Fatalf("b unreachable: %d %q", status, body)
	}

	// Every node refuses: the last refusal is the answer.
	b.Address = addrOf(full)
	c.Address = addrOf(full)
	fc.set(func(f *fakeCluster) { f.nodes = []store.Node{self, b, c} })
	rt.dropNodes()
	if status, body := post(t, a.URL); status != http.StatusServiceUnavailable || body != `{"code":"capacity"}` {
		t.Fatalf("all full: %d %q", status, body)
	}
}

func TestCreateRelaysOtherAnswers(t *testing.T) {
	quota, nQuota := creator(t, "b", http.StatusTooManyRequests, `{"code":"quota_exceeded"}`)
	other, nOther := creator(t, "c", http.StatusCreated, `{}`)
	b, c := node("b", store.NodeReady, 10, 0), node("c", store.NodeReady, 10, 9)
	b.Address, c.Address = addrOf(quota), addrOf(other)
	rt := newTestRouter(t, "a", &fakeCluster{nodes: []store.Node{b, c}}, nil, nil)
	a, _ := createFront(t, rt, api.Placement{Template: "base"}, nil)
	if status, body := post(t, a.URL); status != http.StatusTooManyRequests || body != `{"code":"quota_exceeded"}` || nQuota.Load() != 1 || nOther.Load() != 0 {
		t.Fatalf("%d %q, b %d, c %d", status, body, nQuota.Load(), nOther.Load())
	}
}

func TestCreateLocal(t *testing.T) {
	ok, nOK := creator(t, "b", http.StatusCreated, `{"sandboxId":"on-b"}`)
	self := node("a", store.NodeReady, 10, 0)
	b := node("b", store.NodeReady, 10, 9)
	b.Address = addrOf(ok)
	fc := &fakeCluster{nodes: []store.Node{self, b}}

	// This node is the freer of the two: made here.
	rt := newTestRouter(t, "a", fc, nil, nil)
	a, locals := createFront(t, rt, api.Placement{Template: "base"}, nil)
	if status, body := post(t, a.URL); status != http.StatusCreated || body != "created on a" || locals.Load() != 1 || nOK.Load() != 0 {
		t.Fatalf("%d %q", status, body)
	}

	// This node has no room: b.
	a, locals = createFront(t, rt, api.Placement{Template: "base"}, fmt.Errorf("node full: %w", errdefs.ErrCapacity))
	if status, body := post(t, a.URL); status != http.StatusCreated || body != `{"sandboxId":"on-b"}` || locals.Load() != 1 || nOK.Load() != 1 {
		t.Fatalf("a full: %d %q", status, body)
	}

	// Another error of this node's is the answer.
	a, _ = createFront(t, rt, api.Placement{Template: "base"}, fmt.Errorf("template %q: %w", "nope", errdefs.ErrNotFound))
	if status, body := post(t, a.URL); status != http.StatusNotFound || body != "not_found" || nOK.Load() != 1 {
		t.Fatalf("a not found: %d %q", status, body)
	}
}

func TestCreateAffinity(t *testing.T) {
	holder, nHolder := creator(t, "b", http.StatusCreated, `{"sandboxId":"on-b"}`)
	free, nFree := creator(t, "c", http.StatusCreated, `{"sandboxId":"on-c"}`)
	b, c := node("b", store.NodeReady, 10, 9), node("c", store.NodeReady, 10, 0)
	b.Address, c.Address = addrOf(holder), addrOf(free)
	b.Draining = true // a pinned create still goes there: the data is nowhere else
	rows := &fakeRows{
		snapshots: []store.Snapshot{{ID: "snap1", ProjectID: "p1", Node: "b"}, {ID: "mine", ProjectID: "p1", Node: "a"}},
		volumes:   []store.Volume{{ID: "vol1", Name: "data", ProjectID: "p1", Node: "b"}},
	}
	fc := &fakeCluster{nodes: []store.Node{node("a", store.NodeReady, 10, 10), b, c}}
	rt := newTestRouter(t, "a", fc, rows, nil)
	for _, want := range []api.Placement{{Snapshot: "snap1"}, {Template: "base", Volume: "data"}, {Template: "base", Volume: "vol1"}} {
		a, locals := createFront(t, rt, want, nil)
		if status, body := post(t, a.URL); status != http.StatusCreated || body != `{"sandboxId":"on-b"}` || locals.Load() != 0 {
			t.Errorf("%+v: %d %q", want, status, body)
		}
	}
	if nHolder.Load() != 3 || nFree.Load() != 0 {
		t.Fatalf("b made %d, c %d", nHolder.Load(), nFree.Load())
	}
	// Here, or unknown (the local create answers 404): local.
	for _, want := range []api.Placement{{Snapshot: "mine"}, {Snapshot: "nope"}, {Template: "base", Volume: "nope"}} {
		a, locals := createFront(t, rt, want, nil)
		if status, body := post(t, a.URL); status != http.StatusCreated || body != "created on a" || locals.Load() != 1 {
			t.Errorf("%+v: %d %q", want, status, body)
		}
	}
	// The holder's lease lapsed: 503, retry later.
	fc.set(func(f *fakeCluster) { f.nodes[1].State = store.NodeSuspect })
	rt.dropNodes()
	a, _ := createFront(t, rt, api.Placement{Snapshot: "snap1"}, nil)
	if status, body := post(t, a.URL); status != http.StatusServiceUnavailable || body != "node_unavailable" {
		t.Fatalf("holder suspect: %d %q", status, body)
	}
}

// TestGone: a node is gone when declared dead, removed or unknown; ready,
// draining and suspect ones are not.
func TestGone(t *testing.T) {
	var nodes []store.Node
	for name, state := range map[string]string{"r": store.NodeReady, "s": store.NodeSuspect, "dr": store.NodeDraining, "d": store.NodeDead, "x": store.NodeRemoved} {
		nodes = append(nodes, store.Node{NodeInfo: store.NodeInfo{Name: name}, State: state})
	}
	for name, want := range map[string]bool{"r": false, "s": false, "dr": false, "d": true, "x": true, "unknown": true} {
		if got := Gone(nodes, name); got != want {
			t.Errorf("Gone(%q) = %v, want %v", name, got, want)
		}
	}
}

// TestPlaceNear: the node holding the data is always sampled and counts
// LocalityWeight freer: it wins unless another is that much freer.
func TestPlaceNear(t *testing.T) {
	rnd := rand.New(rand.NewPCG(rand.Uint64(), 3))
	for _, c := range []struct {
		nearReserved float64
		want         string
	}{
		{4, "near"},  // 0.6 + 0.25 beats the other's 0.8
		{7, "other"}, // 0.3 + 0.25 loses to 0.8
	} {
		// K others: both are always sampled beside near.
		nodes := []store.Node{
			node("near", store.NodeReady, 10, c.nearReserved),
			node("other", store.NodeReady, 10, 2),
			node("busy", store.NodeReady, 10, 9),
		}
		for range 100 {
			if order := Place(slices.Clone(nodes), Want{Near: "near"}, rnd); order[0].Name != c.want {
				t.Fatalf("near reserved %v: order %s, want %s first", c.nearReserved, names(order), c.want)
			}
		}
	}
}

// TestRestoreSpreads: restores of a durable snapshot go to a freer node
// of its runsc build than the snapshot's own when it is crowded; to the
// snapshot's node while it keeps a warm copy; a snapshot that is not
// durable (its image only there) or holds a volume stays pinned.
func TestRestoreSpreads(t *testing.T) {
	holder, nHolder := creator(t, "b", http.StatusCreated, `{"sandboxId":"on-b"}`)
	free, nFree := creator(t, "c", http.StatusCreated, `{"sandboxId":"on-c"}`)
	other, nOther := creator(t, "d", http.StatusCreated, `{"sandboxId":"on-d"}`)
	b, c, d := node("b", store.NodeReady, 10, 8), node("c", store.NodeReady, 10, 0), node("d", store.NodeReady, 10, 0)
	b.Address, c.Address, d.Address = addrOf(holder), addrOf(free), addrOf(other)
	b.RunscBuild, c.RunscBuild, d.RunscBuild = "build1", "build1", "build2"
	a := node("a", store.NodeReady, 10, 10) // this node, full
	a.RunscBuild = "build1"
	durable := []byte(`{"durableAt":"2026-12-01T00:00:00Z"}`)
	rows := &fakeRows{snapshots: []store.Snapshot{
		{ID: "durable", ProjectID: "p1", Node: "b", Spec: durable},
		{ID: "local", ProjectID: "p1", Node: "b", Spec: []byte(`{}`)},
		{ID: "withvol", ProjectID: "p1", Node: "b", Spec: []byte(`{"durableAt":"2026-12-01T00:00:00Z","volumeId":"v1"}`)},
	}}
	fc := &fakeCluster{nodes: []store.Node{a, b, c, d}}
	rt := newTestRouter(t, "a", fc, rows, nil)
	restore := func(snap string) string {
		front, locals := createFront(t, rt, api.Placement{Snapshot: snap}, nil)
		status, body := post(t, front.URL)
		if status != http.StatusCreated || locals.Load() != 0 {
			t.Fatalf("restore %s: %d %q (local %d)", snap, status, body, locals.Load())
		}
		return body
	}
	for range 6 {
		if got := restore("durable"); got != `{"sandboxId":"on-c"}` {
			t.Fatalf("restore of a durable snapshot of a crowded node: %s, want c (free, same build; d runs another build)", got)
		}
	}
	for _, snap := range []string{"local", "withvol"} {
		if got := restore(snap); got != `{"sandboxId":"on-b"}` {
			t.Fatalf("restore of %s: %s, want b (pinned)", snap, got)
		}
	}
	// A warm copy on the snapshot's node is taken there.
	fc.set(func(f *fakeCluster) {
		f.rows = map[string][]store.Sandbox{"b": {{ID: "w1", Status: statusPooled, Spec: []byte(`{"poolOf":"durable"}`)}}}
	})
	if got := restore("durable"); got != `{"sandboxId":"on-b"}` {
		t.Fatalf("restore with a warm copy on b: %s", got)
	}
	if nFree.Load() != 6 || nHolder.Load() != 3 || nOther.Load() != 0 {
		t.Fatalf("b made %d, c %d, d %d", nHolder.Load(), nFree.Load(), nOther.Load())
	}
}
