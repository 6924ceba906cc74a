package volume

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lizard-build/lizard/internal/durable"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/objstore"
	"github.com/lizard-build/lizard/internal/objstore/s3"
	"github.com/lizard-build/lizard/internal/objstore/vgwtest"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/store/sqlite"
)

// nodeView is one node's view of the shared records, as the cluster's
// NodeStore gives it: its writes claim the volume, it lists its own.
type nodeView struct {
	*sqlite.Store
	node string
}

func (n nodeView) InsertVolume(ctx context.Context, v store.Volume) error {
	v.Node = n.node
	return n.Store.InsertVolume(ctx, v)
}

func (n nodeView) UpdateVolume(ctx context.Context, v store.Volume) error {
	v.Node = n.node
	return n.Store.UpdateVolume(ctx, v)
}

func (n nodeView) Volumes(ctx context.Context) ([]store.Volume, error) {
	all, err := n.Store.Volumes(ctx)
	var out []store.Volume
	for _, v := range all {
		if v.Node == n.node {
			out = append(out, v)
		}
	}
	return out, err
}

// twoNodes is two managers, nodes a and b, on one database and one object
// store (a real versitygw).
func twoNodes(t *testing.T) (a, b *Manager, gw *vgwtest.Server, obj objstore.Store, projectID string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: loop-mounts ext4 images")
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("mkfs.ext4 is not installed")
	}
	lostNodes.Clear()
	gw = vgwtest.New(t)
	cfg, err := s3.ParseURL(gw.URL(""))
	if err != nil {
		t.Fatal(err)
	}
	cfg.AccessKey, cfg.SecretKey = gw.AccessKey, gw.SecretKey
	if obj, err = s3.New(cfg); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	st, pid := testStore(t, dir)
	images := durable.New(obj, nil)
	mk := func(node string) *Manager {
		m, err := New(Config{Dir: filepath.Join(dir, node), Store: nodeView{st, node}, Shared: st, Images: images, MaxSizeGB: 1,
			Gone: func(_ context.Context, node string) bool { _, ok := lostNodes.Load(node); return ok }})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			m.Close()
			// Whatever a failed test left mounted goes.
			ctx := context.Background()
			all, _ := st.Volumes(ctx)
			for _, v := range all {
				m.unmount(ctx, v.ID)
			}
		})
		return m
	}
	return mk("a"), mk("b"), gw, obj, pid
}

// lostNodes is the nodes the test declared dead (see lose).
var lostNodes sync.Map

// lose declares node dead, as the cluster does, through m.
func lose(t *testing.T, m *Manager, node string) {
	t.Helper()
	lostNodes.Store(node, true)
	if err := m.NodeLost(context.Background(), node); err != nil {
		t.Fatal(err)
	}
}

// synced waits until m's background sync of volume id is over (a bound
// against a hang only).
func synced(t *testing.T, m *Manager, id string) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Minute); m.Syncing(id); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("volume %s still syncing after 2 minutes", id)
		}
	}
}

func writeFile(t *testing.T, dir, name, data string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, dir, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestMoveBetweenNodes: a volume written on node a and detached is synced;
// attached on b it holds the data and moves to b; a's copy goes; a node
// lost while the volume was attached leaves it at its last sync, stale;
// a corrupt object is refused and leaves nothing; delete removes the
// objects.
func TestMoveBetweenNodes(t *testing.T) {
	a, b, _, obj, pid := twoNodes(t)
	ctx := context.Background()
	v, err := a.Create(ctx, pid, "data", 1, "", false)
	if err != nil {
		t.Fatal(err)
	}

	// Written on a, detached: synced.
	_, dir, err := a.Attach(ctx, pid, "data", "sb_1")
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, dir, "hello", "from a")
	if err := a.Detach(ctx, "sb_1"); err != nil {
		t.Fatal(err)
	}
	synced(t, a, v.ID)
	got, err := a.Get(ctx, pid, "data")
	if err != nil || got.Version != 1 || got.SyncedVersion != 1 || got.SyncedAt == nil || got.Stale {
		t.Fatalf("after the detach on a: %+v %v", got, err)
	}
	if _, err := obj.Stat(ctx, "images/"+ImageName(v.ID)+"/manifest.json"); err != nil {
		t.Fatalf("no manifest of the volume in the object store: %v", err)
	}

	// Attached on b: fetched, b holds it, a's copy is gone.
	_, dir, err = b.Attach(ctx, pid, "data", "sb_2")
	if err != nil {
		t.Fatal(err)
	}
	if s := readFile(t, dir, "hello"); s != "from a" {
		t.Fatalf("on b the file holds %q", s)
	}
	var st unix.Stat_t
	if err := unix.Stat(b.image(v.ID), &st); err != nil || st.Blocks*512 > st.Size/4 {
		t.Fatalf("the fetched image is not sparse: %d bytes allocated of %d (%v)", st.Blocks*512, st.Size, err)
	}
	if _, err := a.Get(ctx, pid, "data"); err != nil {
		t.Fatalf("a still finds the volume (now on b): %v", err)
	}
	if err := a.Reconcile(ctx, func(string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(a.image(v.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a keeps the image of a volume now on b: %v", err)
	}
	if _, _, err := a.Attach(ctx, pid, "data", "sb_3"); errdefs.Code(err) != "volume_in_use" {
		t.Fatalf("attach on a while b holds it: %v; want volume_in_use", err)
	}

	// b writes more, then is lost with the volume attached: it stays at
	// its last sync (a's), flagged stale, and a may attach it.
	writeFile(t, dir, "hello", "from b, never synced")
	lose(t, a, "b")
	b.unmount(ctx, v.ID) // what b's death does to its mount
	got, err = a.Get(ctx, pid, "data")
	if err != nil || !got.Stale || got.AttachedTo != "" || got.SyncedVersion != 1 {
		t.Fatalf("after b was lost: %+v %v; want stale, detached, at version 1", got, err)
	}
	_, dir, err = a.Attach(ctx, pid, "data", "sb_4")
	if err != nil {
		t.Fatal(err)
	}
	if s := readFile(t, dir, "hello"); s != "from a" {
		t.Fatalf("after b was lost a sees %q; want the last sync's %q", s, "from a")
	}
	writeFile(t, dir, "more", "x")
	if err := a.Detach(ctx, "sb_4"); err != nil {
		t.Fatal(err)
	}
	synced(t, a, v.ID)
	got, _ = a.Get(ctx, pid, "data")
	if got.Stale || got.SyncedVersion != got.Version || got.Version != 2 {
		t.Fatalf("after a synced it again: %+v; want not stale, version 2 synced", got)
	}

	// A corrupt chunk is refused on b, which keeps nothing.
	var blobs []string
	obj.List(ctx, "blobs/", func(i objstore.Info) error { blobs = append(blobs, i.Key); return nil })
	if len(blobs) == 0 {
		t.Fatal("no blobs in the object store")
	}
	for _, k := range blobs {
		if _, err := obj.Put(ctx, k, bytes.NewReader([]byte("not what was stored"))); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := b.Attach(ctx, pid, "data", "sb_5"); errdefs.Code(err) != "corrupt_object" || !strings.Contains(err.Error(), "blobs/") {
		t.Fatalf("attach from corrupt objects: %v; want corrupt_object naming the blob", err)
	}
	if _, err := os.Stat(b.image(v.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("b kept an image fetched from corrupt objects: %v", err)
	}
	if got, _ := a.Get(ctx, pid, "data"); got.AttachedTo != "" {
		t.Fatalf("a refused attach left the volume attached to %s", got.AttachedTo)
	}

	// Delete (through b: the record is a's) removes the objects.
	if err := b.Delete(ctx, pid, "data"); err != nil {
		t.Fatal(err)
	}
	var left []string
	obj.List(ctx, "", func(i objstore.Info) error { left = append(left, i.Key); return nil })
	if len(left) > 0 {
		t.Fatalf("objects left after delete: %v", left)
	}
}

// TestNeverSynced: a volume never attached moves as a new empty one; one
// attached on a lost node that never synced is refused elsewhere.
func TestNeverSynced(t *testing.T) {
	a, b, _, _, pid := twoNodes(t)
	ctx := context.Background()
	if _, err := a.Create(ctx, pid, "empty", 1, "", false); err != nil {
		t.Fatal(err)
	}
	_, dir, err := b.Attach(ctx, pid, "empty", "sb_1")
	if err != nil {
		t.Fatalf("attach a never-attached volume elsewhere: %v", err)
	}
	writeFile(t, dir, "f", "x")
	lose(t, b, "b")
	all, _ := b.all(ctx)
	for _, v := range all {
		b.unmount(ctx, v.ID)
	}
	// b was "lost" without a sync: the data is nowhere else.
	if _, _, err := a.Attach(ctx, pid, "empty", "sb_2"); errdefs.Code(err) != "volume_not_synced" {
		t.Fatalf("attach of a volume lost before its first sync: %v; want volume_not_synced", err)
	}
}

// TestBackgroundSync: a detach returns before the sync; an attach on
// another node meanwhile waits for it and sees the data; an attach on the
// same node cancels it (the data is there) and the next detach syncs; a
// sync while the object store is down is retried until it is back.
func TestBackgroundSync(t *testing.T) {
	a, b, gw, _, pid := twoNodes(t)
	ctx := context.Background()
	v, err := a.Create(ctx, pid, "bg", 1, "", false)
	if err != nil {
		t.Fatal(err)
	}

	// Attached again on a at once: the sync stops, nothing is lost.
	_, dir, err := a.Attach(ctx, pid, "bg", "sb_1")
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, dir, "f", "one")
	if err := a.Detach(ctx, "sb_1"); err != nil {
		t.Fatal(err)
	}
	_, dir, err = a.Attach(ctx, pid, "bg", "sb_2")
	if err != nil {
		t.Fatal(err)
	}
	if a.Syncing(v.ID) {
		t.Fatal("a sync still runs while the volume is attached again")
	}
	if s := readFile(t, dir, "f"); s != "one" {
		t.Fatalf("attached again on a: %q", s)
	}
	writeFile(t, dir, "f", "two")

	// Detached on a with the store down, so that its sync is pending;
	// attached on b meanwhile: b waits for a's sync, retried once the
	// store is back, and sees the last write.
	gw.Stop()
	if err := a.Detach(ctx, "sb_2"); err != nil {
		t.Fatal(err)
	}
	if !a.Syncing(v.ID) {
		t.Fatal("no sync pending on a with the store down")
	}
	type attached struct {
		dir string
		err error
	}
	done := make(chan attached, 1)
	go func() {
		_, dir, err := b.Attach(ctx, pid, "bg", "sb_3")
		done <- attached{dir, err}
	}()
	if err := gw.Start(ctx); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if dir, err = res.dir, res.err; err != nil {
		t.Fatal(err)
	}
	if s := readFile(t, dir, "f"); s != "two" {
		t.Fatalf("attached on b right after the detach on a: %q, want %q", s, "two")
	}
	got, _ := b.Get(ctx, pid, "bg")
	if got.Node != "b" || got.Stale || got.SyncedVersion != got.Version-1 {
		t.Fatalf("on b: %+v", got)
	}

	// The store down at the detach: the sync is retried until it is back.
	writeFile(t, dir, "f", "three")
	gw.Stop()
	if err := b.Detach(ctx, "sb_3"); err != nil {
		t.Fatal(err)
	}
	if !b.Syncing(v.ID) {
		t.Fatal("no sync pending with the store down")
	}
	if err := gw.Start(ctx); err != nil {
		t.Fatal(err)
	}
	synced(t, b, v.ID)
	got, _ = b.Get(ctx, pid, "bg")
	if got.SyncedVersion != got.Version || got.SyncedAt == nil {
		t.Fatalf("after the store came back: %+v", got)
	}
	_, dir, err = a.Attach(ctx, pid, "bg", "sb_4")
	if err != nil {
		t.Fatal(err)
	}
	if s := readFile(t, dir, "f"); s != "three" {
		t.Fatalf("attached on a after b's retried sync: %q", s)
	}
	if err := a.Detach(ctx, "sb_4"); err != nil {
		t.Fatal(err)
	}
}

// TestRelease: a volume released for a move (its sandbox paused) is
// unmounted and synced and stays attached to the sandbox; the node that
// resumes the sandbox attaches it with the same sandbox id, fetching it;
// what the sandbox writes there syncs at its detach. Taken back on its
// node instead (a failed move), it counts as changed again.
func TestRelease(t *testing.T) {
	a, b, _, _, pid := twoNodes(t)
	ctx := context.Background()
	v, err := a.Create(ctx, pid, "rel", 1, "", false)
	if err != nil {
		t.Fatal(err)
	}
	_, dir, err := a.Attach(ctx, pid, "rel", "sb_1")
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, dir, "f", "before the move")

	// A failed move: released, then mounted again on a.
	if err := a.Release(ctx, "sb_1"); err != nil {
		t.Fatal(err)
	}
	if mounted(a.mountDir(v.ID)) {
		t.Fatal("still mounted after the release")
	}
	got, _ := a.Get(ctx, pid, "rel")
	if got.AttachedTo != "sb_1" || got.SyncedVersion != got.Version || got.Node != "a" {
		t.Fatalf("after the release: %+v; want attached to sb_1, synced, on a", got)
	}
	if err := a.Mount(ctx, v.ID); err != nil {
		t.Fatal(err)
	}
	if got, _ := a.Get(ctx, pid, "rel"); got.SyncedVersion >= got.Version {
		t.Fatalf("mounted again for its sandbox: %+v; want a version past the sync", got)
	}
	writeFile(t, dir, "f", "moved")

	// The move: released, attached on b by the same sandbox.
	if err := a.Release(ctx, "sb_1"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.Attach(ctx, pid, "rel", "sb_2"); errdefs.Code(err) != "volume_in_use" {
		t.Fatalf("another sandbox attaching a released volume: %v; want volume_in_use", err)
	}
	_, dir, err = b.Attach(ctx, pid, "rel", "sb_1")
	if err != nil {
		t.Fatal(err)
	}
	if s := readFile(t, dir, "f"); s != "moved" {
		t.Fatalf("on b after the move: %q", s)
	}
	got, _ = b.Get(ctx, pid, "rel")
	if got.Node != "b" || got.AttachedTo != "sb_1" || got.SyncedVersion >= got.Version {
		t.Fatalf("on b: %+v; want b's, attached to sb_1, changed since the sync", got)
	}
	writeFile(t, dir, "g", "on b")
	if err := b.Detach(ctx, "sb_1"); err != nil {
		t.Fatal(err)
	}
	synced(t, b, v.ID)
	_, dir, err = a.Attach(ctx, pid, "rel", "sb_3")
	if err != nil {
		t.Fatal(err)
	}
	if s := readFile(t, dir, "g"); s != "on b" {
		t.Fatalf("back on a: %q", s)
	}
	writeFile(t, dir, "h", "released")
	if err := a.Release(ctx, "sb_3"); err != nil {
		t.Fatal(err)
	}

	// Its sandbox killed on b before any node resumed it: a released
	// volume is free again, and attachable anywhere.
	if err := b.Detach(ctx, "sb_3"); err != nil {
		t.Fatal(err)
	}
	if got, _ := b.Get(ctx, pid, "rel"); got.AttachedTo != "" || got.Node != "a" {
		t.Fatalf("after its released sandbox was killed on b: %+v; want detached, on a", got)
	}
	_, dir, err = b.Attach(ctx, pid, "rel", "sb_4")
	if err != nil {
		t.Fatal(err)
	}
	if s := readFile(t, dir, "h"); s != "released" {
		t.Fatalf("on b: %q", s)
	}
	if err := b.Detach(ctx, "sb_4"); err != nil {
		t.Fatal(err)
	}
	synced(t, b, v.ID)
}
