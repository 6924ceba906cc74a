package e2e

import (
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/store/postgres"
	"github.com/lizard-build/lizard/internal/store/postgres/pgtest"
)

// TestClusterOneNode: one server in cluster mode on a PostgreSQL of the
// test's own. Its sandboxes' rows carry its node, `lizard nodes ls` shows it
// with them, /readyz checks its lease; while the database is down its
// running sandbox keeps serving exec, creates answer a retryable 503 and
// /readyz says not ready, and all is well once the database is back.
func TestClusterOneNode(t *testing.T) {
	ctx := context.Background()
	srv, err := pgtest.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	url, err := srv.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte(strings.Repeat("k", 48)), 0o600); err != nil {
		t.Fatal(err)
	}
	internal := freeAddr(t)
	s := startServer(t, "", "--database", url, "--internal-listen", internal, "--advertise", internal, "--node-name", "solo",
		"--cluster-secret-file", secret, "--node-lease", "1s", "--node-dead-after", "5s")
	ready := func() int {
		resp, err := http.Get(s.url + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := ready(); code != http.StatusOK {
		t.Fatalf("/readyz: %d\n%s", code, s.logs())
	}
	id, err := s.createNano(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if code, out, err := s.execOK(id, "echo hi"); err != nil || code != 200 || out != "hi\n" {
		t.Fatalf("exec: %d %q %v", code, out, err)
	}
	st, err := postgres.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	if o, err := st.SandboxOwner(ctx, id); err != nil || o.Node != "solo" || o.Lost {
		t.Fatalf("owner of %s: %+v %v", id, o, err)
	}
	st.Close()
	out, err := exec.Command(filepath.Join(s.bin, "lizard"), "nodes", "ls", "--database", url).CombinedOutput()
	if err != nil {
		t.Fatalf("nodes ls: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 2 {
		t.Fatalf("nodes ls:\n%s", out)
	}
	if f := strings.Fields(lines[1]); len(f) < 4 || f[0] != "solo" || f[1] != internal || f[2] != "ready" || f[3] != "1" {
		t.Fatalf("nodes ls, the node: %q", lines[1])
	}

	// The database goes away.
	if err := srv.Down(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(budget(30 * time.Second))
	for ready() != http.StatusServiceUnavailable {
		if time.Now().After(deadline) {
			t.Fatal("/readyz stays ready with the database down")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code, out, err := s.execOK(id, "echo still"); err != nil || code != 200 || out != "still\n" {
		t.Fatalf("exec with the database down: %d %q %v", code, out, err)
	}
	var sb sandboxInfo
	code, body, err := s.request(ctx, s.key, "POST", "/api/sandboxes", map[string]any{"template": "base", "size": "nano"}, &sb)
	if err != nil || code != http.StatusServiceUnavailable {
		t.Fatalf("create with the database down: %d %s %v", code, body, err)
	}
	if err := srv.Up(ctx); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(budget(30 * time.Second))
	for ready() != http.StatusOK {
		if time.Now().After(deadline) {
			t.Fatalf("/readyz not ready after the database came back\n%s", s.logs())
		}
		time.Sleep(100 * time.Millisecond)
	}
	id2, err := s.createNano(ctx)
	if err != nil {
		t.Fatalf("create after the database came back: %v", err)
	}

	// The operator removes the node while it runs: its next heartbeat is
	// fenced, it joins again as a new incarnation and destroys the two
	// sandboxes it lost, whose rows stay, lost.
	if out, err := exec.Command(filepath.Join(s.bin, "lizard"), "nodes", "remove", "solo", "--database", url).CombinedOutput(); err != nil {
		t.Fatalf("nodes remove: %v\n%s", err, out)
	}
	deadline = time.Now().Add(budget(60 * time.Second))
	for _, sid := range []string{id, id2} {
		for {
			code, _ := s.do("GET", "/api/sandboxes/"+sid, nil, nil)
			if code == http.StatusNotFound {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("sandbox %s of the removed node still answers %d\n%s", sid, code, s.logs())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	st, err = postgres.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, sid := range []string{id, id2} {
		if o, err := st.SandboxOwner(ctx, sid); err != nil || !o.Lost || o.Node != "solo" {
			t.Fatalf("row of %s after the removal: %+v %v", sid, o, err)
		}
	}
	if !strings.Contains(s.logs(), "THIS NODE WAS FENCED") {
		t.Fatalf("the fence was not logged loudly\n%s", s.logs())
	}
	s.waitNoLeaks(t)
	// Back as a member, it takes new sandboxes.
	id3, err := s.createNano(ctx)
	if err != nil {
		t.Fatalf("create after rejoining: %v", err)
	}
	if code, body := s.do("DELETE", "/api/sandboxes/"+id3, nil, nil); code != http.StatusNoContent && code != http.StatusOK {
		t.Fatalf("kill %s: %d %s", id3, code, body)
	}
	s.waitNoLeaks(t)
}
