package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/objstore"
)

// volumeInfo is what GET /api/projects/default/volumes/{name} says of a
// volume's place and syncs.
type volumeInfo struct {
	ID            string     `json:"id"`
	Node          string     `json:"node"`
	AttachedTo    string     `json:"attachedTo"`
	Version       int        `json:"version"`
	SyncedVersion int        `json:"syncedVersion"`
	SyncedAt      *time.Time `json:"syncedAt"`
	Stale         bool       `json:"stale"`
}

func (n *clusterNode) volume(t *testing.T, name string) volumeInfo {
	t.Helper()
	var v volumeInfo
	if code, body := n.do("GET", "/api/projects/default/volumes/"+name, nil, &v); code != http.StatusOK {
		t.Fatalf("get volume %s through %s: %d %s", name, n.name, code, body)
	}
	return v
}

// waitSynced waits until volume name, detached, is synced (a detach
// syncs in the background) and returns it.
func (n *clusterNode) waitSynced(t *testing.T, name string) volumeInfo {
	t.Helper()
	deadline := time.Now().Add(budget(2 * time.Minute))
	for {
		v := n.volume(t, name)
		if v.AttachedTo == "" && v.Version > 0 && v.SyncedVersion == v.Version {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("volume %s not synced after 2 minutes: %+v", name, v)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// createWithVolume creates a sandbox holding volume name through n.
func (n *clusterNode) createWithVolume(t *testing.T, name string) string {
	t.Helper()
	var sb sandboxInfo
	if code, body := n.do("POST", "/api/sandboxes", map[string]any{"template": "base", "volumeName": name}, &sb); code >= 300 {
		t.Fatalf("create with volume %s through %s: %d %s", name, n.name, code, body)
	}
	return sb.SandboxID
}

// TestClusterVolumeMoves: with an object store, a volume written on a (the
// node placement chose for it) and detached is synced in the background;
// once a is gone it is attached on another node with its data (a
// corrupted object refused first, naming it); that node killed for good
// with the volume attached leaves it at its last sync, flagged stale,
// attachable on the third node. Nothing is left behind.
func TestClusterVolumeMoves(t *testing.T) {
	c := newTestCluster(t)
	gw, st := objectStoreOn(t, clusterNet+".1")
	c.startNodes(3, "--object-store", gw.URL("lizard"), "--max-volume-gb", "2")
	if code, body := c.node("a").do("POST", "/api/projects/default/volumes", map[string]any{"name": "moving", "sizeGb": 1}, nil); code != http.StatusCreated {
		t.Fatalf("create volume: %d %s", code, body)
	}
	v := c.node("a").volume(t, "moving")
	a := c.node(v.Node) // placed like a sandbox: on any node
	var others []*clusterNode
	for _, n := range c.nodes {
		if n != a {
			others = append(others, n)
		}
	}

	// Written on a, detached: synced.
	id := a.createWithVolume(t, "moving")
	if w := c.where(a, id); w != a.name {
		t.Fatalf("a create with %s's volume placed on %s", a.name, w)
	}
	a.sh(t, id, "echo from-a > /workspace/f")
	if code, body := a.do("DELETE", "/api/sandboxes/"+id, nil, nil); code >= 300 {
		t.Fatalf("kill: %d %s", code, body)
	}
	v = a.waitSynced(t, "moving")
	if v.AttachedTo != "" || v.SyncedVersion == 0 || v.SyncedVersion != v.Version || v.SyncedAt == nil || v.Stale {
		t.Fatalf("after the detach on a: %+v; want synced", v)
	}

	// a goes for good: the volume is placed anywhere, from its last sync.
	a.crash()
	c.nodesCLI("remove", a.name)
	c.waitState(a.name, "removed")
	b := others[0]

	// Corrupted objects are refused, naming one, and nothing is attached.
	blobs := keys(t, st, "blobs/")
	orig := map[string][]byte{}
	for _, k := range blobs {
		orig[k.Key] = get(t, st, k.Key)
		if _, err := st.Put(context.Background(), k.Key, bytes.NewReader([]byte("garbage"))); err != nil {
			t.Fatal(err)
		}
	}
	var e struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	var code int
	var body []byte
	for deadline := time.Now().Add(budget(30 * time.Second)); ; time.Sleep(200 * time.Millisecond) {
		// A retryable 503 until b's routing has seen a go.
		code, body = b.do("POST", "/api/sandboxes", map[string]any{"template": "base", "volumeName": "moving"}, nil)
		if code != http.StatusServiceUnavailable || time.Now().After(deadline) {
			break
		}
	}
	json.Unmarshal(body, &e)
	if code != http.StatusConflict || e.Code != "corrupt_object" || !strings.Contains(e.Message, "blobs/sha256/") {
		t.Fatalf("create from a corrupt volume: %d %s; want 409 corrupt_object naming the blob", code, body)
	}
	for k, data := range orig {
		if _, err := st.Put(context.Background(), k, bytes.NewReader(data)); err != nil {
			t.Fatal(err)
		}
	}
	if v := b.volume(t, "moving"); v.AttachedTo != "" || v.Node != a.name {
		t.Fatalf("after the refused attach: %+v", v)
	}

	id = b.createWithVolume(t, "moving")
	x := c.node(c.where(b, id))
	if got := x.sh(t, id, "cat /workspace/f"); got != "from-a\n" {
		t.Fatalf("on %s the volume holds %q", x.name, got)
	}
	if v := b.volume(t, "moving"); v.Node != x.name || v.AttachedTo != id || v.Stale {
		t.Fatalf("attached on %s: %+v", x.name, v)
	}

	// x is killed for good with the volume attached and never synced
	// what it wrote: the volume is at its last sync (a's), stale.
	x.sh(t, id, "echo from-"+x.name+" > /workspace/f")
	y := others[0]
	if x == y {
		y = others[1]
	}
	x.crash()
	c.waitState(x.name, "dead")
	deadline := time.Now().Add(budget(30 * time.Second))
	for v = y.volume(t, "moving"); !v.Stale; v = y.volume(t, "moving") {
		if time.Now().After(deadline) {
			t.Fatalf("after %s died: %+v; want stale", x.name, v)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if v.AttachedTo != "" {
		t.Fatalf("stale volume still attached: %+v", v)
	}
	id2 := y.createWithVolume(t, "moving")
	if w := c.where(y, id2); w != y.name {
		t.Fatalf("placed on %s, want %s (the only node left)", w, y.name)
	}
	if got := y.sh(t, id2, "cat /workspace/f"); got != "from-a\n" {
		t.Fatalf("on %s after %s died the volume holds %q; want the last sync's", y.name, x.name, got)
	}
	if v := y.volume(t, "moving"); !v.Stale || v.Node != y.name {
		t.Fatalf("attached on %s after the loss: %+v; want still stale until synced", y.name, v)
	}
	y.sh(t, id2, "echo from-"+y.name+" > /workspace/f")
	if code, body := y.do("DELETE", "/api/sandboxes/"+id2, nil, nil); code >= 300 {
		t.Fatalf("kill: %d %s", code, body)
	}
	if v := y.waitSynced(t, "moving"); v.Stale || v.SyncedVersion != v.Version {
		t.Fatalf("after the detach on %s: %+v; want synced, not stale", y.name, v)
	}
	if code, body := y.do("DELETE", "/api/projects/default/volumes/moving", nil, nil); code != http.StatusNoContent {
		t.Fatalf("delete volume: %d %s", code, body)
	}
	waitNoObjects(t, st)

	// The dead nodes come back, fenced, and clear what they held.
	for _, n := range []*clusterNode{a, x} {
		n.start()
		n.waitNoLeaks(t)
	}
	c.waitNoLeaks()
}

// get reads object key.
func get(t *testing.T, st objstore.Store, key string) []byte {
	t.Helper()
	rc, err := st.Get(context.Background(), key, 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(rc); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestClusterDrainMoveVolume: lizard nodes drain a --move with a running
// sandbox holding a volume: the sandbox is paused, its volume synced, and
// on b the volume is fetched and attached before the sandbox resumes: the
// file in /workspace is there, and the processes keep counting (same
// pids), one of them in /workspace, on b's copy of the volume. Killed on
// b, the volume syncs from there; deleted, nothing is left.
func TestClusterDrainMoveVolume(t *testing.T) {
	c, st := startDurableCluster(t, 2)
	if code, body := c.node("a").do("POST", "/api/projects/default/volumes", map[string]any{"name": "work", "sizeGb": 1}, nil); code != http.StatusCreated {
		t.Fatalf("create volume: %d %s", code, body)
	}
	// a is the node placement chose for the volume, b the other.
	a, b := c.node("a"), c.node("b")
	if v := a.volume(t, "work"); v.Node == "b" {
		a, b = b, a
	}
	id := a.createWithVolume(t, "work")
	if w := c.where(a, id); w != a.name {
		t.Fatalf("a create with %s's volume placed on %s", a.name, w)
	}
	a.sh(t, id, counterScript)
	a.sh(t, id, strings.ReplaceAll(counterScript, "/tmp/counter", "/workspace/counter"))
	a.sh(t, id, "echo moved-with-me > /workspace/f")
	pid, n := a.counter(t, id)
	wpid, wn := a.workspaceCounter(t, id)

	out := c.nodesCLI("drain", a.name, "--move")
	t.Logf("drain --move:\n%s", out)
	if !strings.Contains(out, "moved all its sandboxes") {
		t.Fatalf("drain --move output: %s", out)
	}
	if w := c.where(b, id); w != b.name {
		t.Fatalf("sandbox on %q after the move, want %s", w, b.name)
	}
	if pid2, n2 := b.counter(t, id); pid2 != pid || n2 <= n {
		t.Fatalf("after the move: counter pid %d at %d, want pid %d past %d", pid2, n2, pid, n)
	}
	if pid2, n2 := b.workspaceCounter(t, id); pid2 != wpid || n2 <= wn {
		t.Fatalf("after the move: /workspace counter pid %d at %d, want pid %d past %d", pid2, n2, wpid, wn)
	}
	if got := b.sh(t, id, "cat /workspace/f"); got != "moved-with-me\n" {
		t.Fatalf("after the move /workspace/f holds %q", got)
	}
	if v := b.volume(t, "work"); v.Node != b.name || v.AttachedTo != id || v.Stale {
		t.Fatalf("the volume after the move: %+v; want on %s, attached to %s", v, b.name, id)
	}
	a.waitNoLeaks(t)

	// Killed on b: its volume syncs from b, with what b's processes wrote.
	b.sh(t, id, "echo written-on-b > /workspace/g")
	if code, body := b.do("DELETE", "/api/sandboxes/"+id, nil, nil); code >= 300 {
		t.Fatalf("kill: %d %s", code, body)
	}
	if v := b.waitSynced(t, "work"); v.Node != b.name || v.Stale {
		t.Fatalf("after the kill on b: %+v", v)
	}
	id2 := b.createWithVolume(t, "work")
	if got := b.sh(t, id2, "cat /workspace/f /workspace/g"); got != "moved-with-me\nwritten-on-b\n" {
		t.Fatalf("a new sandbox with the volume sees %q", got)
	}
	if code, body := b.do("DELETE", "/api/sandboxes/"+id2, nil, nil); code >= 300 {
		t.Fatalf("kill: %d %s", code, body)
	}
	b.waitSynced(t, "work")
	if code, body := b.do("DELETE", "/api/projects/default/volumes/work", nil, nil); code != http.StatusNoContent {
		t.Fatalf("delete volume: %d %s", code, body)
	}
	waitNoObjects(t, st)
	c.waitNoLeaks()
}

// workspaceCounter reads the counter a copy of counterScript keeps in
// /workspace.
func (n *clusterNode) workspaceCounter(t *testing.T, id string) (pid, count int) {
	t.Helper()
	out := n.sh(t, id, "cat /workspace/counter")
	if _, err := fmt.Sscan(out, &pid, &count); err != nil {
		t.Fatalf("/workspace/counter holds %q: %v", out, err)
	}
	return pid, count
}
