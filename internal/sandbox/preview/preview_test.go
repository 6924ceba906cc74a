package preview

import (
	"context"
	"errors"
	"net"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/sandbox/sandboxtest"
)

// Tests over the fake runtime (sandboxtest): no root.

func newCore(t *testing.T) (*sandboxtest.Env, *sandbox.Service) {
	t.Helper()
	env := sandboxtest.NewEnv(t)
	core := sandbox.New(sandbox.Config{Runtime: env.Runtime, Store: env.Store, Templates: env.Templates,
		SnapshotDir: env.SnapshotDir, Logger: sandboxtest.Logger(t)})
	if err := core.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(core.Close)
	return env, core
}

func create(t *testing.T, env *sandboxtest.Env, core *sandbox.Service, req sandbox.CreateRequest) sandbox.Record {
	t.Helper()
	req.ProjectID = env.Project.ID
	rec, err := core.Create(context.Background(), req)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	return rec
}

func TestTokenOf(t *testing.T) {
	r := sandbox.Record{PreviewToken: "sandbox", PortTokens: map[int]string{6081: "view"}}
	if got := tokenOf(r, 6081); got != "view" {
		t.Errorf("port with its own token: %q", got)
	}
	if got := tokenOf(r, 3000); got != "sandbox" {
		t.Errorf("other port: %q", got)
	}
}

// TestPreviews: an exposed port has a token and an address the proxy
// dials; closing it, or a pause, takes them away; a paused sandbox's
// preview resumes it.
func TestPreviews(t *testing.T) {
	env, core := newCore(t)
	s := New(core)
	rec := create(t, env, core, sandbox.CreateRequest{})
	ctx := context.Background()
	if _, err := s.Expose(ctx, env.Project.ID, rec.ID, 0); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("Expose port 0: %v, want ErrInvalid", err)
	}
	if _, err := s.PreviewToken(rec.ID, 8000); err == nil {
		t.Fatalf("a port never exposed has a token")
	}
	if _, err := s.Expose(ctx, env.Project.ID, rec.ID, 8000); err != nil {
		t.Fatalf("Expose: %v", err)
	}
	tok, err := s.PreviewToken(rec.ID, 8000)
	if err != nil || tok == "" {
		t.Fatalf("PreviewToken: %q %v", tok, err)
	}
	addr, err := s.PreviewAddr(ctx, rec.ID, 8000)
	host, port, _ := net.SplitHostPort(addr)
	if err != nil || port != "8000" || host != agentHost(t, core, rec.ID) {
		t.Fatalf("PreviewAddr: %q %v, want the sandbox's address, port 8000", addr, err)
	}
	// Another project cannot close it.
	if err := s.Unexpose(ctx, "prj_other", rec.ID, 8000); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Unexpose from another project: %v, want ErrNotFound", err)
	}
	// A paused sandbox's preview resumes it.
	if err := core.Pause(ctx, env.Project.ID, rec.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PreviewAddr(ctx, rec.ID, 8000); err != nil {
		t.Fatalf("PreviewAddr of a paused sandbox: %v", err)
	}
	if got, _ := core.Get(env.Project.ID, rec.ID); got.Status != sandbox.StatusRunning {
		t.Fatalf("after a preview of the paused sandbox: %s, want running", got.Status)
	}
	if err := s.Unexpose(ctx, env.Project.ID, rec.ID, 8000); err != nil {
		t.Fatalf("Unexpose: %v", err)
	}
	if _, err := s.PreviewToken(rec.ID, 8000); err == nil {
		t.Fatalf("a closed port still has a token")
	}
}

// agentHost is the host part of a sandbox's agent address.
func agentHost(t *testing.T, core *sandbox.Service, id string) string {
	t.Helper()
	rec, ok := core.Live(id)
	if !ok {
		t.Fatalf("%s is not live", id)
	}
	host, _, err := net.SplitHostPort(rec.AgentAddr)
	if err != nil {
		t.Fatal(err)
	}
	return host
}

// TestE2BTargets: where E2B-addressed traffic goes — envd's port
// marked, maskRequestHost with its port, a traffic token for private
// sandboxes — what is refused (a Lizard sandbox, a paused one), and the
// sandbox of a signed file URL found by its signature.
func TestE2BTargets(t *testing.T) {
	env, core := newCore(t)
	s := New(core)
	ctx := context.Background()
	lizard := create(t, env, core, sandbox.CreateRequest{})
	e2b := create(t, env, core, sandbox.CreateRequest{E2B: true, Secure: true, PrivateTraffic: true, MaskRequestHost: "localhost:${PORT}"})
	other := create(t, env, core, sandbox.CreateRequest{E2B: true, Secure: true})
	if _, err := core.Create(ctx, sandbox.CreateRequest{ProjectID: env.Project.ID, E2B: true, MaskRequestHost: "not a host"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("a bad mask: %v, want ErrInvalid", err)
	}

	if _, err := s.E2BTarget(lizard.ID, 3000); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("a Lizard sandbox by E2B addressing: %v, want ErrNotFound", err)
	}
	host := agentHost(t, core, e2b.ID)
	app, err := s.E2BTarget(e2b.ID, 3000)
	if err != nil || app.Addr != net.JoinHostPort(host, "3000") || app.Envd || app.Host != "localhost:3000" || app.TrafficToken == "" {
		t.Fatalf("E2BTarget port 3000: %+v %v", app, err)
	}
	envd, err := s.E2BTarget(e2b.ID, agent.Port)
	if err != nil || !envd.Envd || envd.Host != "" {
		t.Fatalf("E2BTarget envd: %+v %v (envd keeps its Host: the mask is for the app's ports)", envd, err)
	}

	got, _ := core.Get(env.Project.ID, e2b.ID)
	sign := func(token, exp string) url.Values {
		return url.Values{"path": {"/home/user/f"}, "username": {"user"}, "signature_expiration": {exp},
			"signature": {agent.FileSignature("/home/user/f", "read", "user", token, exp)}}
	}
	if id, port, ok := s.E2BSignedFile(sign(got.EnvdToken, "123"), "read"); !ok || id != e2b.ID || port != agent.Port {
		t.Fatalf("E2BSignedFile: %q %d %v, want %s's envd", id, port, ok, e2b.ID)
	}
	if _, _, ok := s.E2BSignedFile(sign(got.EnvdToken, "123"), "write"); ok {
		t.Fatalf("a read's signature routed a write")
	}
	if _, _, ok := s.E2BSignedFile(sign("not-a-token", ""), "read"); ok {
		t.Fatalf("a signature no sandbox made was routed")
	}
	// A copy restored from a snapshot keeps the mask, with tokens of its
	// own.
	dir := filepath.Join(t.TempDir(), "image")
	saved, err := core.Checkpoint(ctx, env.Project.ID, e2b.ID, dir)
	if err != nil {
		t.Fatal(err)
	}
	copied, err := core.Copy(ctx, sandbox.CopyRequest{From: saved, Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if c, err := s.E2BTarget(copied.ID, 8080); err != nil || c.Host != "localhost:8080" || c.TrafficToken == "" || c.TrafficToken == app.TrafficToken {
		t.Fatalf("the restored copy: %+v %v, want the mask and a traffic token of its own", c, err)
	}

	if err := core.Pause(ctx, env.Project.ID, e2b.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.E2BTarget(e2b.ID, 3000); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("a paused sandbox: %v, want ErrUnavailable (never resumed by traffic)", err)
	}
	if _, _, ok := s.E2BSignedFile(sign(got.EnvdToken, "123"), "read"); ok {
		t.Fatalf("a paused sandbox's signed URL was routed")
	}
	if got, _ := core.Get(env.Project.ID, e2b.ID); got.Status != sandbox.StatusPaused {
		t.Fatalf("E2B traffic resumed it: %s", got.Status)
	}
	for _, port := range []int{0, 70000} {
		if _, err := s.E2BTarget(other.ID, port); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("port %s: %v, want ErrNotFound", strconv.Itoa(port), err)
		}
	}
}

// resumes records the sandboxes' resumes and what caused each.
type resumes struct {
	mu sync.Mutex
	by []string
}

func (r *resumes) Publish(ev sandbox.Event) {
	if ev.Type == sandbox.EventResumed {
		r.mu.Lock()
		r.by = append(r.by, ev.By)
		r.mu.Unlock()
	}
}

// TestE2BAutoResume: a paused sandbox made with autoResume is an Asleep
// target (with its tokens, for the proxy to check) and is woken by
// E2BWake — once for wakes arriving together, the resume told as caused by
// traffic — after which it is a target like any running one; without
// autoResume it stays ErrUnavailable and cannot be woken.
func TestE2BAutoResume(t *testing.T) {
	env := sandboxtest.NewEnv(t)
	events := &resumes{}
	core := sandbox.New(sandbox.Config{Runtime: env.Runtime, Store: env.Store, Templates: env.Templates,
		SnapshotDir: env.SnapshotDir, Logger: sandboxtest.Logger(t), Events: events})
	if err := core.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(core.Close)
	s := New(core)
	ctx := context.Background()
	wakes := create(t, env, core, sandbox.CreateRequest{E2B: true, Secure: true, AutoPause: true, AutoResume: true})
	sleeps := create(t, env, core, sandbox.CreateRequest{E2B: true, AutoPause: true})
	for _, id := range []string{wakes.ID, sleeps.ID} {
		if err := core.Pause(ctx, env.Project.ID, id); err != nil {
			t.Fatal(err)
		}
	}
	asleep, err := s.E2BTarget(wakes.ID, agent.Port)
	if err != nil || !asleep.Asleep || asleep.Addr != "" || !asleep.Envd || asleep.AccessToken == "" || asleep.AccessToken != wakes.EnvdToken {
		t.Fatalf("the paused autoResume sandbox: %+v %v, want an Asleep envd target with its access token", asleep, err)
	}
	if got, _ := core.Get(env.Project.ID, wakes.ID); got.Status != sandbox.StatusPaused {
		t.Fatalf("looking it up woke it: %s", got.Status)
	}

	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.E2BWake(ctx, wakes.ID)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("wake %d: %v", i, err)
		}
	}
	if awake, err := s.E2BTarget(wakes.ID, agent.Port); err != nil || awake.Asleep || awake.Addr == "" {
		t.Fatalf("after the wake: %+v %v, want envd's address", awake, err)
	}
	events.mu.Lock()
	by := slices.Clone(events.by)
	events.mu.Unlock()
	if !slices.Equal(by, []string{sandbox.CauseTraffic}) {
		t.Fatalf("resumes and their causes: %q, want one, by traffic", by)
	}

	if _, err := s.E2BTarget(sleeps.ID, agent.Port); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("a paused sandbox without autoResume: %v, want ErrUnavailable", err)
	}
	if err := s.E2BWake(ctx, sleeps.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("waking a sandbox without autoResume: %v, want ErrNotFound", err)
	}
	if got, _ := core.Get(env.Project.ID, sleeps.ID); got.Status != sandbox.StatusPaused {
		t.Fatalf("a sandbox without autoResume was resumed: %s", got.Status)
	}
}
