package e2e

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/durable"
	"github.com/lizard-build/lizard/internal/objstore"
	"github.com/lizard-build/lizard/internal/store/postgres"
)

// Templates everywhere (docs/CLUSTER.md): a template built through one node
// is published to the object store and fetched by the node a create is
// placed on; a corrupted object is refused.

// projectCopies lists the versions of project template name that node n
// holds in its template directory.
func projectCopies(t *testing.T, n *clusterNode, name string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(n.templateDir, ".projects", "*", ".v", name+"@*"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// templateManifestKey is the key of the manifest of the published image of
// template name (images/templates/<digest>/<name>/manifest.json).
func templateManifestKey(t *testing.T, st objstore.Store, name string) string {
	t.Helper()
	var found []string
	for _, k := range keys(t, st, "images/templates/") {
		if strings.HasSuffix(k.Key, "/"+name+"/manifest.json") {
			found = append(found, k.Key)
		}
	}
	if len(found) != 1 {
		t.Fatalf("published images of %s: %v, want one", name, found)
	}
	return found[0]
}

// buildTemplateOn builds a Dockerfile template through node n.
func buildTemplateOn(t *testing.T, n *clusterNode, name, dockerfile string) {
	t.Helper()
	var tpl struct {
		Name   string `json:"name"`
		Status string `json:"status"`
	}
	if code, body := n.do("POST", "/api/templates", map[string]any{"name": name, "dockerfile": dockerfile}, &tpl); code != 201 || tpl.Status != "ready" {
		t.Fatalf("build %s through %s: %d %s", name, n.name, code, body)
	}
}

// drainOnly leaves only node keep taking new sandboxes.
func (c *testCluster) drainOnly(keep string) {
	c.t.Helper()
	for _, n := range c.nodes {
		if n.name == keep {
			c.nodesCLI("drain", "--undo", n.name)
			c.waitState(n.name, "ready")
		} else {
			c.nodesCLI("drain", n.name)
			c.waitState(n.name, "draining")
		}
	}
}

// TestClusterTemplateEverywhere: a Dockerfile template built through a is
// published (its image in the object store) and listed through every node;
// a create through a placed on c (a and b drained) makes c fetch it, and
// the sandbox has the build's files. A build through b FROM that template
// fetches it first. A template whose object is corrupted
// is refused by the node that fetches it (409 corrupt_object naming the
// object), which keeps no copy of it.
func TestClusterTemplateEverywhere(t *testing.T) {
	c, st := startDurableCluster(t, 3)
	a, b, cn := c.node("a"), c.node("b"), c.node("c")
	const name, child, bad = "e2e-dist", "e2e-dist-child", "e2e-dist-bad"
	buildTemplateOn(t, a, name, "FROM base\nRUN echo built on a > /where.txt\nENV DIST_TEST=yes\n")
	templateManifestKey(t, st, name)
	for _, n := range []*clusterNode{b, cn} {
		if got := projectCopies(t, n, name); len(got) != 0 {
			t.Fatalf("node %s holds %v before any create", n.name, got)
		}
		var list []struct {
			Name   string `json:"name"`
			Status string `json:"status"`
		}
		if code, body := n.do("GET", "/api/templates", nil, &list); code != 200 {
			t.Fatalf("list templates through %s: %d %s", n.name, code, body)
		}
		listed := false
		for _, e := range list {
			listed = listed || (e.Name == name && e.Status == "ready")
		}
		if !listed {
			t.Fatalf("GET /api/templates through %s does not list %s, built on a: %+v", n.name, name, list)
		}
	}

	// Placed on c, which fetches it.
	c.drainOnly("c")
	var sb sandboxInfo
	if code, body := a.do("POST", "/api/sandboxes", map[string]any{"template": name}, &sb); code >= 300 {
		t.Fatalf("create of %s through a: %d %s", name, code, body)
	}
	if w := c.where(a, sb.SandboxID); w != "c" {
		t.Fatalf("sandbox placed on %s, want c (a and b drain)", w)
	}
	if got := a.sh(t, sb.SandboxID, "cat /where.txt; echo $DIST_TEST"); got != "built on a\nyes\n" {
		t.Fatalf("sandbox of the fetched template: %q", got)
	}
	if got := projectCopies(t, cn, name); len(got) != 1 {
		t.Fatalf("c holds %v after the create, want one version", got)
	}
	// A second create on c uses its copy (no second fetch, same version).
	var sb2 sandboxInfo
	if code, body := b.do("POST", "/api/sandboxes", map[string]any{"template": name}, &sb2); code >= 300 {
		t.Fatalf("second create through b: %d %s", code, body)
	}
	if got := b.sh(t, sb2.SandboxID, "cat /where.txt"); got != "built on a\n" {
		t.Fatalf("second sandbox: %q", got)
	}

	// A build through b, which lacks e2e-dist, FROM it: b fetches its base;
	// the result, used on c, has both builds' files.
	if got := projectCopies(t, b, name); len(got) != 0 {
		t.Fatalf("b holds %v before building from it", got)
	}
	buildTemplateOn(t, b, child, "FROM "+name+"\nRUN cat /where.txt > /child.txt\n")
	var sb3 sandboxInfo
	if code, body := a.do("POST", "/api/sandboxes", map[string]any{"template": child}, &sb3); code >= 300 {
		t.Fatalf("create of %s (built on b) through a: %d %s", child, code, body)
	}
	if got := a.sh(t, sb3.SandboxID, "cat /child.txt /where.txt"); got != "built on a\nbuilt on a\n" {
		t.Fatalf("sandbox of the template built on b from a's: %q", got)
	}

	// A corrupted object: b is the only node taking sandboxes and lacks
	// the template; one of its blobs is overwritten.
	buildTemplateOn(t, a, bad, "FROM base\nRUN echo bad > /bad.txt\n")
	// The blob corrupted is one only this template has: its archive shares
	// most chunks with the others' (b holds those), and which ones depends
	// on where the build's files fall in it.
	im := durable.New(st, nil)
	manifest := func(name string) durable.Manifest {
		t.Helper()
		mkey := templateManifestKey(t, st, name)
		m, err := im.Stat(context.Background(), strings.TrimSuffix(strings.TrimPrefix(mkey, "images/"), "/manifest.json"))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	shared := map[string]bool{}
	for _, other := range []string{name, child} {
		for _, f := range manifest(other).Files {
			for _, ch := range f.Chunks {
				shared[ch.StoredSHA256] = true
			}
		}
	}
	blob := ""
	for _, f := range manifest(bad).Files {
		for _, ch := range f.Chunks {
			if !ch.Hole && ch.StoredSHA256 != "" && !shared[ch.StoredSHA256] && blob == "" {
				blob = "blobs/sha256/" + ch.StoredSHA256
			}
		}
	}
	if blob == "" {
		t.Fatalf("%s has no blob of its own", bad)
	}
	if _, err := st.Put(context.Background(), blob, bytes.NewReader([]byte("not the bytes the manifest names"))); err != nil {
		t.Fatal(err)
	}
	c.drainOnly("b")
	code, body := a.do("POST", "/api/sandboxes", map[string]any{"template": bad}, nil)
	if code != 409 || !strings.Contains(string(body), "corrupt_object") || !strings.Contains(string(body), blob) {
		t.Fatalf("create of a template whose object is corrupt: %d %s, want 409 corrupt_object naming %s", code, body, blob)
	}
	if got := projectCopies(t, b, bad); len(got) != 0 {
		t.Fatalf("b kept %v of a corrupt template", got)
	}
	if left, _ := filepath.Glob(filepath.Join(b.templateDir, ".projects", "*", ".build-*")); len(left) != 0 {
		t.Fatalf("b left %v behind", left)
	}
	c.drainOnly("a")
	c.nodesCLI("drain", "--undo", "b")
	c.nodesCLI("drain", "--undo", "c")
	c.killAll(a)
}

// TestClusterResumeOldVersion: a sandbox paused on a over version one of a
// template that was rebuilt since (version two), a snapshot and a snapshot
// with a warm pool taken on version one outlive a (killed and removed, its
// disk with it): the resume through b, the snapshot's restore and the
// pool, adopted by b or c and refilled there after a restart, all run on
// version one, which those nodes fetch by its digest from the object
// store beside the current version; a new sandbox gets version two.
func TestClusterResumeOldVersion(t *testing.T) {
	c, st := startDurableCluster(t, 3)
	a, b := c.node("a"), c.node("b")
	const name = "e2e-oldver"
	version := func(v string) string { return "FROM base\nRUN echo " + v + " > /version.txt\n" }
	buildTemplateOn(t, a, name, version("one"))
	c.drainOnly("a")
	create := func() string {
		var sb sandboxInfo
		if code, body := a.do("POST", "/api/sandboxes", map[string]any{"template": name}, &sb); code >= 300 {
			t.Fatalf("create of %s through a: %d %s", name, code, body)
		}
		a.sh(t, sb.SandboxID, "echo kept > /root/file")
		return sb.SandboxID
	}
	snap := a.durableSnapshot(t, create(), "oldver")
	pooled := a.durablePooledSnapshot(t, create(), "oldver-pool", 1)
	c.waitPool(a, pooled.ID, 1)
	id := create()
	if code, body := a.do("POST", "/api/sandboxes/"+id+"/pause", nil, nil); code >= 300 {
		t.Fatalf("pause: %d %s", code, body)
	}
	a.waitDurable(t, "/api/sandboxes/"+id)
	buildTemplateOn(t, a, name, version("two"))
	for _, n := range []string{"b", "c"} {
		c.nodesCLI("drain", "--undo", n)
		c.waitState(n, "ready")
	}

	a.crash()
	// a's disk goes with it: the harness's nodes share the host's file
	// system, where b and c would find a's versions at their recorded
	// paths, as no other machine could.
	if err := os.RemoveAll(filepath.Join(a.templateDir, ".projects")); err != nil {
		t.Fatal(err)
	}
	c.nodesCLI("remove", "a")
	c.waitState("a", "removed")
	// Through b: a retryable 503 until b's routing has seen a go.
	retry := func(what, method, path string, body any, out any) {
		t.Helper()
		for deadline := time.Now().Add(budget(30 * time.Second)); ; time.Sleep(200 * time.Millisecond) {
			code, resp := b.do(method, path, body, out)
			if code < 300 {
				return
			}
			if code != http.StatusServiceUnavailable || time.Now().After(deadline) {
				t.Fatalf("%s through b: %d %s", what, code, resp)
			}
		}
	}
	retry("resume", "POST", "/api/sandboxes/"+id+"/resume", nil, nil)
	w := c.where(b, id)
	if w != "b" && w != "c" {
		t.Fatalf("resumed on %q, want b or c", w)
	}
	if got := b.sh(t, id, "cat /version.txt /root/file"); got != "one\nkept\n" {
		t.Fatalf("resumed sandbox reads %q, want version one's file and its own", got)
	}
	if got := projectCopies(t, c.node(w), name); len(got) != 1 {
		t.Fatalf("%s holds versions %v, want the one it fetched for the resume", w, got)
	}
	var cp sandboxInfo
	retry("restore", "POST", "/api/sandboxes", map[string]any{"snapshotId": snap.ID}, &cp)
	if got := b.sh(t, cp.SandboxID, "cat /version.txt /root/file"); got != "one\nkept\n" {
		t.Fatalf("copy of the snapshot on %s reads %q, want version one's file and the source's", c.where(b, cp.SandboxID), got)
	}
	var fresh sandboxInfo
	if code, body := b.do("POST", "/api/sandboxes", map[string]any{"template": name}, &fresh); code >= 300 {
		t.Fatalf("create of %s through b: %d %s", name, code, body)
	}
	if got := b.sh(t, fresh.SandboxID, "cat /version.txt"); got != "two\n" {
		t.Fatalf("new sandbox reads %q, want version two", got)
	}

	// The pool, adopted by b or c, serves version one; so does its refill
	// after that node restarts (its record names a's path).
	db, err := postgres.Open(context.Background(), c.db)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	c.waitPool(b, pooled.ID, 1)
	row, ok := c.snapshotRow(db, pooled.ID)
	if !ok || row.KeepsPool() != "b" && row.KeepsPool() != "c" {
		t.Fatalf("pooled snapshot's row after a was removed: %+v (found %v), want its pool on b or c", row, ok)
	}
	pool := c.node(row.KeepsPool())
	claim := func(what string) {
		t.Helper()
		var cp sandboxInfo
		retry("restore of the pooled snapshot", "POST", "/api/sandboxes", map[string]any{"snapshotId": pooled.ID}, &cp)
		if got := b.sh(t, cp.SandboxID, "cat /version.txt /root/file"); got != "one\nkept\n" {
			t.Fatalf("%s on %s reads %q, want version one's file and the source's", what, c.where(b, cp.SandboxID), got)
		}
	}
	claim("a warm copy of the adopted pool")
	c.waitPool(b, pooled.ID, 1)
	pool.crash()
	pool.start()
	c.waitState(pool.name, "ready")
	claim("the warm copy made before the restart")
	c.waitPool(b, pooled.ID, 1)
	claim("the warm copy made after the restart")

	// a comes back: fenced, it destroys its copies.
	a.start()
	c.waitState("a", "ready")
	retry("delete snapshot", "DELETE", "/api/sandbox-snapshots/"+snap.ID, nil, nil)
	retry("delete snapshot", "DELETE", "/api/sandbox-snapshots/"+pooled.ID, nil, nil)
	c.killAll(b)
	for deadline := time.Now().Add(budget(time.Minute)); ; time.Sleep(200 * time.Millisecond) {
		// Only the template's versions stay (docs/CLUSTER.md).
		left := append(keys(t, st, "images/sandboxes/"), keys(t, st, "images/snapshots/")...)
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pause and snapshot images left in the store: %v", left)
		}
	}
}
