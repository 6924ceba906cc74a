package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/durable"
	"github.com/lizard-build/lizard/internal/objstore"
	"github.com/lizard-build/lizard/internal/objstore/s3"
	"github.com/lizard-build/lizard/internal/objstore/vgwtest"
)

// objectStore starts a versitygw for the test, gives the servers started
// after it its credentials (environment), and returns it with a client of
// the bucket as the server sees it.
func objectStore(t *testing.T) (*vgwtest.Server, objstore.Store) {
	t.Helper()
	return objectStoreOn(t, "127.0.0.1")
}

// objectStoreOn is objectStore listening on host (the cluster's bridge, for
// nodes in network namespaces).
func objectStoreOn(t *testing.T, host string) (*vgwtest.Server, objstore.Store) {
	t.Helper()
	requirements(t)
	gw := vgwtest.NewOn(t, host)
	gw.SetEnv(t)
	st, err := s3.Open(gw.URL("lizard"))
	if err != nil {
		t.Fatal(err)
	}
	return gw, st
}

// durableServer starts a server with an object store of the test's own.
func durableServer(t *testing.T) (*vgwtest.Server, objstore.Store, *server) {
	t.Helper()
	gw, st := objectStore(t)
	return gw, st, startServer(t, "", "--object-store", gw.URL("lizard"))
}

// killRemovesObjects kills sandbox id, the last user of the object store,
// and waits until the store is empty.
func (s *server) killRemovesObjects(t *testing.T, st objstore.Store, id string) {
	t.Helper()
	if code, body := s.do("DELETE", "/api/sandboxes/"+id, nil, nil); code >= 300 {
		t.Fatalf("kill: %d %s", code, body)
	}
	waitNoObjects(t, st)
}

type durableInfo struct {
	Status    string  `json:"status"`
	DurableAt *string `json:"durableAt"`
}

// waitDurable waits until GET path says durableAt.
func (s *server) waitDurable(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(budget(3 * time.Minute))
	for {
		var info durableInfo
		if code, body := s.do("GET", path, nil, &info); code != 200 {
			t.Fatalf("get %s: %d %s", path, code, body)
		}
		if info.DurableAt != nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not durable after 3 minutes (status %s)", path, info.Status)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (s *server) durableAt(t *testing.T, path string) *string {
	t.Helper()
	var info durableInfo
	if code, body := s.do("GET", path, nil, &info); code != 200 {
		t.Fatalf("get %s: %d %s", path, code, body)
	}
	return info.DurableAt
}

// keys lists the bucket's keys under prefix.
func keys(t *testing.T, st objstore.Store, prefix string) []objstore.Info {
	t.Helper()
	var out []objstore.Info
	if err := st.List(context.Background(), prefix, func(i objstore.Info) error { out = append(out, i); return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

// hold64 starts a process that holds 64 MiB of random bytes.
const hold64 = `nohup python3 -c 'import os, time; b = os.urandom(64 << 20); time.sleep(1e9)' >/dev/null 2>&1 &
i=0; until [ "$(ps -o rss= -C python3 | sort -n | tail -1)" -gt 65536 ] || [ $i -ge 200 ]; do sleep 0.05; i=$((i+1)); done`

// blobSizes is the blobs in st by key, with their sizes.
func blobSizes(t *testing.T, st objstore.Store) map[string]int64 {
	out := map[string]int64{}
	for _, b := range keys(t, st, "blobs/") {
		out[b.Key] = b.Size
	}
	return out
}

// waitRetired waits until the pause image of sandbox id, resumed, is
// retired: its manifest gone, its base (what the next pause's upload
// compares with) there.
func waitRetired(t *testing.T, st objstore.Store, id string) {
	t.Helper()
	for deadline := time.Now().Add(budget(time.Minute)); len(keys(t, st, "images/sandboxes/"+id+"/")) > 0; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the resumed image's manifest stayed: %v", keys(t, st, "images/"))
		}
	}
	if b := keys(t, st, "bases/sandboxes/"+id+"/"); len(b) != 1 {
		t.Fatalf("the resumed image's base: %v", b)
	}
}

// waitNoObjects waits until nothing is left in the bucket.
func waitNoObjects(t *testing.T, st objstore.Store) {
	t.Helper()
	deadline := time.Now().Add(budget(time.Minute))
	for {
		left := keys(t, st, "")
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("objects left in the store: %v", left)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (s *server) pause(t *testing.T, id string) {
	t.Helper()
	if code, body := s.do("POST", "/api/sandboxes/"+id+"/pause", nil, nil); code != 200 {
		t.Fatalf("pause: %d %s", code, body)
	}
}

func (s *server) resume(t *testing.T, id string) {
	t.Helper()
	if code, body := s.do("POST", "/api/sandboxes/"+id+"/resume", nil, nil); code >= 300 {
		t.Fatalf("resume: %d %s", code, body)
	}
}

// dropLocalImage removes sandbox id's pause image from the node's disk,
// as if it had been paused on another node.
func (s *server) dropLocalImage(t *testing.T, id string) {
	t.Helper()
	dir := filepath.Join(s.dataDir, "sandboxes", id, "checkpoint")
	if _, err := os.Stat(filepath.Join(dir, "checkpoint.img")); err != nil {
		t.Fatalf("no local pause image: %v", err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
}

// TestDurablePause: a pause becomes durable in the object store; with the
// local image gone, resume downloads it and the processes go on where they
// were; a corrupted object is refused naming it, the sandbox stays paused
// and resumes once the object is right again; kill removes every object.
func TestDurablePause(t *testing.T) {
	gw, st, s := durableServer(t)
	id := s.create(t)
	s.sh(t, id, counterScript)
	pid, n := s.counter(t, id)
	// 64 MiB that does not compress: what a second pause must not store
	// again.
	s.sh(t, id, hold64)

	s.pause(t, id)
	s.waitDurable(t, "/api/sandboxes/"+id)
	if m := keys(t, st, "images/sandboxes/"+id+"/"); len(m) != 1 {
		t.Fatalf("manifest objects of %s: %v", id, m)
	}
	// The manifest carries what restoring needs: the runsc build and the
	// CPU features, and both digests of every chunk.
	rc, err := st.Get(context.Background(), "images/sandboxes/"+id+"/manifest.json", 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	var m durable.Manifest
	err = json.NewDecoder(rc).Decode(&m)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	var cp struct {
		RunscDigest string   `json:"runscDigest"`
		CPUFeatures []string `json:"cpuFeatures"`
	}
	if json.Unmarshal(m.Checkpoint, &cp); cp.RunscDigest == "" || len(cp.CPUFeatures) == 0 {
		t.Fatalf("manifest without the checkpoint's runsc build and CPU features: %s", m.Checkpoint)
	}
	for _, f := range m.Files {
		for _, c := range f.Chunks {
			if len(c.SHA256) != 64 || len(c.StoredSHA256) != 64 || c.StoredSize == 0 {
				t.Fatalf("%s: chunk %+v", f.Path, c)
			}
		}
	}
	s.dropLocalImage(t, id)
	s.resume(t, id)
	pid2, n2 := s.counter(t, id)
	if pid2 != pid || n2 <= n {
		t.Fatalf("after a resume from the object store: counter pid %d n %d, before pid %d n %d", pid2, n2, pid, n)
	}
	if got := s.sh(t, id, "cat /root/file"); got != "data\n" {
		t.Fatalf("file after resume: %q", got)
	}
	if d := s.durableAt(t, "/api/sandboxes/"+id); d != nil {
		t.Fatalf("a running sandbox says durableAt %s", *d)
	}
	// The resumed image is retired: no manifest, its blobs kept as the
	// base of the next pause's upload.
	first := blobSizes(t, st)
	waitRetired(t, st, id)

	t.Run("Corrupt", func(t *testing.T) {
		// Paused again, the upload stores only the chunks that changed.
		s.pause(t, id)
		s.waitDurable(t, "/api/sandboxes/"+id)
		var total, added int64
		for k, size := range blobSizes(t, st) {
			total += size
			if _, ok := first[k]; !ok {
				added += size
			}
		}
		t.Logf("the second pause stored %d new bytes of blobs; %d stored in all", added, total)
		if added > total/3 {
			t.Fatalf("the second pause stored %d bytes of %d: not only what changed", added, total)
		}
		if b := keys(t, st, "bases/"); len(b) != 0 {
			t.Fatalf("the base stayed after the upload it served: %v", b)
		}
		s.dropLocalImage(t, id)
		// The largest blob is memory: flip one byte of it in the gateway's
		// files.
		var big objstore.Info
		for _, b := range keys(t, st, "blobs/") {
			if b.Size > big.Size {
				big = b
			}
		}
		p := gw.Path("lizard/" + big.Key)
		orig, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		bad := bytes.Clone(orig)
		bad[len(bad)/2] ^= 0x40
		if err := os.WriteFile(p, bad, 0o600); err != nil {
			t.Fatal(err)
		}
		var e struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		}
		code, body := s.do("POST", "/api/sandboxes/"+id+"/resume", nil, nil)
		json.Unmarshal(body, &e)
		if code != 409 || e.Code != "corrupt_object" || !strings.Contains(e.Message, big.Key) {
			t.Fatalf("resume from a corrupt object: %d %s; want 409 corrupt_object naming %s", code, body, big.Key)
		}
		if st := s.status(t, id); st != "paused" {
			t.Fatalf("after a refused resume: status %s, want paused", st)
		}
		if _, err := os.Stat(filepath.Join(s.dataDir, "sandboxes", id, "checkpoint")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("a corrupt download was left as the image: %v", err)
		}
		if err := os.WriteFile(p, orig, 0o600); err != nil {
			t.Fatal(err)
		}
		s.resume(t, id)
		pid3, n3 := s.counter(t, id)
		if pid3 != pid || n3 <= n2 {
			t.Fatalf("after the object was repaired: counter pid %d n %d, before pid %d n %d", pid3, n3, pid, n2)
		}
	})

	t.Run("KillRemovesObjects", func(t *testing.T) {
		s.pause(t, id)
		s.waitDurable(t, "/api/sandboxes/"+id)
		if len(keys(t, st, "blobs/")) == 0 {
			t.Fatal("no blobs for a durable image")
		}
		s.killRemovesObjects(t, st, id)
	})
}

// TestDurablePauseStoreDown: with the object store down the pause still
// succeeds at once, locally; the upload retries, and the sandbox becomes
// durable once the store is back (and resumes from it).
func TestDurablePauseStoreDown(t *testing.T) {
	gw, st, s := durableServer(t)
	id := s.create(t)
	s.sh(t, id, counterScript)
	pid, n := s.counter(t, id)

	gw.Stop()
	s.pause(t, id)
	if st := s.status(t, id); st != "paused" {
		t.Fatalf("status %s after a pause with the store down", st)
	}
	deadline := time.Now().Add(budget(time.Minute))
	for !strings.Contains(s.logs(), `msg="upload image; retrying"`) {
		if time.Now().After(deadline) {
			t.Fatal("no failed upload logged with the store down")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if d := s.durableAt(t, "/api/sandboxes/"+id); d != nil {
		t.Fatalf("durable at %s with the store down", *d)
	}
	if err := gw.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	s.waitDurable(t, "/api/sandboxes/"+id)
	s.dropLocalImage(t, id)
	s.resume(t, id)
	if pid2, n2 := s.counter(t, id); pid2 != pid || n2 <= n {
		t.Fatalf("after resume: counter pid %d n %d, before pid %d n %d", pid2, n2, pid, n)
	}
	s.killRemovesObjects(t, st, id)
}

// TestDurableSnapshot: a snapshot becomes durable; after a restart of the
// server with its local copy gone, a restore downloads it and the copy
// goes on from the snapshot's memory; deleting the snapshot removes its
// objects.
func TestDurableSnapshot(t *testing.T) {
	_, st, s := durableServer(t)
	src := s.create(t)
	s.sh(t, src, counterScript)
	pid, n := s.counter(t, src)
	snap := s.durableSnapshot(t, src, "durable")

	s.stop()
	if err := os.RemoveAll(filepath.Join(s.dataDir, "snapshots", snap.ID)); err != nil {
		t.Fatal(err)
	}
	s.start()
	var cp sandboxInfo
	if code, body := s.do("POST", "/api/sandboxes", map[string]any{"snapshotId": snap.ID}, &cp); code >= 300 {
		t.Fatalf("restore with the local image gone: %d %s", code, body)
	}
	if pid2, n2 := s.counter(t, cp.SandboxID); pid2 != pid || n2 < n {
		t.Fatalf("restored copy: counter pid %d n %d, snapshot's pid %d n >= %d", pid2, n2, pid, n)
	}
	if code, body := s.do("DELETE", "/api/sandboxes/"+cp.SandboxID, nil, nil); code >= 300 {
		t.Fatalf("kill copy: %d %s", code, body)
	}
	if code, body := s.do("DELETE", "/api/sandbox-snapshots/"+snap.ID, nil, nil); code >= 300 {
		t.Fatalf("delete snapshot: %d %s", code, body)
	}
	waitNoObjects(t, st)
}

type snapshotRef struct {
	ID string `json:"id"`
}

// durableSnapshot snapshots src as name, waits until the snapshot is
// durable and kills src.
func (s *server) durableSnapshot(t *testing.T, src, name string) snapshotRef {
	t.Helper()
	return s.durablePooledSnapshot(t, src, name, 0)
}

// durablePooledSnapshot is durableSnapshot with a warm pool of poolSize.
func (s *server) durablePooledSnapshot(t *testing.T, src, name string, poolSize int) snapshotRef {
	t.Helper()
	body := map[string]any{"name": name}
	if poolSize > 0 {
		body["poolSize"] = poolSize
	}
	var snap snapshotRef
	if code, body := s.do("POST", "/api/sandboxes/"+src+"/snapshot", body, &snap); code != 201 {
		t.Fatalf("snapshot: %d %s", code, body)
	}
	s.waitDurable(t, "/api/sandbox-snapshots/"+snap.ID)
	if code, body := s.do("DELETE", "/api/sandboxes/"+src, nil, nil); code >= 300 {
		t.Fatalf("kill source: %d %s", code, body)
	}
	return snap
}
