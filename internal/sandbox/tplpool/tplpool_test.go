package tplpool

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/network"
	"github.com/lizard-build/lizard/internal/runtime"
	"github.com/lizard-build/lizard/internal/runtime/fake"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/sandbox/sandboxtest"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/template"
)

// Tests over the fake runtime (package runtime/fake): no root.

// templates has one template, "base", whose version a test may change
// (a rebuild: a new rootfs directory).
type templates struct {
	mu     sync.Mutex
	rootfs string
}

func (d *templates) Lookup(project, name string) (template.Template, error) {
	if name != "base" {
		return template.Template{}, errdefs.ErrNotFound
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return template.Template{Name: "base", Rootfs: d.rootfs}, nil
}

func (d *templates) LookupVersion(project, name, digest string) (template.Template, error) {
	return d.Lookup(project, name)
}

func (d *templates) rebuild(rootfs string) {
	d.mu.Lock()
	d.rootfs = rootfs
	d.mu.Unlock()
}

type env struct {
	*sandboxtest.Env
	tpls         *templates
	limits       store.Limits
	maxSandboxes int
	// runtime is the core's runtime; nil: Env.Runtime.
	runtime runtime.Runtime
	// interval is the Manager's; 0: 100 ms.
	interval time.Duration
}

func newEnv(t *testing.T) *env {
	e := &env{Env: sandboxtest.NewEnv(t)}
	e.tpls = &templates{rootfs: e.Templates.Rootfs}
	return e
}

// start builds, recovers and starts a core and a Manager (the server),
// closed at the test's end.
func (e *env) start(t *testing.T, static ...store.TemplatePool) (*sandbox.Service, *Manager) {
	t.Helper()
	var rt runtime.Runtime = e.Runtime
	if e.runtime != nil {
		rt = e.runtime
	}
	core := sandbox.New(sandbox.Config{
		Runtime: rt, Store: e.Store, Templates: e.tpls, SnapshotDir: e.SnapshotDir, MaxSandboxes: e.maxSandboxes,
		Limits:            func(context.Context, string) (store.Limits, error) { return e.limits, nil },
		Logger:            sandboxtest.Logger(t),
		AgentReadyTimeout: 10 * time.Second, RecoverProbeTimeout: 2 * time.Second,
	})
	if err := core.Recover(context.Background()); err != nil {
		t.Fatalf("Recover: %v", err)
	}
	interval := e.interval
	if interval == 0 {
		interval = 100 * time.Millisecond
	}
	m := New(Config{Core: core, Settings: e.Store, Static: static, Interval: interval, Logger: sandboxtest.Logger(t)})
	m.Start()
	t.Cleanup(func() { m.Close(); core.Close() })
	return core, m
}

// runtimeIDs are the sandboxes the fake runtime holds.
func (e *env) runtimeIDs() []string {
	list, _ := e.Runtime.List(context.Background())
	var ids []string
	for _, sb := range list {
		ids = append(ids, sb.ID)
	}
	return ids
}

func (e *env) run(t *testing.T, core *sandbox.Service, id, script string) string {
	t.Helper()
	return sandboxtest.Stdout(t, script+" in "+id, func(on func(agent.Event) error) error {
		return core.Exec(context.Background(), e.Project.ID, id, sandbox.ExecRequest{Cmd: []string{script}, Shell: true}, on)
	})
}

// ready waits until the project's pool of base at size shows n ready.
func ready(t *testing.T, m *Manager, project, size string, n int) {
	t.Helper()
	sandboxtest.Eventually(t, "the pool to hold "+string(rune('0'+n)), func() bool {
		pools, err := m.List(context.Background(), project)
		return err == nil && len(pools) == 1 && pools[0].SandboxSize == size && pools[0].Ready == n
	})
}

// TestCreateTakesAWarmCopy: a pool fills; a create takes one of its
// copies with the create's settings and none of the copy's own; the pool
// refills; size 0 empties it.
func TestCreateTakesAWarmCopy(t *testing.T) {
	e := newEnv(t)
	core, m := e.start(t)
	ctx := context.Background()
	p, err := m.Set(ctx, e.Project.ID, "base", "small", 2)
	if err != nil || p.Size != 2 || p.SandboxSize != "small" || p.Source != SourceProject {
		t.Fatalf("Set: %+v %v", p, err)
	}
	ready(t, m, e.Project.ID, "small", 2)
	warm := e.runtimeIDs()
	if len(warm) != 2 || len(core.List(e.Project.ID)) != 0 {
		t.Fatalf("warm copies: runtime %v, the project lists %d", warm, len(core.List(e.Project.ID)))
	}
	egress := network.Egress{Restricted: true, Allowed: []string{"10.9.0.1"}}
	rec, err := core.Create(ctx, sandbox.CreateRequest{ProjectID: e.Project.ID, Size: "small", TimeoutMs: 60_000,
		Envs: map[string]string{"GREETING": "hello"}, Metadata: map[string]string{"who": "test"}, Egress: egress})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if !slices.Contains(warm, rec.ID) {
		t.Fatalf("the create booted %s instead of taking one of the warm copies %v", rec.ID, warm)
	}
	if rec.ProjectID != e.Project.ID || rec.Status != sandbox.StatusRunning || rec.EndAt == nil || rec.Metadata["who"] != "test" || rec.PoolOf != "" {
		t.Fatalf("claimed record: %+v", rec)
	}
	if got, _ := e.Runtime.Egress(rec.ID); got.Restricted != true || !slices.Equal(got.Allowed, egress.Allowed) {
		t.Fatalf("the copy's egress is %+v, want %+v", got, egress)
	}
	if out := e.run(t, core, rec.ID, `echo "$GREETING"`); out != "hello\n" {
		t.Fatalf("envs: %q", out)
	}
	// The store has it as the project's, and the API lists it.
	rows, err := e.Store.Sandboxes(ctx)
	if err != nil || len(rows) != 1 || rows[0].ID != rec.ID || rows[0].ProjectID != e.Project.ID {
		t.Fatalf("stored: %+v %v (warm copies are not stored)", rows, err)
	}
	if list := core.List(e.Project.ID); len(list) != 1 || list[0].ID != rec.ID {
		t.Fatalf("List: %+v", list)
	}
	ready(t, m, e.Project.ID, "small", 2)
	if n := len(e.runtimeIDs()); n != 3 {
		t.Fatalf("runtime holds %d, want the claimed sandbox and two warm copies", n)
	}
	// Another size boots.
	warm = e.runtimeIDs()
	other, err := core.Create(ctx, sandbox.CreateRequest{ProjectID: e.Project.ID, Size: "mini"})
	if err != nil || slices.Contains(warm, other.ID) {
		t.Fatalf("Create mini: %v (took a warm copy of another size: %v)", err, slices.Contains(warm, other.ID))
	}
	if _, err := m.Set(ctx, e.Project.ID, "base", "small", 0); err != nil {
		t.Fatal(err)
	}
	sandboxtest.Eventually(t, "the pool to empty", func() bool { return len(e.runtimeIDs()) == 2 })
	if pools, err := m.List(ctx, e.Project.ID); err != nil || len(pools) != 0 {
		t.Fatalf("List after size 0: %+v %v", pools, err)
	}
	if err := core.Kill(ctx, e.Project.ID, rec.ID); err != nil {
		t.Fatalf("Kill the claimed copy: %v", err)
	}
}

// TestWarmCopiesOutsideQuota: warm copies hold none of the project's
// quota; a claim is judged by it as a create is.
func TestWarmCopiesOutsideQuota(t *testing.T) {
	e := newEnv(t)
	e.limits = store.Limits{Sandboxes: 1}
	core, m := e.start(t)
	ctx := context.Background()
	if _, err := m.Set(ctx, e.Project.ID, "base", "", 3); err != nil {
		t.Fatal(err)
	}
	ready(t, m, e.Project.ID, sandbox.DefaultSize, 3)
	if _, err := core.Create(ctx, sandbox.CreateRequest{ProjectID: e.Project.ID}); err != nil {
		t.Fatalf("Create with three warm copies and a quota of one: %v", err)
	}
	if _, err := core.Create(ctx, sandbox.CreateRequest{ProjectID: e.Project.ID}); !errors.Is(err, errdefs.ErrQuota) {
		t.Fatalf("a second create over the quota of one: %v", err)
	}
	ready(t, m, e.Project.ID, sandbox.DefaultSize, 3)
}

// TestNewVersionReplacesCopies: after a rebuild the old version's copies
// go and the pool refills with the new one; a create gets the new one.
func TestNewVersionReplacesCopies(t *testing.T) {
	e := newEnv(t)
	core, m := e.start(t)
	ctx := context.Background()
	if _, err := m.Set(ctx, e.Project.ID, "base", "", 2); err != nil {
		t.Fatal(err)
	}
	ready(t, m, e.Project.ID, sandbox.DefaultSize, 2)
	old := e.runtimeIDs()
	e.tpls.rebuild(t.TempDir())
	sandboxtest.Eventually(t, "the old version's copies to be replaced", func() bool {
		ids := e.runtimeIDs()
		return len(ids) == 2 && !slices.Contains(ids, old[0]) && !slices.Contains(ids, old[1])
	})
	ready(t, m, e.Project.ID, sandbox.DefaultSize, 2)
	rec, err := core.Create(ctx, sandbox.CreateRequest{ProjectID: e.Project.ID})
	if err != nil || slices.Contains(old, rec.ID) || rec.Rootfs != e.tpls.rootfs {
		t.Fatalf("Create after the rebuild: %+v %v", rec, err)
	}
}

// TestWarmCopiesYield: a node full of warm copies still takes a create
// none of them fits: one copy goes.
func TestWarmCopiesYield(t *testing.T) {
	e := newEnv(t)
	e.maxSandboxes = 2
	core, m := e.start(t)
	ctx := context.Background()
	if _, err := m.Set(ctx, e.Project.ID, "base", "nano", 2); err != nil {
		t.Fatal(err)
	}
	ready(t, m, e.Project.ID, "nano", 2)
	rec, err := core.Create(ctx, sandbox.CreateRequest{ProjectID: e.Project.ID, Size: "mini"})
	if err != nil {
		t.Fatalf("Create on a node full of warm copies: %v", err)
	}
	if ids := e.runtimeIDs(); len(ids) != 2 || !slices.Contains(ids, rec.ID) {
		t.Fatalf("runtime: %v", ids)
	}
}

// refillOnDrop runs a refill of the pools (onDestroy) in the destroy of
// a sandbox, once armed: the refill comes between a warm copy's drop and
// the boot of the create it was dropped for, as it may on a busy node.
type refillOnDrop struct {
	*fake.Runtime
	mu        sync.Mutex
	onDestroy func()
}

func (r *refillOnDrop) arm(fn func()) {
	r.mu.Lock()
	r.onDestroy = fn
	r.mu.Unlock()
}

func (r *refillOnDrop) Destroy(ctx context.Context, id string) error {
	err := r.Runtime.Destroy(ctx, id)
	r.mu.Lock()
	fn := r.onDestroy
	r.onDestroy = nil
	r.mu.Unlock()
	if fn != nil {
		fn()
	}
	return err
}

// TestWarmCopiesYieldToARefill: the room a warm copy left for a create
// is the create's: a refill of the pools between the drop and the
// create's boot does not take it (it did: "node at capacity").
func TestWarmCopiesYieldToARefill(t *testing.T) {
	e := newEnv(t)
	e.maxSandboxes = 2
	rt := &refillOnDrop{Runtime: e.Runtime}
	// The loop refills when told (Set) and when this test says.
	e.runtime, e.interval = rt, time.Hour
	core, m := e.start(t)
	ctx := context.Background()
	if _, err := m.Set(ctx, e.Project.ID, "base", "nano", 2); err != nil {
		t.Fatal(err)
	}
	ready(t, m, e.Project.ID, "nano", 2)
	rt.arm(func() { m.reconcile(ctx) })
	rec, err := core.Create(ctx, sandbox.CreateRequest{ProjectID: e.Project.ID, Size: "mini"})
	if err != nil {
		t.Fatalf("Create on a node full of warm copies, one refilled meanwhile: %v", err)
	}
	if ids := e.runtimeIDs(); len(ids) != 2 || !slices.Contains(ids, rec.ID) {
		t.Fatalf("runtime: %v", ids)
	}
}

// TestConfigPools: the server's configured pool fills; the store's
// setting of the same pool replaces it, and its removal brings it back.
// A stop destroys the copies (never stored; a crash leaves them to the
// next server as strays, as any sandbox without a record), and the
// restarted server refills.
func TestConfigPools(t *testing.T) {
	e := newEnv(t)
	static := store.TemplatePool{ProjectID: e.Project.ID, Template: "base", SandboxSize: "mini", Size: 1}
	core, m := e.start(t, static)
	ctx := context.Background()
	ready(t, m, e.Project.ID, "mini", 1)
	if pools, _ := m.List(ctx, e.Project.ID); pools[0].Source != SourceConfig {
		t.Fatalf("List: %+v", pools)
	}
	if _, err := m.Set(ctx, e.Project.ID, "base", "mini", 2); err != nil {
		t.Fatal(err)
	}
	ready(t, m, e.Project.ID, "mini", 2)
	if _, err := m.Set(ctx, e.Project.ID, "base", "mini", 0); err != nil {
		t.Fatal(err)
	}
	ready(t, m, e.Project.ID, "mini", 1)
	before := e.runtimeIDs()
	m.Close()
	core.Close()
	if ids := e.runtimeIDs(); len(ids) != 0 {
		t.Fatalf("after a stop the runtime holds %v: warm copies must go with their server", ids)
	}
	_, m2 := e.start(t, static)
	ready(t, m2, e.Project.ID, "mini", 1)
	if ids := e.runtimeIDs(); len(ids) != 1 || slices.Contains(before, ids[0]) {
		t.Fatalf("after a restart the runtime holds %v (before: %v)", ids, before)
	}
}

// TestSetRefuses: bad settings are refused, naming the problem.
func TestSetRefuses(t *testing.T) {
	e := newEnv(t)
	_, m := e.start(t)
	ctx := context.Background()
	for _, c := range []struct {
		tpl, size string
		n         int
		is        error
		says      string
	}{
		{"base", "", -1, errdefs.ErrInvalid, "size -1"},
		{"base", "", MaxSize + 1, errdefs.ErrInvalid, "size 101"},
		{"base", "huge", 1, errdefs.ErrInvalid, `size "huge"`},
		{"nope", "", 1, errdefs.ErrNotFound, `template "nope"`},
	} {
		_, err := m.Set(ctx, e.Project.ID, c.tpl, c.size, c.n)
		if !errors.Is(err, c.is) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("Set(%s, %q, %d): %v, want %v saying %q", c.tpl, c.size, c.n, err, c.is, c.says)
		}
	}
	// A built-in template not built here (an alias of it) may have a
	// pool: it is kept under its name and fills once built.
	p, err := m.Set(ctx, e.Project.ID, "python312", "", 1)
	if err != nil || p.Template != "python" || p.Ready != 0 {
		t.Fatalf("Set of a built-in not built: %+v %v", p, err)
	}
	if pools, err := m.List(ctx, e.Project.ID); err != nil || len(pools) != 1 || pools[0].Template != "python" {
		t.Fatalf("List: %+v %v", pools, err)
	}
}
