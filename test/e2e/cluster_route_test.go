package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/cluster"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/store/postgres"
	"github.com/lizard-build/lizard/internal/store/postgres/pgtest"
)

// routeNode starts cluster node n (1, 2, …) named name on the shared
// database db, in the host's network namespace: its own ports (from
// 18480, three each), bridge, subnets and data dir.
func routeNode(t *testing.T, n int, name, db, secretFile string) *server {
	t.Helper()
	port := func(i int) string { return fmt.Sprintf("127.0.0.1:%d", 18480+3*(n-1)+i) }
	return startServer(t, "", "--database", db, "--node-name", name, "--cluster-secret-file", secretFile,
		"--listen", port(0), "--proxy-listen", port(1), "--internal-listen", port(2), "--advertise", port(2),
		"--bridge", fmt.Sprintf("lzr%d", n), "--subnet", fmt.Sprintf("10.21%d.0.0/16", n),
		"--build-bridge", fmt.Sprintf("lzrb%d", n), "--build-subnet", fmt.Sprintf("10.21%d.0.0/24", n+4))
}

// setDraining drains (or undrains) node name and waits until the nodes
// route by it: until the database says so, and the routers' cache of the
// node list has expired.
func setDraining(t *testing.T, db *postgres.Store, name string, draining bool) {
	t.Helper()
	if err := db.SetDraining(context.Background(), name, draining); err != nil {
		t.Fatal(err)
	}
	time.Sleep(cluster.DefaultNodesTTL + 200*time.Millisecond)
}

// waitReady waits until every named node is ready (lease current, not
// draining).
func waitReady(t *testing.T, db *postgres.Store, names ...string) {
	t.Helper()
	var ns []store.Node
	for deadline := time.Now().Add(budget(30 * time.Second)); time.Now().Before(deadline); {
		var err error
		if ns, err = db.Nodes(context.Background()); err != nil {
			t.Fatal(err)
		}
		ready := 0
		for _, n := range ns {
			if slices.Contains(names, n.Name) && n.State == store.NodeReady {
				ready++
			}
		}
		if ready == len(names) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("nodes %v not all ready: %+v", names, ns)
}

// clusterSandbox is what these tests read of a sandbox.
type clusterSandbox struct {
	SandboxID string `json:"sandboxId"`
	Node      string `json:"node"`
	Status    string `json:"status"`
}

// TestClusterRoute: two nodes on one PostgreSQL. A create through a
// draining node lands on the other; exec (SSE, streamed), a 10 MiB file up
// and down, and a preview (HTTP and WebSocket) of a server on b all work
// through a; E2B's create, get and list work through either; the lists
// of both show both nodes' sandboxes with their nodes.
func TestClusterRoute(t *testing.T) {
	requirements(t)
	ctx := context.Background()
	pg := pgtest.ForTest(t)
	url, err := pg.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	secretFile := filepath.Join(t.TempDir(), "cluster-secret")
	if err := os.WriteFile(secretFile, []byte(rand.Text()+rand.Text()), 0o600); err != nil {
		t.Fatal(err)
	}
	a := routeNode(t, 1, "a", url, secretFile)
	b := routeNode(t, 2, "b", url, secretFile)
	db, err := postgres.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	waitReady(t, db, "a", "b")

	// Drained, a places on b.
	setDraining(t, db, "a", true)
	var onB clusterSandbox
	if code, body := a.do("POST", "/api/sandboxes", map[string]any{"template": "base", "timeoutMs": 600000}, &onB); code != http.StatusCreated || onB.Node != "b" {
		t.Fatalf("create through a: %d %s", code, body)
	}
	id := onB.SandboxID
	defer a.do("DELETE", "/api/sandboxes/"+id, nil, nil)
	for _, s := range []*server{a, b} {
		var got clusterSandbox
		if code, body := s.do("GET", "/api/sandboxes/"+id, nil, &got); code != 200 || got.Node != "b" || got.Status != "running" {
			t.Fatalf("get through %s: %d %s", s.url, code, body)
		}
	}

	t.Run("exec stream", func(t *testing.T) { clusterExecStream(t, a, id) })

	t.Run("files", func(t *testing.T) {
		content := make([]byte, 10<<20)
		rand.Read(content)
		sum := sha256.Sum256(content)
		if code, body := a.do("POST", "/api/sandboxes/"+id+"/files", map[string]any{"path": "/tmp/big", "content": base64.StdEncoding.EncodeToString(content), "encoding": "base64"}, nil); code >= 300 {
			t.Fatalf("upload through a: %d %.300s", code, body)
		}
		if got := strings.Fields(a.sh(t, id, "sha256sum /tmp/big")); len(got) == 0 || got[0] != hex.EncodeToString(sum[:]) {
			t.Fatalf("in the sandbox: %v, want %x", got, sum)
		}
		req, _ := http.NewRequest("GET", a.url+"/api/sandboxes/"+id+"/files?path=/tmp/big", nil)
		req.Header.Set("X-API-Key", a.key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.New()
		n, err := io.Copy(h, resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || n != int64(len(content)) || !bytes.Equal(h.Sum(nil), sum[:]) {
			t.Fatalf("download through a: %d, %d bytes, %v", resp.StatusCode, n, err)
		}
	})

	t.Run("preview", func(t *testing.T) {
		a.startApp(t, id, 8000)
		var ex exposed
		if code, body := a.do("POST", "/api/sandboxes/"+id+"/expose/8000", nil, &ex); code != 200 {
			t.Fatalf("expose through a: %d %s", code, body)
		}
		// a's proxy, whatever port the URL names.
		resp := a.preview(t, "GET", ex.Hostname, "/hello", http.Header{"X-Lizard-Access-Token": {ex.AccessToken}}, nil)
		if body := readAll(t, resp); resp.StatusCode != 200 || !strings.Contains(body, `"path": "/hello"`) {
			t.Fatalf("preview through a: %d %s", resp.StatusCode, body)
		}
		resp = a.preview(t, "GET", ex.Hostname, "/hello", nil, nil)
		if readAll(t, resp); resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("preview through a without its token: %d", resp.StatusCode)
		}
		if got := wsEcho(t, a.proxy, ex.Hostname, ex.AccessToken, "ping across nodes"); got != "echo: ping across nodes" {
			t.Fatalf("WebSocket through a: %q", got)
		}
	})

	// Now b drains: through b, the Lizard and E2B creates land on a.
	setDraining(t, db, "a", false)
	setDraining(t, db, "b", true)
	var onA clusterSandbox
	if code, body := b.do("POST", "/api/sandboxes", map[string]any{"template": "base", "timeoutMs": 600000}, &onA); code != http.StatusCreated || onA.Node != "a" {
		t.Fatalf("create through b: %d %s", code, body)
	}
	defer b.do("DELETE", "/api/sandboxes/"+onA.SandboxID, nil, nil)
	e2bOnA := e2bCreate(t, b)
	defer b.do("DELETE", "/sandboxes/"+e2bOnA, nil, nil)
	var e2bGot struct {
		SandboxID string `json:"sandboxID"`
		State     string `json:"state"`
	}
	if code, body := b.do("GET", "/sandboxes/"+e2bOnA, nil, &e2bGot); code != 200 || e2bGot.State != "running" {
		t.Fatalf("E2B get through b: %d %s", code, body)
	}
	var got clusterSandbox
	if code, body := b.do("GET", "/api/sandboxes/"+e2bOnA, nil, &got); code != 200 || got.Node != "a" {
		t.Fatalf("E2B sandbox: %d %s, want it on a", code, body)
	}
	// And one E2B sandbox on b, through a.
	setDraining(t, db, "b", false)
	setDraining(t, db, "a", true)
	e2bOnB := e2bCreate(t, a)
	defer a.do("DELETE", "/sandboxes/"+e2bOnB, nil, nil)
	if code, body := a.do("GET", "/api/sandboxes/"+e2bOnB, nil, &got); code != 200 || got.Node != "b" {
		t.Fatalf("E2B sandbox: %d %s, want it on b", code, body)
	}
	setDraining(t, db, "a", false)

	// Either node lists every node's: the Lizard list with the nodes, the
	// E2B list in pages across nodes.
	for _, s := range []*server{a, b} {
		var list []clusterSandbox
		if code, body := s.do("GET", "/api/sandboxes", nil, &list); code != 200 {
			t.Fatalf("list through %s: %d %s", s.url, code, body)
		}
		nodes := map[string]string{}
		for _, sb := range list {
			nodes[sb.SandboxID] = sb.Node
		}
		if len(list) != 4 || nodes[id] != "b" || nodes[onA.SandboxID] != "a" || nodes[e2bOnA] != "a" || nodes[e2bOnB] != "b" {
			t.Fatalf("list through %s: %+v", s.url, list)
		}
		first, next := e2bPage(t, s, "/v2/sandboxes?limit=1")
		if len(first) != 1 || next == "" {
			t.Fatalf("E2B list through %s: first page %v, next %q", s.url, first, next)
		}
		second, next := e2bPage(t, s, "/v2/sandboxes?limit=1&nextToken="+next)
		if len(second) != 1 || next != "" {
			t.Fatalf("E2B list through %s: second page %v, next %q", s.url, second, next)
		}
		if got := []string{first[0], second[0]}; !slices.Contains(got, e2bOnA) || !slices.Contains(got, e2bOnB) {
			t.Fatalf("E2B list through %s: %v, want %s and %s", s.url, got, e2bOnA, e2bOnB)
		}
	}

	// Deletes through the other node; then nothing is left on either.
	for _, del := range []struct {
		s    *server
		path string
	}{{a, "/api/sandboxes/" + id}, {b, "/api/sandboxes/" + onA.SandboxID}, {a, "/sandboxes/" + e2bOnA}, {b, "/sandboxes/" + e2bOnB}} {
		if code, body := del.s.do("DELETE", del.path, nil, nil); code != http.StatusNoContent {
			t.Fatalf("DELETE %s: %d %s", del.path, code, body)
		}
	}
	for _, s := range []*server{a, b} {
		var list []clusterSandbox
		if code, _ := s.do("GET", "/api/sandboxes", nil, &list); code != 200 || len(list) != 0 {
			t.Fatalf("after the deletes, %s lists %+v", s.url, list)
		}
	}
	a.waitNoLeaks(t)
	b.waitNoLeaks(t)
}

// e2bCreate makes a sandbox through s's E2B API and returns its id.
func e2bCreate(t *testing.T, s *server) string {
	t.Helper()
	var sb struct {
		SandboxID string `json:"sandboxID"`
	}
	if code, body := s.do("POST", "/sandboxes", map[string]any{"templateID": "base", "timeout": 600}, &sb); code != http.StatusCreated {
		t.Fatalf("E2B create through %s: %d %s", s.url, code, body)
	}
	return sb.SandboxID
}

// e2bPage gets a page of E2B's list through s: its sandboxes' ids and
// the next page's token.
func e2bPage(t *testing.T, s *server, path string) (ids []string, next string) {
	t.Helper()
	req, _ := http.NewRequest("GET", s.url+path, nil)
	req.Header.Set("X-API-Key", s.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var page []struct {
		SandboxID string `json:"sandboxID"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&page); err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %v", path, resp.StatusCode, err)
	}
	for _, sb := range page {
		ids = append(ids, sb.SandboxID)
	}
	return ids, resp.Header.Get("X-Next-Token")
}

// clusterExecStream runs a command through s whose second line waits for
// a file that a second exec (also through s) creates only after the first
// line has arrived: the stream cannot have been buffered anywhere.
func clusterExecStream(t *testing.T, s *server, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), budget(60*time.Second))
	defer cancel()
	body, _ := json.Marshal(map[string]any{"cmd": "echo first; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo second"})
	req, _ := http.NewRequestWithContext(ctx, "POST", s.url+"/api/sandboxes/"+id+"/exec", bytes.NewReader(body))
	req.Header.Set("X-API-Key", s.key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("exec stream: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	events := bufio.NewScanner(resp.Body)
	next := func() map[string]any {
		for events.Scan() {
			if data, ok := strings.CutPrefix(events.Text(), "data: "); ok {
				var ev map[string]any
				if err := json.Unmarshal([]byte(data), &ev); err != nil {
					t.Fatalf("event %q: %v", data, err)
				}
				return ev
			}
		}
		t.Fatalf("stream ended: %v", events.Err())
		return nil
	}
	if ev := next(); ev["line"] != "first" {
		t.Fatalf("first event %v", ev)
	}
	s.sh(t, id, "touch /tmp/go")
	if ev := next(); ev["line"] != "second" {
		t.Fatalf("second event %v", ev)
	}
	if ev := next(); ev["exitCode"] != float64(0) {
		t.Fatalf("last event %v", ev)
	}
}
