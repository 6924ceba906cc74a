package cluster

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/store/postgres"
	"github.com/lizard-build/lizard/internal/store/postgres/pgtest"
)

// TestRouterOnPostgres routes by the real store's answers: a sandbox row
// of node b is forwarded to b's address as registered; once b is removed
// the sandbox is lost, naming b; an id without a row is answered here.
func TestRouterOnPostgres(t *testing.T) {
	ctx := context.Background()
	url, err := pgtest.ForTest(t).NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	db, err := postgres.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	p, err := db.CreateProject(ctx, "p", "p")
	if err != nil {
		t.Fatal(err)
	}
	b := peer(t, "b", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("from b")) }), nil, nil)
	if _, err := db.RegisterNode(ctx, store.NodeInfo{Name: "a", Address: "127.0.0.1:1"}, time.Minute); err != nil {
		t.Fatal(err)
	}
	fb, err := db.RegisterNode(ctx, store.NodeInfo{Name: "b", Address: addrOf(b)}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	sb := store.Sandbox{ID: "sbx1", ProjectID: p.ID, Template: "base", Size: "small", Status: "running", Spec: json.RawMessage(`{}`), StartedAt: time.Now()}
	if err := db.PutSandboxFenced(ctx, fb, sb, nil); err != nil {
		t.Fatal(err)
	}
	rt := NewRouter(RouterConfig{Self: "a", Directory: db, Store: db, Signer: newTestSigner(t, "a", testSecret), Local: &fakeLocal{},
		Logger: quiet(), OwnerTTL: time.Nanosecond, NodesTTL: time.Nanosecond})
	a := frontFor(t, rt, p.ID)

	if _, body := get(t, a.URL+"/api/sandboxes/sbx1/exec"); body != "from b" {
		t.Fatalf("sandbox on b: %q", body)
	}
	if _, body := get(t, a.URL+"/api/sandboxes/nope/exec"); body != "local" {
		t.Fatalf("no row: %q", body)
	}
	if err := db.RemoveNode(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	resp, body := get(t, a.URL+"/api/sandboxes/sbx1/exec")
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(body, "sandbox_lost") || !strings.Contains(body, `\"b\"`) {
		t.Fatalf("b removed: %d %s", resp.StatusCode, body)
	}
}
