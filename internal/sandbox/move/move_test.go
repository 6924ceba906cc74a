package move

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/durable"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/objstore/s3"
	"github.com/lizard-build/lizard/internal/objstore/vgwtest"
	"github.com/lizard-build/lizard/internal/runtime/fake"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/sandbox/sandboxtest"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/store/sqlite"
)

// Moves between two nodes over the fake runtime (each node a runtime of
// its own), one database and a real object store (versitygw, skipped
// where it is not installed): no root.

// owners is the cluster's rows as far as moves go: which node holds each
// sandbox ("" once released: orphaned). The real one is the cluster
// store's (store.Cluster, its conformance suite in storetest.RunCluster);
// this keeps just what the core asks of it.
type owners struct {
	mu sync.Mutex
	by map[string]string
	// slowDurable delays each write of a row that says its image is
	// durable: a slow database.
	slowDurable time.Duration
}

// nodeStore is node's view of the shared database: its own rows, and
// the Releaser and Orphans of the core.
type nodeStore struct {
	*sqlite.Store
	node string
	own  *owners
}

func (s nodeStore) PutSandbox(ctx context.Context, sb store.Sandbox) error {
	s.own.mu.Lock()
	s.own.by[sb.ID] = s.node // a write takes an orphan over
	slow := s.own.slowDurable
	s.own.mu.Unlock()
	if slow > 0 && durableRow(sb) {
		time.Sleep(slow)
	}
	return s.Store.PutSandbox(ctx, sb)
}

// durableRow says whether row sb is a paused sandbox whose image is
// durable, as the cluster store's release asks.
func durableRow(sb store.Sandbox) bool {
	var spec map[string]any
	if json.Unmarshal(sb.Spec, &spec) != nil {
		return false
	}
	return sb.Status == store.SandboxPaused && spec[store.DurableKey] != nil
}

func (s nodeStore) Sandboxes(ctx context.Context) ([]store.Sandbox, error) {
	all, err := s.Store.Sandboxes(ctx)
	var out []store.Sandbox
	s.own.mu.Lock()
	defer s.own.mu.Unlock()
	for _, sb := range all {
		if s.own.by[sb.ID] == s.node {
			out = append(out, sb)
		}
	}
	return out, err
}

func (s nodeStore) ReleaseSandbox(ctx context.Context, id string) error {
	all, err := s.Store.Sandboxes(ctx)
	if err != nil {
		return err
	}
	s.own.mu.Lock()
	defer s.own.mu.Unlock()
	for _, sb := range all {
		if sb.ID == id && s.own.by[id] == s.node && durableRow(sb) {
			s.own.by[id] = ""
			return nil
		}
	}
	return store.NotReleasable(id, s.node)
}

func (s nodeStore) Orphan(ctx context.Context, projectID, id string) (store.Sandbox, error) {
	s.own.mu.Lock()
	owner, ok := s.own.by[id]
	s.own.mu.Unlock()
	if !ok || owner != "" {
		return store.Sandbox{}, errdefs.ErrNotFound
	}
	all, err := s.Store.Sandboxes(ctx)
	if err != nil {
		return store.Sandbox{}, err
	}
	for _, sb := range all {
		if sb.ID == id && sb.ProjectID == projectID {
			return sb, nil
		}
	}
	return store.Sandbox{}, errdefs.ErrNotFound
}

// cluster is two nodes, a and b.
type cluster struct {
	env    *sandboxtest.Env
	a, b   *sandbox.Service
	rtB    *fake.Runtime
	owners *owners
}

func newCluster(t *testing.T) *cluster {
	gw := vgwtest.New(t)
	gw.SetEnv(t)
	obj, err := s3.Open(gw.URL("move"))
	if err != nil {
		t.Fatal(err)
	}
	imgs := durable.New(obj, nil)
	env := sandboxtest.NewEnv(t)
	own := &owners{by: map[string]string{}}
	rtB, err := fake.New(fake.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		list, _ := rtB.List(context.Background())
		for _, sb := range list {
			rtB.Destroy(context.Background(), sb.ID)
		}
	})
	node := func(name string, rt *fake.Runtime, snapDir string) *sandbox.Service {
		s := sandbox.New(sandbox.Config{
			Runtime: rt, Store: nodeStore{Store: env.Store, node: name, own: own}, Templates: env.Templates,
			SnapshotDir: snapDir, Images: imgs, Logger: sandboxtest.Logger(t), AgentReadyTimeout: 10 * time.Second,
		})
		if err := s.Recover(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		return s
	}
	return &cluster{env: env, a: node("a", env.Runtime, env.SnapshotDir), b: node("b", rtB, t.TempDir()), rtB: rtB, owners: own}
}

func (c *cluster) run(t *testing.T, s *sandbox.Service, id, script string) string {
	t.Helper()
	return sandboxtest.Stdout(t, script+" in "+id, func(on func(agent.Event) error) error {
		return s.Exec(context.Background(), c.env.Project.ID, id, sandbox.ExecRequest{Cmd: []string{script}, Shell: true}, on)
	})
}

func (c *cluster) create(t *testing.T, s *sandbox.Service, content string) sandbox.Record {
	t.Helper()
	rec, err := s.Create(context.Background(), sandbox.CreateRequest{ProjectID: c.env.Project.ID, TimeoutMs: 600_000})
	if err != nil {
		t.Fatal(err)
	}
	c.run(t, s, rec.ID, `echo `+content+` > "$HOME/f"`)
	return rec
}

// durable waits until paused sandbox id's image is in the object store.
func (c *cluster) durable(t *testing.T, s *sandbox.Service, id string) {
	t.Helper()
	sandboxtest.Eventually(t, "the pause image to be durable", func() bool {
		rec, ok := s.Live(id)
		return ok && rec.DurableAt != nil
	})
}

// TestEvacuate: a drain --move takes a node's running and paused
// sandboxes to another node with their files; the running one runs there,
// the paused one waits (orphaned) until it is resumed, where it is asked.
func TestEvacuate(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	running := c.create(t, c.a, "ran")
	paused := c.create(t, c.a, "slept")
	if err := c.a.Pause(ctx, c.env.Project.ID, paused.ID); err != nil {
		t.Fatal(err)
	}
	var resumed []string
	moved := Evacuate(ctx, Config{Core: c.a, ObjectStore: true, Poll: 20 * time.Millisecond,
		Resume: func(ctx context.Context, projectID, id string) error {
			resumed = append(resumed, id)
			_, err := c.b.Resume(ctx, projectID, id)
			return err
		}})
	if len(moved) != 2 {
		t.Fatalf("moved: %+v", moved)
	}
	for _, m := range moved {
		if m.Err != nil {
			t.Fatalf("%s not moved: %v", m.ID, m.Err)
		}
		if m.WasRunning != (m.ID == running.ID) {
			t.Fatalf("%s: wasRunning %v", m.ID, m.WasRunning)
		}
	}
	if len(resumed) != 1 || resumed[0] != running.ID {
		t.Fatalf("resumed elsewhere: %v, want only the running one", resumed)
	}
	if list := c.a.List(c.env.Project.ID); len(list) != 0 {
		t.Fatalf("node a still lists %+v", list)
	}
	if list, _ := c.env.Runtime.List(ctx); len(list) != 0 {
		t.Fatalf("node a's runtime still holds %+v", list)
	}
	if got := c.run(t, c.b, running.ID, `cat "$HOME/f"`); got != "ran\n" {
		t.Fatalf("the moved sandbox on b: %q", got)
	}
	// The paused one is orphaned: any node finds it and resumes it.
	if rec, err := c.b.Get(c.env.Project.ID, paused.ID); err != nil || rec.Status != sandbox.StatusPaused {
		t.Fatalf("the orphan seen from b: %+v %v", rec, err)
	}
	if _, err := c.b.Get("prj_other", paused.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another project's orphan: %v", err)
	}
	rec, err := c.b.Resume(ctx, c.env.Project.ID, paused.ID)
	if err != nil || rec.Status != sandbox.StatusRunning || rec.ID != paused.ID || rec.AgentToken != paused.AgentToken {
		t.Fatalf("resume of the orphan on b: %+v %v", rec, err)
	}
	if got := c.run(t, c.b, paused.ID, `cat "$HOME/f"`); got != "slept\n" {
		t.Fatalf("the resumed orphan on b: %q", got)
	}
}

// TestReleaseAndKillOrphan: only a paused sandbox with a durable image is
// released; an orphan is killed from any node, its row gone.
func TestReleaseAndKillOrphan(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	rec := c.create(t, c.a, "x")
	if err := c.a.Release(ctx, rec.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("release of a running sandbox: %v, want ErrConflict", err)
	}
	if err := c.a.Pause(ctx, c.env.Project.ID, rec.ID); err != nil {
		t.Fatal(err)
	}
	c.durable(t, c.a, rec.ID)
	if err := c.a.Release(ctx, rec.ID); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if _, ok := c.a.Live(rec.ID); ok {
		t.Fatal("node a still holds the released sandbox")
	}
	if err := c.b.Kill(ctx, c.env.Project.ID, rec.ID); err != nil {
		t.Fatalf("kill of the orphan from b: %v", err)
	}
	rows, _ := c.env.Store.Sandboxes(ctx)
	if len(rows) != 0 {
		t.Fatalf("rows left: %+v", rows)
	}
	if _, err := c.b.Resume(ctx, c.env.Project.ID, rec.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("resume of a killed orphan: %v", err)
	}
}

// TestReleaseAfterDurableWrite: a release that comes as soon as the
// sandbox says its image is durable finds its row saying so too, however
// slow the database (a drain --move failed with "not a paused sandbox of
// node a whose image is durable" when the row lagged behind).
func TestReleaseAfterDurableWrite(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	rec := c.create(t, c.a, "x")
	own := c.owners
	own.mu.Lock()
	own.slowDurable = 500 * time.Millisecond
	own.mu.Unlock()
	if err := c.a.Pause(ctx, c.env.Project.ID, rec.ID); err != nil {
		t.Fatal(err)
	}
	c.durable(t, c.a, rec.ID)
	if err := c.a.Release(ctx, rec.ID); err != nil {
		t.Fatalf("Release as soon as durable: %v", err)
	}
	if _, ok := c.a.Live(rec.ID); ok {
		t.Fatal("node a still holds the released sandbox")
	}
}

// TestDurableInTheStoreFirst: a paused sandbox (with or without its
// memory) says its image is durable only once its row in the store does,
// however slow the database: a node lost right after a caller saw
// durableAt must leave the sandbox to the others, not lose it with it
// (TestClusterPauseFilesAnywhere's resume got sandbox_lost when the row
// lagged behind).
func TestDurableInTheStoreFirst(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	own := c.owners
	own.mu.Lock()
	own.slowDurable = 500 * time.Millisecond
	own.mu.Unlock()
	for _, memory := range []bool{true, false} {
		rec := c.create(t, c.a, "x")
		pause := c.a.PauseFiles
		if memory {
			pause = c.a.Pause
		}
		if err := pause(ctx, c.env.Project.ID, rec.ID); err != nil {
			t.Fatal(err)
		}
		c.durable(t, c.a, rec.ID)
		rows, err := c.env.Store.Sandboxes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(rows, func(r store.Sandbox) bool { return r.ID == rec.ID })
		if i < 0 {
			t.Fatalf("memory %v: no row", memory)
		}
		if row := rows[i]; !durableRow(row) {
			t.Fatalf("memory %v: the sandbox says durable, its row (%s) does not", memory, row.Status)
		}
	}
}

// TestEvacuateWithoutObjectStore: nothing can move, so nothing is paused.
func TestEvacuateWithoutObjectStore(t *testing.T) {
	env := sandboxtest.NewEnv(t)
	s := sandbox.New(sandbox.Config{Runtime: env.Runtime, Store: env.Store, Templates: env.Templates, SnapshotDir: env.SnapshotDir, Logger: sandboxtest.Logger(t)})
	if err := s.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	rec, err := s.Create(context.Background(), sandbox.CreateRequest{ProjectID: env.Project.ID})
	if err != nil {
		t.Fatal(err)
	}
	moved := Evacuate(context.Background(), Config{Core: s, Resume: func(context.Context, string, string) error {
		t.Fatal("resumed elsewhere without an object store")
		return nil
	}})
	if len(moved) != 1 || !errors.Is(moved[0].Err, errdefs.ErrConflict) || !strings.Contains(moved[0].Err.Error(), "object store") {
		t.Fatalf("moved: %+v", moved)
	}
	if got, _ := s.Get(env.Project.ID, rec.ID); got.Status != sandbox.StatusRunning {
		t.Fatalf("the sandbox was %s for a move that could not happen", got.Status)
	}
	if err := s.Release(context.Background(), rec.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("Release without an object store: %v", err)
	}
}
