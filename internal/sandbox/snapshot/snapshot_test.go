package snapshot

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/durable"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/runtime"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/sandbox/sandboxtest"
	"github.com/lizard-build/lizard/internal/store"
)

// Tests over the fake runtime (package runtime/fake): no root.

// env is a core and its snapshots over the fake; start again over the
// same env is the server restarted.
type env struct {
	*sandboxtest.Env
	limits store.Limits
}

func newEnv(t *testing.T) *env { return &env{Env: sandboxtest.NewEnv(t)} }

// start builds and recovers a core and a Manager, closed at the test's end.
func (e *env) start(t *testing.T) (*sandbox.Service, *Manager) {
	t.Helper()
	limits := func(context.Context, string) (store.Limits, error) { return e.limits, nil }
	core := sandbox.New(sandbox.Config{
		Runtime: e.Runtime, Store: e.Store, Templates: e.Templates, SnapshotDir: e.SnapshotDir, Limits: limits,
		Logger: sandboxtest.Logger(t), AgentReadyTimeout: 10 * time.Second, RecoverProbeTimeout: 2 * time.Second,
	})
	m := New(Config{Core: core, Runtime: e.Runtime, Store: e.Store, Dir: e.SnapshotDir, Limits: limits, Logger: sandboxtest.Logger(t)})
	t.Cleanup(func() { m.Close(); core.Close() })
	if err := m.Recover(context.Background()); err != nil {
		t.Fatalf("snapshots' Recover: %v", err)
	}
	if err := core.Recover(context.Background()); err != nil {
		t.Fatalf("core's Recover: %v", err)
	}
	return core, m
}

func (e *env) create(t *testing.T, core *sandbox.Service) sandbox.Record {
	t.Helper()
	rec, err := core.Create(context.Background(), sandbox.CreateRequest{ProjectID: e.Project.ID})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	return rec
}

// run runs script in sandbox id and returns its stdout.
func (e *env) run(t *testing.T, core *sandbox.Service, id, script string) string {
	t.Helper()
	return sandboxtest.Stdout(t, script+" in "+id, func(on func(agent.Event) error) error {
		return core.Exec(context.Background(), e.Project.ID, id, sandbox.ExecRequest{Cmd: []string{script}, Shell: true}, on)
	})
}

// runtimeCount is how many sandboxes the fake runtime holds.
func (e *env) runtimeCount() int {
	list, _ := e.Runtime.List(context.Background())
	return len(list)
}

func TestTakeRestoreFork(t *testing.T) {
	e := newEnv(t)
	core, m := e.start(t)
	ctx := context.Background()
	src := e.create(t, core)
	e.run(t, core, src.ID, `echo from-source > "$HOME/f"`)
	snap, err := m.Take(ctx, e.Project.ID, src.ID, "snap", 0)
	if err != nil {
		t.Fatalf("Take: %v", err)
	}
	if snap.Name != "snap" || snap.SourceID != src.ID || snap.ProjectID != e.Project.ID || snap.Template != src.Template {
		t.Fatalf("snapshot: %+v", snap)
	}
	if _, err := os.Stat(filepath.Join(e.SnapshotDir, snap.ID, runtime.ImageFile)); err != nil {
		t.Fatalf("the image: %v", err)
	}
	e.run(t, core, src.ID, `echo later > "$HOME/f"`)
	copy, err := m.Restore(ctx, e.Project.ID, snap.ID, 0)
	if err != nil {
		t.Fatalf("Restore: %v", err)
	}
	if copy.ID == src.ID || copy.AgentToken == src.AgentToken || copy.SnapshotID != snap.ID {
		t.Fatalf("the copy: %+v", copy)
	}
	if got := e.run(t, core, copy.ID, `cat "$HOME/f"`); got != "from-source\n" {
		t.Fatalf("restored copy: %q", got)
	}
	forks, err := m.Fork(ctx, e.Project.ID, src.ID, 2, 0)
	if err != nil {
		t.Fatalf("Fork: %v", err)
	}
	if len(forks) != 2 {
		t.Fatalf("%d forks, want 2", len(forks))
	}
	for _, f := range forks {
		if f.Err != nil {
			t.Fatalf("fork: %v", f.Err)
		}
		if f.Sandbox.SnapshotID != "" {
			t.Fatalf("a fork names a snapshot: %q", f.Sandbox.SnapshotID)
		}
		if got := e.run(t, core, f.Sandbox.ID, `cat "$HOME/f"; echo mine > "$HOME/f"`); got != "later\n" {
			t.Fatalf("fork %s: %q", f.Sandbox.ID, got)
		}
	}
	if got := e.run(t, core, src.ID, `cat "$HOME/f"`); got != "later\n" {
		t.Fatalf("a fork's write reached the source: %q", got)
	}
	// A fork's image goes with it.
	if ents, _ := os.ReadDir(filepath.Join(e.SnapshotDir, "forks")); len(ents) != 0 {
		t.Fatalf("a fork left its image: %v", ents)
	}
	if err := m.Delete(ctx, e.Project.ID, snap.ID); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if _, err := os.Stat(filepath.Join(e.SnapshotDir, snap.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the deleted snapshot's image: %v", err)
	}
	if _, err := m.Restore(ctx, e.Project.ID, snap.ID, 0); !errors.Is(err, errdefs.ErrNotFound) || errdefs.Code(err) != "snapshot_not_found" {
		t.Fatalf("restore of a deleted snapshot: %v", err)
	}
	// The copy restored from it is independent.
	if got := e.run(t, core, copy.ID, `cat "$HOME/f"`); got != "from-source\n" {
		t.Fatalf("the copy after its snapshot went: %q", got)
	}
}

// TestBadInput: each refusal names what is wrong, and takes nothing.
func TestBadInput(t *testing.T) {
	e := newEnv(t)
	core, m := e.start(t)
	ctx := context.Background()
	src := e.create(t, core)
	for _, tc := range []struct {
		name string
		err  error
		want error
		in   string
	}{
		{"pool size", errOf(m.Take(ctx, e.Project.ID, src.ID, "", MaxPoolSize+1)), errdefs.ErrInvalid, "poolSize"},
		{"unknown sandbox", errOf(m.Take(ctx, e.Project.ID, "nosuch", "", 0)), errdefs.ErrNotFound, "nosuch"},
		{"another project's sandbox", errOf(m.Take(ctx, "prj_other", src.ID, "", 0)), errdefs.ErrNotFound, src.ID},
		{"fork count", errOf(m.Fork(ctx, e.Project.ID, src.ID, 0, 0)), errdefs.ErrInvalid, "count"},
		{"fork count high", errOf(m.Fork(ctx, e.Project.ID, src.ID, MaxFork+1, 0)), errdefs.ErrInvalid, "count"},
		{"fork timeout", errOf(m.Fork(ctx, e.Project.ID, src.ID, 1, -1)), errdefs.ErrInvalid, "timeoutMs"},
		{"restore timeout", errOf(m.Restore(ctx, e.Project.ID, "snap_x", -1)), errdefs.ErrInvalid, "timeoutMs"},
		{"unknown snapshot", errOf(m.Get(e.Project.ID, "snap_x")), errdefs.ErrNotFound, "snap_x"},
	} {
		if !errors.Is(tc.err, tc.want) || !strings.Contains(tc.err.Error(), tc.in) {
			t.Errorf("%s: %v, want %v naming %q", tc.name, tc.err, tc.want, tc.in)
		}
	}
	if list := m.List(e.Project.ID); len(list) != 0 {
		t.Fatalf("refused calls left snapshots: %+v", list)
	}
	// A paused sandbox cannot be snapshotted, and leaves no image.
	if err := core.Pause(ctx, e.Project.ID, src.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Take(ctx, e.Project.ID, src.ID, "", 0); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("snapshot of a paused sandbox: %v", err)
	}
	if ents, _ := os.ReadDir(e.SnapshotDir); len(ents) != 0 {
		t.Fatalf("a refused snapshot left %v", ents)
	}
}

func errOf[T any](_ T, err error) error { return err }

// TestListPerProject: snapshots are listed and found per project, oldest
// first.
func TestListPerProject(t *testing.T) {
	e := newEnv(t)
	core, m := e.start(t)
	ctx := context.Background()
	src := e.create(t, core)
	a, err := m.Take(ctx, e.Project.ID, src.ID, "a", 0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Take(ctx, e.Project.ID, src.ID, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	if b.Name != "Snapshot "+src.ID {
		t.Fatalf("default name: %q", b.Name)
	}
	if list := m.List(e.Project.ID); len(list) != 2 || list[0].ID != a.ID || list[1].ID != b.ID {
		t.Fatalf("List: %+v", list)
	}
	if _, err := m.Get("prj_other", a.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another project's snapshot: %v, want ErrNotFound", err)
	}
	if len(m.List("prj_other")) != 0 {
		t.Fatalf("another project lists the snapshots")
	}
	if err := m.Delete(ctx, "prj_other", a.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another project's delete: %v", err)
	}
}

// TestWarmPool: a snapshot's pool is filled, a restore claims a copy and
// the pool refills, a smaller pool size trims it, a paused pool empties and
// a resumed one fills again; a delete takes the copies with it.
func TestWarmPool(t *testing.T) {
	e := newEnv(t)
	core, m := e.start(t)
	ctx := context.Background()
	src := e.create(t, core)
	e.run(t, core, src.ID, `echo pooled > "$HOME/f"`)
	snap, err := m.Take(ctx, e.Project.ID, src.ID, "pool", 2)
	if err != nil {
		t.Fatalf("Take: %v", err)
	}
	ready := func(n int) func() bool {
		return func() bool {
			info, err := m.Get(e.Project.ID, snap.ID)
			return err == nil && info.ReadyCount == n && core.Pooled(snap.ID) == n
		}
	}
	sandboxtest.Eventually(t, "the pool to fill", ready(2))
	if pools := m.WarmPools(); len(pools) != 1 || pools[0].Ready != 2 || pools[0].Target != 2 {
		t.Fatalf("WarmPools: %+v", pools)
	}
	before := e.runtimeCount()
	got, err := m.Restore(ctx, e.Project.ID, snap.ID, 0)
	if err != nil {
		t.Fatalf("Restore: %v", err)
	}
	if e.runtimeCount() != before {
		t.Fatalf("the restore made a sandbox instead of claiming a warm copy")
	}
	if out := e.run(t, core, got.ID, `cat "$HOME/f"`); out != "pooled\n" {
		t.Fatalf("claimed copy: %q", out)
	}
	sandboxtest.Eventually(t, "the pool to refill", ready(2))
	one := 1
	if _, err := m.Update(ctx, e.Project.ID, snap.ID, &one, nil); err != nil {
		t.Fatalf("Update: %v", err)
	}
	sandboxtest.Eventually(t, "the pool to trim", ready(1))
	paused := true
	if info, err := m.Update(ctx, e.Project.ID, snap.ID, nil, &paused); err != nil || !info.PoolPaused {
		t.Fatalf("pause the pool: %+v %v", info, err)
	}
	sandboxtest.Eventually(t, "the paused pool to empty", ready(0))
	if pools := m.WarmPools(); len(pools) != 1 || pools[0].Target != 0 {
		t.Fatalf("WarmPools of a paused pool: %+v", pools)
	}
	paused = false
	if _, err := m.Update(ctx, e.Project.ID, snap.ID, nil, &paused); err != nil {
		t.Fatal(err)
	}
	sandboxtest.Eventually(t, "the resumed pool to fill", ready(1))
	if err := m.Delete(ctx, e.Project.ID, snap.ID); err != nil {
		t.Fatal(err)
	}
	// The source and the claimed copy are left.
	sandboxtest.Eventually(t, "the runtime to hold two sandboxes", func() bool { return e.runtimeCount() == 2 })
}

// TestPoolQuota: a pool's copies count against the project's sandboxes.
func TestPoolQuota(t *testing.T) {
	e := newEnv(t)
	e.limits = store.Limits{Sandboxes: 3}
	core, m := e.start(t)
	ctx := context.Background()
	src := e.create(t, core)
	if _, err := m.Take(ctx, e.Project.ID, src.ID, "", 3); !errors.Is(err, errdefs.ErrQuota) || !strings.Contains(err.Error(), "poolSize 3") {
		t.Fatalf("a pool over the quota: %v", err)
	}
	snap, err := m.Take(ctx, e.Project.ID, src.ID, "", 2)
	if err != nil {
		t.Fatal(err)
	}
	sandboxtest.Eventually(t, "the pool to fill", func() bool { return core.Pooled(snap.ID) == 2 })
	three := 3
	if _, err := m.Update(ctx, e.Project.ID, snap.ID, &three, nil); !errors.Is(err, errdefs.ErrQuota) {
		t.Fatalf("a bigger pool over the quota: %v", err)
	}
	// A fork of two would take the project over its limit: nothing is made.
	if _, err := m.Fork(ctx, e.Project.ID, src.ID, 2, 0); !errors.Is(err, errdefs.ErrQuota) {
		t.Fatalf("a fork over the quota: %v", err)
	}
}

// TestRecoverPools: after a restart the snapshots are back and restorable,
// their pools filled again, the warm copies of a snapshot deleted while the
// server was down removed, and images without a record removed.
func TestRecoverPools(t *testing.T) {
	e := newEnv(t)
	core, m := e.start(t)
	ctx := context.Background()
	src := e.create(t, core)
	e.run(t, core, src.ID, `echo kept > "$HOME/f"`)
	kept, err := m.Take(ctx, e.Project.ID, src.ID, "kept", 1)
	if err != nil {
		t.Fatal(err)
	}
	gone, err := m.Take(ctx, e.Project.ID, src.ID, "gone", 1)
	if err != nil {
		t.Fatal(err)
	}
	sandboxtest.Eventually(t, "both pools to fill", func() bool { return core.Pooled(kept.ID) == 1 && core.Pooled(gone.ID) == 1 })
	m.Close()
	core.Close()
	// While the server is down: gone's record is deleted, a stray image
	// appears.
	if err := e.Store.DeleteSnapshot(ctx, gone.ID); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(e.SnapshotDir, "snap_stray"), 0o700); err != nil {
		t.Fatal(err)
	}
	core, m = e.start(t)
	if _, err := m.Get(e.Project.ID, gone.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("a deleted snapshot came back: %v", err)
	}
	if _, err := os.Stat(filepath.Join(e.SnapshotDir, "snap_stray")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("an image without a record stayed: %v", err)
	}
	sandboxtest.Eventually(t, "the deleted snapshot's warm copy to go", func() bool { return core.Pooled(gone.ID) == 0 })
	sandboxtest.Eventually(t, "the kept pool", func() bool { return core.Pooled(kept.ID) == 1 })
	got, err := m.Restore(ctx, e.Project.ID, kept.ID, 0)
	if err != nil {
		t.Fatalf("Restore after a restart: %v", err)
	}
	if out := e.run(t, core, got.ID, `cat "$HOME/f"`); out != "kept\n" {
		t.Fatalf("restored after a restart: %q", out)
	}
	// The source, the claimed copy and kept's refilled copy.
	sandboxtest.Eventually(t, "three sandboxes in the runtime", func() bool { return e.runtimeCount() == 3 })
}

// TestUsesRootfs: a snapshot keeps the template version it was taken on.
func TestUsesRootfs(t *testing.T) {
	e := newEnv(t)
	core, m := e.start(t)
	src := e.create(t, core)
	if m.UsesRootfs(src.Rootfs) {
		t.Fatal("a version in use with no snapshot")
	}
	if _, err := m.Take(context.Background(), e.Project.ID, src.ID, "", 0); err != nil {
		t.Fatal(err)
	}
	if !m.UsesRootfs(src.Rootfs) || m.UsesRootfs("/elsewhere/rootfs") {
		t.Fatal("UsesRootfs does not follow the snapshot's version")
	}
}

// TestSnapshotReservations: snapshots being taken hold their place.
func TestSnapshotReservations(t *testing.T) {
	limits := func(context.Context, string) (store.Limits, error) { return store.Limits{Snapshots: 2}, nil }
	m := New(Config{Limits: limits})
	m.snapshots["snap_a"] = &entry{snap: Snapshot{ID: "snap_a", Saved: sandbox.Saved{ProjectID: "p"}}}
	m.snapshots["snap_q"] = &entry{snap: Snapshot{ID: "snap_q", Saved: sandbox.Saved{ProjectID: "q"}}}
	release, err := m.reserve(context.Background(), "p")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.reserve(context.Background(), "p"); !errors.Is(err, errdefs.ErrQuota) || !strings.Contains(err.Error(), "snapshots 2 of 2 in use") {
		t.Fatalf("third snapshot: %v", err)
	}
	release()
	release()
	if _, err := m.reserve(context.Background(), "p"); err != nil {
		t.Fatalf("after release: %v", err)
	}

	// In a cluster, the project's snapshots on every node count.
	c := New(Config{Limits: limits, ProjectSnapshots: func(_ context.Context, project string) (int, error) {
		return map[string]int{"p": 2, "q": 1}[project], nil
	}})
	if _, err := c.reserve(context.Background(), "p"); !errors.Is(err, errdefs.ErrQuota) || !strings.Contains(err.Error(), "snapshots 2 of 2 in use") {
		t.Fatalf("with 2 on other nodes: %v", err)
	}
	if _, err := c.reserve(context.Background(), "q"); err != nil {
		t.Fatalf("with 1 on other nodes: %v", err)
	}
	if _, err := c.reserve(context.Background(), "q"); !errors.Is(err, errdefs.ErrQuota) {
		t.Fatalf("1 elsewhere and 1 being taken here: %v", err)
	}
}

// poolStore is a cluster node's store as far as pools go: its name.
type poolStore struct {
	store.Store
	node string
}

func (p poolStore) Node() string                                           { return p.node }
func (p poolStore) AdoptPool(context.Context, string, string) error        { return nil }
func (p poolStore) AdoptedPools(context.Context) ([]store.Snapshot, error) { return nil, nil }

// TestLoadPools: recovery keeps a node's own snapshots, with their pool
// here or on the node that adopted it, and another node's only when this
// node keeps its pool and its image is durable (a foreign entry, which
// does not count against the project's snapshots here).
func TestLoadPools(t *testing.T) {
	m := New(Config{Core: nopCore{}, Store: poolStore{node: "b"}, Limits: func(context.Context, string) (store.Limits, error) { return store.Limits{Snapshots: 1}, nil }})
	durable := time.Now()
	for _, tc := range []struct {
		name        string
		row         store.Snapshot
		durable     bool
		ok, foreign bool
		poolHere    bool
	}{
		{"own, pool here", store.Snapshot{Node: "b"}, false, true, false, true},
		{"own, pool adopted elsewhere", store.Snapshot{Node: "b", PoolNode: "c"}, true, true, false, false},
		{"another's, pool here", store.Snapshot{Node: "a", PoolNode: "b"}, true, true, true, true},
		{"another's, pool here, not durable", store.Snapshot{Node: "a", PoolNode: "b"}, false, false, false, false},
		{"another's, pool elsewhere", store.Snapshot{Node: "a", PoolNode: "c"}, true, false, false, false},
	} {
		snap := Snapshot{ID: "snap_x", Saved: sandbox.Saved{ProjectID: "p"}}
		if tc.durable {
			snap.DurableAt = &durable
		}
		tc.row.ID, tc.row.ProjectID = "snap_x", "p"
		se, ok := m.load(tc.row, snap)
		if ok != tc.ok {
			t.Fatalf("%s: kept %v, want %v", tc.name, ok, tc.ok)
		}
		if !ok {
			continue
		}
		m.mu.Lock()
		here := m.poolHereLocked(se)
		m.mu.Unlock()
		if se.foreign != tc.foreign || here != tc.poolHere {
			t.Fatalf("%s: foreign %v, pool here %v; want %v, %v", tc.name, se.foreign, here, tc.foreign, tc.poolHere)
		}
		// The metrics count a pool where it is kept.
		se.snap.PoolSize = 2
		m.snapshots["snap_x"] = se
		if got := len(m.WarmPools()); got != map[bool]int{true: 1, false: 0}[tc.poolHere] {
			t.Fatalf("%s: %d warm pools in the metrics", tc.name, got)
		}
		delete(m.snapshots, "snap_x")
		if se.foreign {
			// Another node's record: this node's project limit of one
			// snapshot still has room.
			m.snapshots["snap_x"] = se
			release, err := m.reserve(context.Background(), "p")
			if err != nil {
				t.Fatalf("%s: a foreign entry counted as a snapshot here: %v", tc.name, err)
			}
			release()
			delete(m.snapshots, "snap_x")
		}
	}
}

// nopCore is a core with no warm copies.
type nopCore struct{ Core }

func (nopCore) Pooled(string) int { return 0 }

// buildImages holds one image written by runsc build digest ("": its
// manifest does not say).
type buildImages struct {
	sandbox.Images
	digest string
}

func (b buildImages) Stat(context.Context, string) (durable.Manifest, error) {
	m := durable.Manifest{Name: "snapshots/snap_x"}
	if b.digest != "" {
		m.Checkpoint = []byte(`{"runscVersion":"runsc x","runscDigest":"` + b.digest + `"}`)
	}
	return m, nil
}

// buildRuntime is a runtime of runsc build digest.
type buildRuntime struct {
	runtime.Runtime
	digest string
}

func (b buildRuntime) RunscDigest(context.Context) (string, error) { return b.digest, nil }

// TestAdoptSameBuild: a node adopts only pools whose image its runsc build
// restores; it says so before downloading anything.
func TestAdoptSameBuild(t *testing.T) {
	for _, tc := range []struct {
		image, node string
		ok          bool
	}{
		{"sha256:aaa", "sha256:aaa", true},
		{"", "sha256:aaa", true}, // an image that does not say: the restore checks
		{"sha256:aaa", "sha256:bbb", false},
	} {
		m := New(Config{Runtime: buildRuntime{digest: tc.node}, Images: buildImages{digest: tc.image}})
		err := m.sameBuild(context.Background(), "snapshots/snap_x")
		if tc.ok != (err == nil) || err != nil && (!errors.Is(err, errdefs.ErrConflict) || errdefs.Code(err) != "incompatible_checkpoint") {
			t.Fatalf("image of %q on a node of %q: %v, want ok %v", tc.image, tc.node, err, tc.ok)
		}
	}
}
