package sandbox

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/runtime"
	"github.com/lizard-build/lizard/internal/sandbox/sandboxtest"
	"github.com/lizard-build/lizard/internal/store"
)

// Tests of the service over the fake runtime (package runtime/fake): no
// root. Commands run on the host as the test's user, in each sandbox's own
// home directory.

// fakeEnv is what a service over the fake stands on; a second service
// over the same env is the server restarted.
type fakeEnv struct{ *sandboxtest.Env }

func newFakeEnv(t *testing.T) *fakeEnv { return &fakeEnv{sandboxtest.NewEnv(t)} }

// service starts a service over env, recovered, closed at the test's end.
func (env *fakeEnv) service(t *testing.T, edit func(*Config)) *Service {
	t.Helper()
	cfg := Config{
		Runtime: env.Runtime, Store: env.Store, Templates: env.Templates, SnapshotDir: env.SnapshotDir,
		Logger: sandboxtest.Logger(t), AgentReadyTimeout: 10 * time.Second, RecoverProbeTimeout: 2 * time.Second,
	}
	if edit != nil {
		edit(&cfg)
	}
	s := New(cfg)
	if err := s.Recover(context.Background()); err != nil {
		t.Fatalf("Recover: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

func (env *fakeEnv) create(t *testing.T, s *Service, req CreateRequest) Record {
	t.Helper()
	req.ProjectID = env.Project.ID
	rec, err := s.Create(context.Background(), req)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	return rec
}

// run runs script in sandbox id through the service and the agent and
// returns its stdout.
func (env *fakeEnv) run(t *testing.T, s *Service, id, script string) string {
	t.Helper()
	return sandboxtest.Stdout(t, script+" in "+id, func(on func(agent.Event) error) error {
		return s.Exec(context.Background(), env.Project.ID, id, ExecRequest{Cmd: []string{script}, Shell: true}, on)
	})
}

func (env *fakeEnv) runtimeState(t *testing.T, id string) runtime.State {
	t.Helper()
	st, err := env.Runtime.State(context.Background(), id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func (env *fakeEnv) gone(s *Service, id string) func() bool {
	return func() bool {
		_, err := s.Get(env.Project.ID, id)
		st, _ := env.Runtime.State(context.Background(), id)
		return errors.Is(err, errdefs.ErrNotFound) && st == ""
	}
}

func TestFakeCreateExecKill(t *testing.T) {
	env := newFakeEnv(t)
	s := env.service(t, nil)
	rec := env.create(t, s, CreateRequest{Envs: map[string]string{"GREETING": "hi"}})
	if rec.Status != StatusRunning || env.runtimeState(t, rec.ID) != runtime.StateRunning {
		t.Fatalf("created: status %q, runtime %q", rec.Status, env.runtimeState(t, rec.ID))
	}
	if got := env.run(t, s, rec.ID, `echo "$GREETING"; echo made > "$HOME/f"; cat "$HOME/f"`); got != "hi\nmade\n" {
		t.Fatalf("exec: %q", got)
	}
	// The agent the service reaches serves files too.
	ag, _, err := s.Agent(env.Project.ID, rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got := env.run(t, s, rec.ID, "pwd"); strings.TrimSpace(got) == "" {
		t.Fatalf("no working directory")
	}
	if _, err := ag.Stat(context.Background(), "/", ""); err != nil {
		t.Fatalf("stat through the agent: %v", err)
	}
	if err := s.Kill(context.Background(), env.Project.ID, rec.ID); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if !env.gone(s, rec.ID)() {
		t.Fatalf("killed sandbox still there")
	}
	if err := s.Kill(context.Background(), env.Project.ID, rec.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("second Kill: %v, want ErrNotFound", err)
	}
}

// TestFakeDeadlines: at its deadline a sandbox is killed, or paused when
// made with AutoPause.
func TestFakeDeadlines(t *testing.T) {
	env := newFakeEnv(t)
	s := env.service(t, nil)
	killed := env.create(t, s, CreateRequest{TimeoutMs: 300})
	paused := env.create(t, s, CreateRequest{TimeoutMs: 300, AutoPause: true})
	kept := env.create(t, s, CreateRequest{})
	sandboxtest.Eventually(t, "the deadline to kill", env.gone(s, killed.ID))
	sandboxtest.Eventually(t, "the deadline to pause", func() bool {
		rec, err := s.Get(env.Project.ID, paused.ID)
		return err == nil && rec.Status == StatusPaused && env.runtimeState(t, paused.ID) == runtime.StatePaused
	})
	if rec, err := s.Get(env.Project.ID, kept.ID); err != nil || rec.Status != StatusRunning {
		t.Fatalf("sandbox without a deadline: %+v, %v", rec, err)
	}
	// SetTimeout moves a deadline.
	if err := s.SetTimeout(context.Background(), env.Project.ID, kept.ID, 1000); err != nil {
		t.Fatal(err)
	}
	sandboxtest.Eventually(t, "the new deadline", env.gone(s, kept.ID))
}

// TestFakeAdmission: parallel creates against a cap: exactly the cap get
// in, the others get a capacity error and leave nothing behind.
func TestFakeAdmission(t *testing.T) {
	const limit, n = 3, 8
	env := newFakeEnv(t)
	s := env.service(t, func(c *Config) { c.MaxSandboxes = limit })
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = s.Create(context.Background(), CreateRequest{ProjectID: env.Project.ID})
		}()
	}
	wg.Wait()
	ok := 0
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case !errors.Is(err, errdefs.ErrCapacity):
			t.Errorf("refused create: %v, want ErrCapacity", err)
		}
	}
	if ok != limit {
		t.Fatalf("%d creates succeeded, want %d", ok, limit)
	}
	if got := len(s.List(env.Project.ID)); got != limit {
		t.Fatalf("%d sandboxes listed, want %d", got, limit)
	}
	if list, _ := env.Runtime.List(context.Background()); len(list) != limit {
		t.Fatalf("the runtime holds %d sandboxes, want %d", len(list), limit)
	}
}

func TestFakePauseResume(t *testing.T) {
	env := newFakeEnv(t)
	s := env.service(t, nil)
	rec := env.create(t, s, CreateRequest{})
	env.run(t, s, rec.ID, `echo kept > "$HOME/f"`)
	ctx := context.Background()
	if err := s.Pause(ctx, env.Project.ID, rec.ID); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if got, _ := s.Get(env.Project.ID, rec.ID); got.Status != StatusPaused || env.runtimeState(t, rec.ID) != runtime.StatePaused {
		t.Fatalf("after Pause: status %q, runtime %q", got.Status, env.runtimeState(t, rec.ID))
	}
	if err := s.Exec(ctx, env.Project.ID, rec.ID, ExecRequest{Cmd: []string{"true"}}, func(agent.Event) error { return nil }); err == nil {
		t.Fatalf("exec in a paused sandbox succeeded")
	}
	if _, err := s.Resume(ctx, env.Project.ID, rec.ID); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if got := env.run(t, s, rec.ID, `cat "$HOME/f"`); got != "kept\n" {
		t.Fatalf("after Resume: %q", got)
	}
}

// TestFakeCheckpointCopy: the core's seam of snapshots and forks: a
// checkpoint of a running sandbox, copies of it with ids, tokens and
// files of their own, warm copies claimed and trimmed.
func TestFakeCheckpointCopy(t *testing.T) {
	env := newFakeEnv(t)
	s := env.service(t, nil)
	ctx := context.Background()
	src := env.create(t, s, CreateRequest{Metadata: map[string]string{"k": "v"}, Secure: true, E2B: true})
	env.run(t, s, src.ID, `echo from-source > "$HOME/f"`)
	dir := filepath.Join(t.TempDir(), "image")
	saved, err := s.Checkpoint(ctx, env.Project.ID, src.ID, dir)
	if err != nil {
		t.Fatalf("Checkpoint: %v", err)
	}
	if saved.SourceID != src.ID || saved.AgentToken != src.AgentToken || saved.Metadata["k"] != "v" || !saved.Secure {
		t.Fatalf("saved: %+v", saved)
	}
	if _, err := s.Checkpoint(ctx, "prj_other", src.ID, filepath.Join(t.TempDir(), "image")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another project's checkpoint: %v, want ErrNotFound", err)
	}
	env.run(t, s, src.ID, `echo later > "$HOME/f"`)
	copy, err := s.Copy(ctx, CopyRequest{From: saved, Dir: dir, SnapshotID: "snap_x", TimeoutMs: 60_000})
	if err != nil {
		t.Fatalf("Copy: %v", err)
	}
	if copy.ID == src.ID || copy.AgentToken == src.AgentToken || copy.EnvdToken == "" || copy.EnvdToken == src.EnvdToken {
		t.Fatalf("the copy shares the source's id or tokens: %+v", copy)
	}
	if copy.SnapshotID != "snap_x" || copy.Metadata["k"] != "v" || copy.EndAt == nil || copy.Status != StatusRunning {
		t.Fatalf("the copy: %+v", copy)
	}
	if got := env.run(t, s, copy.ID, `cat "$HOME/f"`); got != "from-source\n" {
		t.Fatalf("restored copy: %q", got)
	}
	// A paused sandbox cannot be saved.
	if err := s.Pause(ctx, env.Project.ID, copy.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Checkpoint(ctx, env.Project.ID, copy.ID, filepath.Join(t.TempDir(), "image")); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("checkpoint of a paused sandbox: %v, want ErrConflict", err)
	}

	// Warm copies wait, unlisted, until claimed or trimmed.
	for range 3 {
		if _, err := s.Copy(ctx, CopyRequest{From: saved, Dir: dir, SnapshotID: "snap_x", PoolOf: "snap_x"}); err != nil {
			t.Fatalf("warm copy: %v", err)
		}
	}
	if n := s.Pooled("snap_x"); n != 3 {
		t.Fatalf("Pooled: %d, want 3", n)
	}
	if p := s.Pools(); len(p) != 1 || p["snap_x"] != 3 {
		t.Fatalf("Pools: %v", p)
	}
	for _, rec := range s.List(env.Project.ID) {
		if rec.Status == StatusPooled {
			t.Fatalf("a warm copy is listed: %+v", rec)
		}
	}
	claimed, ok := s.Claim(ctx, "snap_x", 5000)
	if !ok || claimed.Status != StatusRunning || claimed.PoolOf != "" || claimed.EndAt == nil {
		t.Fatalf("Claim: %+v %v", claimed, ok)
	}
	if got := env.run(t, s, claimed.ID, `cat "$HOME/f"`); got != "from-source\n" {
		t.Fatalf("claimed copy: %q", got)
	}
	if _, ok := s.Claim(ctx, "snap_other", 0); ok {
		t.Fatal("claimed a copy of a snapshot with no pool")
	}
	s.TrimPool(ctx, "snap_x", 1)
	if n := s.Pooled("snap_x"); n != 1 {
		t.Fatalf("after TrimPool to 1: %d", n)
	}
	s.TrimPool(ctx, "snap_x", 0)
	// The source, the paused copy and the claimed one are left.
	sandboxtest.Eventually(t, "the runtime to hold three sandboxes", func() bool {
		list, _ := env.Runtime.List(ctx)
		return len(list) == 3
	})
}

// TestFakeRecover: after a restart the service keeps a sandbox that still
// runs (and reaches its agent) and frees one that died meanwhile.
func TestFakeRecover(t *testing.T) {
	env := newFakeEnv(t)
	first := env.service(t, nil)
	live := env.create(t, first, CreateRequest{})
	dead := env.create(t, first, CreateRequest{})
	env.run(t, first, live.ID, `echo before > "$HOME/f"`)
	first.Close()
	if err := env.Runtime.Crash(dead.ID); err != nil {
		t.Fatal(err)
	}

	second := env.service(t, nil)
	// Recovery probes the agent of a running sandbox in the background.
	sandboxtest.Eventually(t, "the live sandbox to be reattached", func() bool {
		_, _, err := second.Agent(env.Project.ID, live.ID)
		return err == nil
	})
	if got := env.run(t, second, live.ID, `cat "$HOME/f"`); got != "before\n" {
		t.Fatalf("recovered sandbox: %q", got)
	}
	sandboxtest.Eventually(t, "the dead sandbox to be freed", env.gone(second, dead.ID))
	if err := second.Kill(context.Background(), env.Project.ID, live.ID); err != nil {
		t.Fatalf("Kill of the recovered sandbox: %v", err)
	}
}

// TestFakeWatch: a sandbox whose processes die behind the service's back
// is noticed and freed; the others are left alone.
func TestFakeWatch(t *testing.T) {
	env := newFakeEnv(t)
	s := env.service(t, nil)
	dies := env.create(t, s, CreateRequest{})
	lives := env.create(t, s, CreateRequest{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Watch(ctx, 50*time.Millisecond); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	if err := env.Runtime.Crash(dies.ID); err != nil {
		t.Fatal(err)
	}
	sandboxtest.Eventually(t, "the watch to free the dead sandbox", env.gone(s, dies.ID))
	if rec, err := s.Get(env.Project.ID, lives.ID); err != nil || rec.Status != StatusRunning {
		t.Fatalf("the live sandbox: %+v, %v", rec, err)
	}
	if got := env.run(t, s, lives.ID, "echo ok"); got != "ok\n" {
		t.Fatalf("the live sandbox: %q", got)
	}
}

// TestFakeAutoPauseKeepsTimeout: a sandbox paused by its deadline
// (autoPause) gets its whole timeout for its next run, not the moment it
// had left; a resume runs it that long.
func TestFakeAutoPauseKeepsTimeout(t *testing.T) {
	env := newFakeEnv(t)
	s := env.service(t, nil)
	rec := env.create(t, s, CreateRequest{TimeoutMs: 1500, AutoPause: true})
	sandboxtest.Eventually(t, "the deadline to pause", func() bool {
		got, err := s.Get(env.Project.ID, rec.ID)
		return err == nil && got.Status == StatusPaused
	})
	got, _ := s.Get(env.Project.ID, rec.ID)
	if got.RemainingMs != 1500 {
		t.Fatalf("after the autoPause: remainingMs %d, want the whole 1500", got.RemainingMs)
	}
	resumed, err := s.Resume(context.Background(), env.Project.ID, rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if resumed.EndAt == nil || time.Until(*resumed.EndAt) < time.Second {
		t.Fatalf("resumed with endAt %v: want about 1.5 s from now", resumed.EndAt)
	}
}

// TestFakeUpdate: the feature packages' seam. A change is kept and
// persisted (a restarted service has it); a failing fn changes nothing;
// the copy fn gets is its own; another project's or a killed sandbox is
// not found.
func TestFakeUpdate(t *testing.T) {
	env := newFakeEnv(t)
	s := env.service(t, nil)
	ctx := context.Background()
	rec := env.create(t, s, CreateRequest{Metadata: map[string]string{"k": "v"}})
	got, err := s.Update(ctx, env.Project.ID, rec.ID, func(r *Record) error {
		r.Ports = append(r.Ports, 3000)
		r.Metadata["k"] = "changed in the copy"
		return nil
	})
	if err != nil || len(got.Ports) != 1 || got.Ports[0] != 3000 {
		t.Fatalf("Update: %+v %v", got.Ports, err)
	}
	boom := errors.New("boom")
	if _, err := s.Update(ctx, env.Project.ID, rec.ID, func(r *Record) error {
		r.Ports = nil
		return boom
	}); !errors.Is(err, boom) {
		t.Fatalf("a failing fn: %v, want its error", err)
	}
	live, ok := s.Live(rec.ID)
	if !ok || len(live.Ports) != 1 || live.Metadata["k"] != "changed in the copy" {
		t.Fatalf("after a failing fn: %+v %v, want the first change kept", live, ok)
	}
	live.Ports[0] = 1
	if again, _ := s.Live(rec.ID); again.Ports[0] != 3000 {
		t.Fatalf("changing Live's copy changed the table")
	}
	if _, err := s.Update(ctx, "prj_other", rec.ID, func(*Record) error { return nil }); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another project's: %v, want ErrNotFound", err)
	}
	n := 0
	s.EachLive(func(r Record) {
		if r.ID == rec.ID {
			n++
		}
	})
	if n != 1 {
		t.Fatalf("EachLive saw the sandbox %d times", n)
	}

	s.Close()
	restarted := env.service(t, nil)
	sandboxtest.Eventually(t, "the restarted service to reattach it", func() bool {
		got, err := restarted.Get(env.Project.ID, rec.ID)
		return err == nil && got.Status == StatusRunning
	})
	if after, err := restarted.Get(env.Project.ID, rec.ID); err != nil || len(after.Ports) != 1 || after.Ports[0] != 3000 {
		t.Fatalf("after a restart: %+v %v, want the change persisted", after.Ports, err)
	}
	if err := restarted.Kill(ctx, env.Project.ID, rec.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := restarted.Update(ctx, env.Project.ID, rec.ID, func(*Record) error { return nil }); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("a killed sandbox: %v, want ErrNotFound", err)
	}
}

// roundTrips is an Observer that counts agent round trips.
type roundTrips struct {
	mu sync.Mutex
	n  int
}

func (o *roundTrips) Operation(string, time.Duration, error) {}
func (o *roundTrips) AgentRoundTrip(time.Duration) {
	o.mu.Lock()
	o.n++
	o.mu.Unlock()
}

func (o *roundTrips) count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n
}

// TestFakeUsageAndQuota: what the node reserves and what the store says
// each project uses follow the sandboxes; a create over the project's
// memory quota is refused naming the limit and the use; ProbeAgents times the
// running sandboxes' agents for the Observer and stops with its context.
func TestFakeUsageAndQuota(t *testing.T) {
	env := newFakeEnv(t)
	obs := &roundTrips{}
	s := env.service(t, func(c *Config) {
		c.Observer = obs
		c.Limits = func(context.Context, string) (store.Limits, error) { return store.Limits{MemoryGB: 5}, nil }
	})
	ctx := context.Background()
	a := env.create(t, s, CreateRequest{Size: "small"})
	if cpus, mem := s.Reserved(); cpus != float64(a.CPUs) || mem != a.MemoryMB {
		t.Fatalf("Reserved = %v vCPUs, %d MB; want the one sandbox's %v, %d", cpus, mem, a.CPUs, a.MemoryMB)
	}
	_, err := s.Create(ctx, CreateRequest{ProjectID: env.Project.ID, Size: "large"})
	if !errors.Is(err, errdefs.ErrQuota) || !strings.Contains(err.Error(), "memory-gb 4 of 5 in use, this needs 16") {
		t.Fatalf("create over the memory quota: %v, want ErrQuota naming the memory limit", err)
	}
	u, err := StoredUsage(ctx, env.Store)
	if err != nil {
		t.Fatal(err)
	}
	if got := u[env.Project.ID]; got.Sandboxes != 1 || got.MemoryMB != a.MemoryMB {
		t.Fatalf("StoredUsage = %+v, want the one sandbox", got)
	}

	pctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { s.ProbeAgents(pctx, 10*time.Millisecond); close(done) }()
	sandboxtest.Eventually(t, "agent round trips", func() bool { return obs.count() >= 3 })
	cancel()
	<-done

	if err := s.Kill(ctx, env.Project.ID, a.ID); err != nil {
		t.Fatal(err)
	}
	if cpus, mem := s.Reserved(); cpus != 0 || mem != 0 {
		t.Fatalf("Reserved after the kill = %v, %d", cpus, mem)
	}
}

// TestFakeWake: a command for a paused sandbox made with AutoResume
// resumes it (the resume told as caused by traffic) and runs; one made
// without answers sandbox_not_running and stays paused.
func TestFakeWake(t *testing.T) {
	env := newFakeEnv(t)
	var mu sync.Mutex
	var causes []string
	s := env.service(t, func(c *Config) {
		c.Events = sinkFunc(func(ev Event) {
			if ev.Type == EventResumed {
				mu.Lock()
				causes = append(causes, ev.By)
				mu.Unlock()
			}
		})
	})
	ctx := context.Background()
	wakes := env.create(t, s, CreateRequest{AutoResume: true})
	sleeps := env.create(t, s, CreateRequest{})
	for _, id := range []string{wakes.ID, sleeps.ID} {
		if err := s.Pause(ctx, env.Project.ID, id); err != nil {
			t.Fatal(err)
		}
	}
	if got := env.run(t, s, wakes.ID, "echo awake"); got != "awake\n" {
		t.Fatalf("exec in the paused autoResume sandbox: %q", got)
	}
	if got, _ := s.Get(env.Project.ID, wakes.ID); got.Status != StatusRunning || !got.AutoResume {
		t.Fatalf("after the exec: %s (autoResume %v), want running", got.Status, got.AutoResume)
	}
	mu.Lock()
	got := append([]string(nil), causes...)
	mu.Unlock()
	if len(got) != 1 || got[0] != CauseTraffic {
		t.Fatalf("resumes and their causes: %q, want one by traffic", got)
	}
	err := s.Exec(ctx, env.Project.ID, sleeps.ID, ExecRequest{Cmd: []string{"true"}}, func(agent.Event) error { return nil })
	if errdefs.Code(err) != "sandbox_not_running" {
		t.Fatalf("exec in a paused sandbox without autoResume: %v, want sandbox_not_running", err)
	}
	if _, _, err := s.Wake(ctx, env.Project.ID, sleeps.ID); errdefs.Code(err) != "sandbox_not_running" {
		t.Fatalf("Wake of a sandbox without autoResume: %v, want sandbox_not_running", err)
	}
	if got, _ := s.Get(env.Project.ID, sleeps.ID); got.Status != StatusPaused {
		t.Fatalf("a sandbox without autoResume: %s, want paused", got.Status)
	}
}

// sinkFunc is an EventSink of a function.
type sinkFunc func(Event)

func (f sinkFunc) Publish(ev Event) { f(ev) }

// TestFakePauseFiles: a files-only pause keeps what the sandbox wrote and
// ends its processes; its resume boots it (the same id and token); traffic
// does not wake it; a deadline's auto-pause can be files-only; a
// restarted service keeps the kind of a pause.
func TestFakePauseFiles(t *testing.T) {
	env := newFakeEnv(t)
	var mu sync.Mutex
	var details []string
	edit := func(c *Config) {
		c.Events = sinkFunc(func(ev Event) {
			if ev.Type == EventPaused || ev.Type == EventResumed {
				mu.Lock()
				details = append(details, ev.Type+":"+ev.Detail)
				mu.Unlock()
			}
		})
	}
	s := env.service(t, edit)
	ctx := context.Background()
	p := env.Project.ID
	rec := env.create(t, s, CreateRequest{E2B: true, AutoResume: true, AutoPause: true})
	env.run(t, s, rec.ID, `echo kept > "$HOME/f"; sleep 300 >/dev/null 2>&1 & echo $! > "$HOME/pid"`)
	if err := s.PauseFiles(ctx, p, rec.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.PauseFiles(ctx, p, rec.ID); err != nil {
		t.Fatalf("a second PauseFiles: %v, want a no-op", err)
	}
	got, _ := s.Get(p, rec.ID)
	if got.Status != StatusPaused || !got.FilesOnly || got.Wakes() {
		t.Fatalf("after PauseFiles: %s filesOnly %v wakes %v, want paused files-only, not woken by traffic", got.Status, got.FilesOnly, got.Wakes())
	}
	if st := env.runtimeState(t, rec.ID); st != runtime.StatePaused {
		t.Fatalf("runtime state %s, want paused", st)
	}
	if _, _, err := s.Wake(ctx, p, rec.ID); errdefs.Code(err) != "sandbox_not_running" {
		t.Fatalf("Wake of a files-only pause: %v, want sandbox_not_running", err)
	}

	// A restarted service knows the kind of the pause.
	s.Close()
	s = env.service(t, edit)
	sandboxtest.Eventually(t, "the paused sandbox to be reattached", func() bool {
		got, err := s.Get(p, rec.ID)
		return err == nil && got.Status == StatusPaused && got.FilesOnly
	})
	resumed, err := s.Resume(ctx, p, rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if resumed.Status != StatusRunning || resumed.FilesOnly || resumed.AgentToken != rec.AgentToken {
		t.Fatalf("resumed: %s filesOnly %v, token kept %v", resumed.Status, resumed.FilesOnly, resumed.AgentToken == rec.AgentToken)
	}
	if out := env.run(t, s, rec.ID, `cat "$HOME/f"; kill -0 $(cat "$HOME/pid") 2>/dev/null && echo alive || echo ended`); out != "kept\nended\n" {
		t.Fatalf("after the files-only resume: %q, want the file kept and the process ended", out)
	}
	mu.Lock()
	want := []string{EventPaused + ":files only", EventResumed + ":booted over its files"}
	if !slices.Equal(details, want) {
		t.Errorf("events %q, want %q", details, want)
	}
	mu.Unlock()

	// A memory pause is still one, and traffic wakes it.
	if err := s.Pause(ctx, p, rec.ID); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Get(p, rec.ID); got.FilesOnly || !got.Wakes() {
		t.Fatalf("a memory pause after a files-only one: filesOnly %v wakes %v", got.FilesOnly, got.Wakes())
	}

	for _, req := range []CreateRequest{{AutoPauseFiles: true}, {AutoPause: true, AutoResume: true, AutoPauseFiles: true}} {
		req.ProjectID = p
		if _, err := s.Create(ctx, req); !errors.Is(err, errdefs.ErrInvalid) {
			t.Fatalf("create %+v: %v, want ErrInvalid", req, err)
		}
	}
	timed := env.create(t, s, CreateRequest{TimeoutMs: 1000, AutoPause: true, AutoPauseFiles: true})
	sandboxtest.Eventually(t, "the deadline's files-only pause", func() bool {
		got, err := s.Get(p, timed.ID)
		return err == nil && got.Status == StatusPaused && got.FilesOnly
	})
}
