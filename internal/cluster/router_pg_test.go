package cluster

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/store/postgres/pgtest"
)

// TestRouterOnPostgres routes by the real store's answers: a sandbox row
// of node b is forwarded to b's address as registered; once b is removed
// the sandbox is lost, naming b; an id without a row is answered here.
func TestRouterOnPostgres(t *testing.T) {
	ctx := context.Background()
	db := openDB(t, newDB(t, pgtest.ForTest(t)))
	p := project(t, db)
	b := peer(t, "b", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("from b")) }), nil, nil)
	if _, err := db.RegisterNode(ctx, store.NodeInfo{Name: "a", Address: "127.0.0.1:1"}, time.Minute); err != nil {
		t.Fatal(err)
	}
	fb, err := db.RegisterNode(ctx, store.NodeInfo{Name: "b", Address: addrOf(b)}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.PutSandboxFenced(ctx, fb, row(p, "sbx1", "running"), nil); err != nil {
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
