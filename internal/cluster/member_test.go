package cluster

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/store/postgres"
	"github.com/lizard-build/lizard/internal/store/postgres/pgtest"
	"github.com/lizard-build/lizard/internal/store/storetest"
)

// Short leases so that the tests see lapses; what they assert never
// depends on how long anything took.
const (
	testLease     = 300 * time.Millisecond
	testDeadAfter = time.Second
)

// openDB opens a fresh database on srv (one handle per node, as separate
// servers have).
func openDB(t *testing.T, url string) *postgres.Store {
	t.Helper()
	st, err := postgres.Open(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func newDB(t *testing.T, srv *pgtest.Server) string {
	t.Helper()
	url, err := srv.NewDatabase(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return url
}

// startMember starts a member named name on its own handle of url.
func startMember(t *testing.T, url, name string, onFenced func(context.Context, func(string) bool)) *Member {
	t.Helper()
	m, err := NewMember(MemberConfig{
		DB: openDB(t, url),
		Info: func() store.NodeInfo {
			return store.NodeInfo{Name: name, Address: name + ":7070", VCPUs: 4, MemoryMB: 4096}
		},
		Lease:     testLease,
		DeadAfter: testDeadAfter,
		OnFenced:  onFenced,
		Log:       slog.New(slog.NewTextHandler(t.Output(), nil)).With("member", name),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

// eventually polls cond until it holds (30 s at most).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stateOf reads a node's state straight from the database.
func stateOf(t *testing.T, db store.Cluster, name string) string {
	t.Helper()
	return storetest.NodeOf(t, context.Background(), db, name).State
}

func project(t *testing.T, db store.Store) store.Project {
	t.Helper()
	p, err := db.CreateProject(context.Background(), "p", "")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func row(p store.Project, id, status string) store.Sandbox {
	return store.Sandbox{ID: id, ProjectID: p.ID, Template: "base", Size: "s", Status: status, Spec: []byte(`{}`), StartedAt: time.Now(), CPUs: 1, MemoryMB: 256}
}

// TestMemberDeath: a member that stops heartbeating is suspect, then the
// other declares it dead and its sandboxes lost.
func TestMemberDeath(t *testing.T) {
	srv := pgtest.ForTest(t)
	url := newDB(t, srv)
	a := startMember(t, url, "a", nil)
	b := startMember(t, url, "b", nil)
	db := openDB(t, url)
	p := project(t, db)
	nb := NewNodeStore(b, NodeStoreConfig{Holding: []string{"running"}})
	if err := nb.PutSandbox(context.Background(), row(p, "sb1", "running")); err != nil {
		t.Fatal(err)
	}
	if !a.Healthy() || !b.Healthy() {
		t.Fatal("members not healthy after start")
	}
	b.Close()
	eventually(t, "b suspect", func() bool { return stateOf(t, db, "b") == store.NodeSuspect })
	eventually(t, "b dead", func() bool { return stateOf(t, db, "b") == store.NodeDead })
	if o, err := db.SandboxOwner(context.Background(), "sb1"); err != nil || !o.Lost || o.Node != "b" {
		t.Fatalf("b's sandbox after b died: %+v %v", o, err)
	}
	if st := stateOf(t, db, "a"); st != store.NodeReady {
		t.Fatalf("a is %s", st)
	}
	if b.Healthy() {
		t.Fatal("b, stopped long ago, thinks itself healthy")
	}
	ns, err := a.Nodes(context.Background())
	if err != nil || len(ns) != 2 {
		t.Fatalf("a's view of the nodes: %+v %v", ns, err)
	}
}

// TestMemberOutage: the database is down for longer than DeadAfter; after
// it is back, both members renew and neither is declared dead, even once
// both death checkers have run.
func TestMemberOutage(t *testing.T) {
	srv := pgtest.ForTest(t)
	url := newDB(t, srv)
	a := startMember(t, url, "a", nil)
	b := startMember(t, url, "b", nil)
	p := project(t, openDB(t, url))
	na := NewNodeStore(a, NodeStoreConfig{Holding: []string{"running"}})
	ctx := context.Background()
	if err := na.PutSandbox(ctx, row(p, "sb1", "running")); err != nil {
		t.Fatal(err)
	}

	if ns, err := a.Nodes(ctx); err != nil || len(ns) != 2 {
		t.Fatalf("a's node list: %+v %v", ns, err)
	}
	fa, fb := a.Fence(), b.Fence()
	if err := srv.Down(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a and b see their leases lapse", func() bool { return !a.Healthy() && !b.Healthy() })
	// Writes are refused as retryable while the lease is lapsed.
	if err := na.PutSandbox(ctx, row(p, "sb1", "paused")); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("write during the outage: %v, want ErrUnavailable", err)
	}
	// Everybody's lease lapses by more than DeadAfter.
	time.Sleep(testDeadAfter + 2*testLease)
	// The cached node list outlives the database.
	if ns, err := a.Nodes(ctx); err != nil || len(ns) != 2 {
		t.Fatalf("a's node list during the outage: %+v %v", ns, err)
	}
	if err := srv.Up(ctx); err != nil {
		t.Fatal(err)
	}
	checksA, checksB := a.deathChecks.Load(), b.deathChecks.Load()
	eventually(t, "both healthy again", func() bool { return a.Healthy() && b.Healthy() })
	eventually(t, "both death checkers ran twice since", func() bool {
		return a.deathChecks.Load() >= checksA+2 && b.deathChecks.Load() >= checksB+2
	})
	db := openDB(t, url)
	for _, n := range []string{"a", "b"} {
		if st := stateOf(t, db, n); st != store.NodeReady {
			t.Fatalf("node %s is %s after the outage, want ready", n, st)
		}
	}
	if a.Fence() != fa || b.Fence() != fb {
		t.Fatalf("fences after the outage: %+v %+v, want unchanged %+v %+v (nobody declared dead)", a.Fence(), b.Fence(), fa, fb)
	}
	if err := na.PutSandbox(ctx, row(p, "sb1", "paused")); err != nil {
		t.Fatalf("write after the outage: %v", err)
	}
}

// TestMemberFenced: a member whose name another process took, then one
// removed by the operator, registers again and destroys what it lost; the
// lost rows stay.
func TestMemberFenced(t *testing.T) {
	srv := pgtest.ForTest(t)
	url := newDB(t, srv)
	ctx := context.Background()
	var mu sync.Mutex
	local := map[string]bool{"sb1": true, "sb2": true, "sb3": true} // what "runs" on a
	destroyed := make(chan []string, 4)
	a := startMember(t, url, "a", func(ctx context.Context, keep func(string) bool) {
		mu.Lock()
		defer mu.Unlock()
		var gone []string
		for id := range local {
			if !keep(id) {
				delete(local, id)
				gone = append(gone, id)
			}
		}
		slices.Sort(gone)
		destroyed <- gone
	})
	db := openDB(t, url)
	p := project(t, db)
	na := NewNodeStore(a, NodeStoreConfig{Holding: []string{"running"}})
	for _, id := range []string{"sb1", "sb2"} {
		if err := na.PutSandbox(ctx, row(p, id, "running")); err != nil {
			t.Fatal(err)
		}
	}
	before := a.Fence()
	// Another process takes the name: a's rows are still its node's, but
	// sb3 has none.
	if _, err := db.RegisterNode(ctx, store.NodeInfo{Name: "a"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	gone := <-destroyed
	if !slices.Equal(gone, []string{"sb3"}) {
		t.Fatalf("destroyed after a takeover: %v, want [sb3]", gone)
	}
	if f := a.Fence(); f.Incarnation <= before.Incarnation+1 {
		t.Fatalf("fence after the takeover: %+v (was %+v)", f, before)
	}
	eventually(t, "a healthy again", a.Healthy)

	// Removed: both rows are lost and the sandboxes destroyed.
	if err := db.RemoveNode(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	gone = <-destroyed
	if !slices.Equal(gone, []string{"sb1", "sb2"}) {
		t.Fatalf("destroyed after a removal: %v, want [sb1 sb2]", gone)
	}
	eventually(t, "a healthy again", a.Healthy)
	if st := stateOf(t, db, "a"); st != store.NodeReady {
		t.Fatalf("a after rejoining: %s", st)
	}
	// The service's cleanup deletes the rows; they stay, lost.
	if err := na.DeleteSandbox(ctx, "sb1"); err != nil {
		t.Fatal(err)
	}
	if o, err := db.SandboxOwner(ctx, "sb1"); err != nil || !o.Lost || o.Node != "a" {
		t.Fatalf("lost row after the cleanup: %+v %v", o, err)
	}
	if err := na.PutSandbox(ctx, row(p, "sb1", "running")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("write of a lost sandbox: %v, want ErrNotFound", err)
	}
	if rows, err := na.Sandboxes(ctx); err != nil || len(rows) != 0 {
		t.Fatalf("a's rows for recovery: %+v %v", rows, err)
	}
}

// slowLookups is a database whose next lists of a node's rows fail (a
// database too slow for the round's deadline), as many as fail holds.
type slowLookups struct {
	Database
	fail atomic.Int32
}

func (s *slowLookups) SandboxesOn(ctx context.Context, node string) ([]store.Sandbox, error) {
	if s.fail.Add(-1) >= 0 {
		return nil, context.DeadlineExceeded
	}
	return s.Database.SandboxesOn(ctx, node)
}

// TestMemberFencedSlowDatabase: a member registered again after a fence
// whose database does not list its rows in time tries again the next
// rounds, and destroys what it lost once it can; it never gives up on it.
func TestMemberFencedSlowDatabase(t *testing.T) {
	srv := pgtest.ForTest(t)
	url := newDB(t, srv)
	ctx := context.Background()
	slow := &slowLookups{Database: openDB(t, url)}
	destroyed := make(chan []string, 4)
	a, err := NewMember(MemberConfig{
		DB:    slow,
		Info:  func() store.NodeInfo { return store.NodeInfo{Name: "a", Address: "a:7070", VCPUs: 4, MemoryMB: 4096} },
		Lease: testLease, DeadAfter: testDeadAfter,
		OnFenced: func(ctx context.Context, keep func(string) bool) {
			var gone []string
			for _, id := range []string{"sb1", "sb2"} {
				if !keep(id) {
					gone = append(gone, id)
				}
			}
			destroyed <- gone
		},
		Log: slog.New(slog.NewTextHandler(t.Output(), nil)).With("member", "a"),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	db := openDB(t, url)
	p := project(t, db)
	na := NewNodeStore(a, NodeStoreConfig{Holding: []string{"running"}})
	for _, id := range []string{"sb1", "sb2"} {
		if err := na.PutSandbox(ctx, row(p, id, "running")); err != nil {
			t.Fatal(err)
		}
	}
	// Removed while its next three lists fail: its rows are lost.
	slow.fail.Store(3)
	if err := db.RemoveNode(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	select {
	case gone := <-destroyed:
		if !slices.Equal(gone, []string{"sb1", "sb2"}) {
			t.Fatalf("destroyed after a removal: %v, want [sb1 sb2]", gone)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the lost sandboxes were never destroyed: the member gave up after a failed list")
	}
	if n := slow.fail.Load(); n >= 0 {
		t.Fatalf("the lists did not fail as arranged (%d left)", n+1)
	}
}

// TestNodeStore: rows, snapshots and volumes are this node's; admission
// counts the node's capacity.
func TestNodeStore(t *testing.T) {
	srv := pgtest.ForTest(t)
	url := newDB(t, srv)
	ctx := context.Background()
	a := startMember(t, url, "a", nil)
	b := startMember(t, url, "b", nil)
	db := openDB(t, url)
	p := project(t, db)
	cfg := NodeStoreConfig{Holding: []string{"running"}, VCPUs: 2,
		Limits: func(context.Context, string) (store.Limits, error) { return store.Limits{Sandboxes: 3}, nil }}
	na, nb := NewNodeStore(a, cfg), NewNodeStore(b, cfg)
	for _, id := range []string{"a1", "a2"} {
		if err := na.PutSandbox(ctx, row(p, id, "running")); err != nil {
			t.Fatal(err)
		}
	}
	if err := na.PutSandbox(ctx, row(p, "a3", "running")); !errors.Is(err, errdefs.ErrCapacity) {
		t.Fatalf("over a's vCPUs: %v, want ErrCapacity", err)
	}
	if err := nb.PutSandbox(ctx, row(p, "b1", "running")); err != nil {
		t.Fatal(err)
	}
	if err := nb.PutSandbox(ctx, row(p, "b2", "running")); !errors.Is(err, errdefs.ErrQuota) {
		t.Fatalf("over the project's sandboxes across nodes: %v, want ErrQuota", err)
	}
	if err := nb.PutSandbox(ctx, row(p, "a1", "paused")); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("b writes a's row: %v, want ErrConflict", err)
	}
	if rows, err := nb.Sandboxes(ctx); err != nil || len(rows) != 1 || rows[0].ID != "b1" || rows[0].Node != "b" {
		t.Fatalf("b's rows: %+v %v", rows, err)
	}
	if err := na.PutSnapshot(ctx, store.Snapshot{ID: "sn1", ProjectID: p.ID, Spec: []byte(`{}`), CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := nb.InsertVolume(ctx, store.Volume{ID: "v1", ProjectID: p.ID, Name: "data", Spec: []byte(`{}`), CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if sns, err := na.Snapshots(ctx); err != nil || len(sns) != 1 || sns[0].Node != "a" {
		t.Fatalf("a's snapshots: %+v %v", sns, err)
	}
	if sns, err := nb.Snapshots(ctx); err != nil || len(sns) != 0 {
		t.Fatalf("b's snapshots: %+v %v", sns, err)
	}
	if vs, err := nb.Volumes(ctx); err != nil || len(vs) != 1 || vs[0].Node != "b" {
		t.Fatalf("b's volumes: %+v %v", vs, err)
	}
	if vs, err := na.Volumes(ctx); err != nil || len(vs) != 0 {
		t.Fatalf("a's volumes: %+v %v", vs, err)
	}
	if err := na.DeleteSandbox(ctx, "a1"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.SandboxOwner(ctx, "a1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("deleted row: %v", err)
	}
}

// TestMemberRestartAfterDeath: a node that comes back after it was
// declared dead (a restart) gets none of its lost rows for recovery, and
// recovery's cleanup leaves them, lost.
func TestMemberRestartAfterDeath(t *testing.T) {
	srv := pgtest.ForTest(t)
	url := newDB(t, srv)
	ctx := context.Background()
	db := openDB(t, url)
	p := project(t, db)
	a := startMember(t, url, "a", nil)
	na := NewNodeStore(a, NodeStoreConfig{Holding: []string{"running"}})
	if err := na.PutSandbox(ctx, row(p, "sb1", "running")); err != nil {
		t.Fatal(err)
	}
	a.Close()
	eventually(t, "a declared dead", func() bool {
		done, err := db.DeclareDead(ctx, "a", 0)
		return err == nil && done
	})
	a2 := startMember(t, url, "a", nil)
	na2 := NewNodeStore(a2, NodeStoreConfig{Holding: []string{"running"}})
	if rows, err := na2.Sandboxes(ctx); err != nil || len(rows) != 0 {
		t.Fatalf("rows for recovery after a restart: %+v %v", rows, err)
	}
	if err := na2.DeleteSandbox(ctx, "sb1"); err != nil {
		t.Fatal(err)
	}
	if o, err := db.SandboxOwner(ctx, "sb1"); err != nil || !o.Lost {
		t.Fatalf("lost row after recovery's cleanup: %+v %v", o, err)
	}
	if err := na2.PutSandbox(ctx, row(p, "sb2", "running")); err != nil {
		t.Fatalf("a new sandbox on the restarted node: %v", err)
	}
}

// TestMemberMove: a member whose row says move runs OnMove once (with its
// node store able to release its durable paused sandboxes), then clears
// the flag and stays draining.
func TestMemberMove(t *testing.T) {
	srv := pgtest.ForTest(t)
	url := newDB(t, srv)
	db := openDB(t, url)
	p := project(t, db)
	var runs atomic.Int64
	release := make(chan struct{})
	var ns *NodeStore
	m, err := NewMember(MemberConfig{
		DB:        openDB(t, url),
		Info:      func() store.NodeInfo { return store.NodeInfo{Name: "a", Address: "a:7070"} },
		Lease:     testLease,
		DeadAfter: testDeadAfter,
		OnMove: func(ctx context.Context) {
			runs.Add(1)
			<-release
			if err := ns.ReleaseSandbox(ctx, "sb1"); err != nil {
				t.Errorf("release: %v", err)
			}
		},
		Log: slog.New(slog.NewTextHandler(t.Output(), nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ns = NewNodeStore(m, NodeStoreConfig{Holding: []string{"running"}})
	sb := row(p, "sb1", store.SandboxPaused)
	sb.Spec = []byte(`{"durableAt":"2026-01-01T00:00:00Z"}`)
	if err := ns.PutSandbox(context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	if err := db.SetMoving(context.Background(), "a", true); err != nil {
		t.Fatal(err)
	}
	eventually(t, "OnMove runs", func() bool { return runs.Load() == 1 })
	time.Sleep(3 * testLease) // more rounds while it runs: no second run
	close(release)
	eventually(t, "move done", func() bool { return !storetest.NodeOf(t, context.Background(), db, "a").Moving })
	if n := storetest.NodeOf(t, context.Background(), db, "a"); !n.Draining || runs.Load() != 1 {
		t.Fatalf("after the move: %+v, %d runs", n, runs.Load())
	}
	if o, err := db.SandboxOwner(context.Background(), "sb1"); err != nil || !o.Orphaned() {
		t.Fatalf("released sandbox: %+v %v", o, err)
	}
}

// slowHeartbeats answers each heartbeat after delay, as a loaded database
// does, and counts the heartbeats that went through and those that failed.
type slowHeartbeats struct {
	Database
	delay      time.Duration
	ok, failed atomic.Int32
}

func (s *slowHeartbeats) Heartbeat(ctx context.Context, f store.Fence, info store.NodeInfo, lease time.Duration) error {
	select {
	case <-ctx.Done():
		s.failed.Add(1)
		return ctx.Err()
	case <-time.After(s.delay):
	}
	if err := s.Database.Heartbeat(ctx, f, info, lease); err != nil {
		s.failed.Add(1)
		return err
	}
	s.ok.Add(1)
	return nil
}

// TestMemberSlowHeartbeats: a database that takes 40% of the lease to
// answer each heartbeat (more than the third between them) still renews
// the lease: no heartbeat gives up, and the node stays ready.
func TestMemberSlowHeartbeats(t *testing.T) {
	srv := pgtest.ForTest(t)
	url := newDB(t, srv)
	const lease = 2 * time.Second
	slow := &slowHeartbeats{Database: openDB(t, url), delay: lease * 4 / 10}
	a, err := NewMember(MemberConfig{
		DB:    slow,
		Info:  func() store.NodeInfo { return store.NodeInfo{Name: "a", Address: "a:7070", VCPUs: 4, MemoryMB: 4096} },
		Lease: lease, DeadAfter: 4 * lease,
		Log: slog.New(slog.NewTextHandler(t.Output(), nil)).With("member", "a"),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	db := openDB(t, url)
	for end := time.Now().Add(3 * lease); time.Now().Before(end); {
		if st := stateOf(t, db, "a"); st != store.NodeReady {
			t.Fatalf("a, heartbeating slowly but in time, is %s (%d heartbeats went through, %d failed)", st, slow.ok.Load(), slow.failed.Load())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if ok, failed := slow.ok.Load(), slow.failed.Load(); failed > 0 || ok < 3 {
		t.Fatalf("in 3 leases %d slow heartbeats went through and %d gave up", ok, failed)
	}
}
