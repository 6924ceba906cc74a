package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/lizard-build/lizard/internal/api"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
)

// resumingPeer is node name's internal listener whose Resume hook records
// the ids it is asked for and answers with err.
func resumingPeer(t *testing.T, name string, err error, got *atomic.Value) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(InternalHandler(InternalConfig{Signer: newTestSigner(t, name, testSecret), Local: &fakeLocal{}, Logger: quiet(),
		Resume: func(_ context.Context, id string) error {
			got.Store(name + ":" + id)
			return err
		}}))
	t.Cleanup(srv.Close)
	return srv
}

// TestResumeElsewhere: a released sandbox goes to another ready node of
// this node's runsc build that holds its template; a node that answers
// 503 is skipped; draining, other builds and this node are never asked.
func TestResumeElsewhere(t *testing.T) {
	var got atomic.Value
	full := resumingPeer(t, "b", fmt.Errorf("node full: %w", errdefs.ErrCapacity), &got)
	c := resumingPeer(t, "c", nil, &got)
	other := resumingPeer(t, "d", nil, &got)
	draining := resumingPeer(t, "e", nil, &got)
	withBuild := func(n store.Node, build string) store.Node {
		n.RunscBuild, n.Templates = build, []string{"base"}
		return n
	}
	e := withBuild(readyNode("e", addrOf(draining)), "r1")
	e.Draining, e.State = true, store.NodeDraining
	fc := &fakeCluster{owners: map[string]store.Owner{
		"sbx1": {Node: store.Orphan, ProjectID: "p1", Status: store.SandboxPaused, Template: "base"},
		"sbx2": {Node: "a", ProjectID: "p1", Status: "running", Template: "base"},
	}, nodes: []store.Node{withBuild(readyNode("a", "127.0.0.1:1"), "r1"), withBuild(readyNode("b", addrOf(full)), "r1"),
		withBuild(readyNode("c", addrOf(c)), "r1"), withBuild(readyNode("d", addrOf(other)), "r2"), e}}
	rt := newTestRouter(t, "a", fc, nil, nil)
	for range 5 {
		got.Store("")
		if err := rt.ResumeElsewhere(context.Background(), "sbx1"); err != nil {
			t.Fatalf("resume elsewhere: %v", err)
		}
		if g := got.Load(); g != "c:sbx1" {
			t.Fatalf("last asked %q, want c:sbx1 (b is full, d of another build, e draining)", g)
		}
	}
	if err := rt.ResumeElsewhere(context.Background(), "sbx2"); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("resume elsewhere of a sandbox that is not orphaned: %v, want ErrConflict", err)
	}
	// Nobody else of the build: a capacity error naming the build.
	fc.set(func(f *fakeCluster) { f.nodes = f.nodes[:1] })
	rt.dropNodes()
	if err := rt.ResumeElsewhere(context.Background(), "sbx1"); !errors.Is(err, errdefs.ErrCapacity) || !strings.Contains(err.Error(), "r1") {
		t.Fatalf("resume elsewhere with no other node: %v, want ErrCapacity naming the build", err)
	}
}

// TestInternalResumeNeedsSignature: POST /internal/v1/resume/{id} reaches
// the hook only signed.
func TestInternalResumeNeedsSignature(t *testing.T) {
	var got atomic.Value
	got.Store("")
	srv := resumingPeer(t, "b", nil, &got)
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/internal/v1/resume/sbx1", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || got.Load() != "" {
		t.Fatalf("unsigned resume: %d, hook saw %q", resp.StatusCode, got.Load())
	}
	req, _ = http.NewRequest(http.MethodPost, srv.URL+"/internal/v1/resume/sbx1", nil)
	newTestSigner(t, "a", testSecret).sign(req, kindInternal)
	if resp, err = http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || got.Load() != "b:sbx1" {
		t.Fatalf("signed resume: %d, hook saw %q", resp.StatusCode, got.Load())
	}
}

// TestForwardPlacesOrphanResume: a POST on an orphaned sandbox goes to the
// node placement chooses (not this draining one); a GET stays here.
func TestForwardPlacesOrphanResume(t *testing.T) {
	var seen atomic.Value
	b := peer(t, "b", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Store(r.Method + " " + r.URL.Path)
		w.Write([]byte("from b"))
	}), nil, nil)
	self := readyNode("a", "127.0.0.1:1")
	self.Draining, self.State = true, store.NodeDraining
	fc := &fakeCluster{owners: map[string]store.Owner{"sbx1": {Node: store.Orphan, ProjectID: "p1", Status: store.SandboxPaused, Template: "base"}},
		nodes: []store.Node{self, readyNode("b", addrOf(b))}}
	a := front(t, newTestRouter(t, "a", fc, nil, nil))
	if _, body := send(t, http.MethodPost, a.URL+"/api/sandboxes/sbx1/resume", "", nil, nil); body != "from b" || seen.Load() != "POST /api/sandboxes/sbx1/resume" {
		t.Fatalf("resume of an orphan: %q, b saw %v", body, seen.Load())
	}
	if _, body := get(t, a.URL+"/api/sandboxes/sbx1"); body != "local" {
		t.Fatalf("get of an orphan: %q, want it answered here", body)
	}
	// b took it over: the next request goes there at once (an orphan is
	// never cached).
	fc.set(func(f *fakeCluster) {
		f.owners["sbx1"] = store.Owner{Node: "b", ProjectID: "p1", Status: "running", Template: "base"}
	})
	if _, body := get(t, a.URL+"/api/sandboxes/sbx1"); body != "from b" {
		t.Fatalf("get right after the take-over: %q, want it forwarded to b", body)
	}
}

// TestForwardFollowsMovedSandbox: the cached owner answers 404 (the
// sandbox moved away within the cache's time): the request, body and all,
// goes on to the owner the database names now, and the client sees only
// that answer.
func TestForwardFollowsMovedSandbox(t *testing.T) {
	var gotBody atomic.Value
	b := peer(t, "b", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/api/sandboxes/sbx1/files":
			http.Error(w, "no such file", http.StatusNotFound) // a 404 of the sandbox's own
			return
		case "/api/sandboxes/sbx1/metrics":
			w.Write([]byte("from b")) // b held it a moment ago
			return
		}
		w.Header().Set(api.SandboxMissingHeader, "1")
		http.Error(w, `{"code":"sandbox_not_found"}`, http.StatusNotFound)
	}), nil, nil)
	c := peer(t, "c", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		gotBody.Store(string(body))
		w.Write([]byte("from c"))
		w.(http.Flusher).Flush() // streamed, as an exec's output is: nothing may follow it

	}), nil, nil)
	fc := &fakeCluster{owners: map[string]store.Owner{"sbx1": {Node: "b", ProjectID: "p1", Status: "running"}},
		nodes: []store.Node{readyNode("a", "127.0.0.1:1"), readyNode("b", addrOf(b)), readyNode("c", addrOf(c))}}
	a := front(t, newTestRouter(t, "a", fc, nil, nil))
	// b has it no more and the database still says b: answered here (as
	// an unknown sandbox is).
	if _, body := get(t, a.URL+"/api/sandboxes/sbx1"); body != "local" {
		t.Fatalf("404 from the owner the database names: %q, want it answered here", body)
	}
	// A 404 about something inside the sandbox is the client's answer.
	if resp, body := get(t, a.URL+"/api/sandboxes/sbx1/files"); resp.StatusCode != http.StatusNotFound || body != "no such file\n" {
		t.Fatalf("a file missing in the sandbox: %d %q", resp.StatusCode, body)
	}
	// Cached as b (b answered); it moves to c.
	if _, body := get(t, a.URL+"/api/sandboxes/sbx1/metrics"); body != "from b" {
		t.Fatalf("while b holds it: %q", body)
	}
	calls := fc.calls()
	fc.set(func(f *fakeCluster) { f.owners["sbx1"] = store.Owner{Node: "c", ProjectID: "p1", Status: "running"} })
	resp, body := send(t, http.MethodPost, a.URL+"/api/sandboxes/sbx1/exec", "", nil, strings.NewReader(`{"cmd":"true"}`))
	if resp.StatusCode != http.StatusOK || body != "from c" || gotBody.Load() != `{"cmd":"true"}` {
		t.Fatalf("after the move: %d %q, c got %v", resp.StatusCode, body, gotBody.Load())
	}
	if fc.calls() != calls+1 {
		t.Fatalf("the owner was read %d times after the move, want once (the request went to the cached b first)", fc.calls()-calls)
	}
}
