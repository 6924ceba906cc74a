package sandbox

import (
	"context"
	"errors"
	"net"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/errdefs"
)

// TestFakePreviews: an exposed port has a token and an address the proxy
// dials; closing it, or a pause, takes them away; a paused sandbox's
// preview resumes it.
func TestFakePreviews(t *testing.T) {
	env := newFakeEnv(t)
	s := env.service(t, nil)
	rec := env.create(t, s, CreateRequest{})
	ctx := context.Background()
	if _, err := s.Expose(ctx, env.p.ID, rec.ID, 0); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("Expose port 0: %v, want ErrInvalid", err)
	}
	if _, err := s.PreviewToken(rec.ID, 8000); err == nil {
		t.Fatalf("a port never exposed has a token")
	}
	if _, err := s.Expose(ctx, env.p.ID, rec.ID, 8000); err != nil {
		t.Fatalf("Expose: %v", err)
	}
	tok, err := s.PreviewToken(rec.ID, 8000)
	if err != nil || tok == "" {
		t.Fatalf("PreviewToken: %q %v", tok, err)
	}
	addr, err := s.PreviewAddr(ctx, rec.ID, 8000)
	host, port, _ := net.SplitHostPort(addr)
	if err != nil || port != "8000" || host != env.agentHost(t, s, rec.ID) {
		t.Fatalf("PreviewAddr: %q %v, want the sandbox's address, port 8000", addr, err)
	}
	// Another project cannot close it.
	if err := s.Unexpose(ctx, "prj_other", rec.ID, 8000); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Unexpose from another project: %v, want ErrNotFound", err)
	}
	// A paused sandbox's preview resumes it.
	if err := s.Pause(ctx, env.p.ID, rec.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PreviewAddr(ctx, rec.ID, 8000); err != nil {
		t.Fatalf("PreviewAddr of a paused sandbox: %v", err)
	}
	if got, _ := s.Get(env.p.ID, rec.ID); got.Status != StatusRunning {
		t.Fatalf("after a preview of the paused sandbox: %s, want running", got.Status)
	}
	if err := s.Unexpose(ctx, env.p.ID, rec.ID, 8000); err != nil {
		t.Fatalf("Unexpose: %v", err)
	}
	if _, err := s.PreviewToken(rec.ID, 8000); err == nil {
		t.Fatalf("a closed port still has a token")
	}
}

// agentHost is the host part of a sandbox's agent address.
func (env *fakeEnv) agentHost(t *testing.T, s *Service, id string) string {
	t.Helper()
	rec, ok := s.live(id)
	if !ok {
		t.Fatalf("%s is not live", id)
	}
	host, _, err := net.SplitHostPort(rec.AgentAddr)
	if err != nil {
		t.Fatal(err)
	}
	return host
}

// TestFakeE2BTargets: where E2B-addressed traffic goes — envd's port
// marked, maskRequestHost with its port, a traffic token for private
// sandboxes — what is refused (a Lizard sandbox, a paused one), and the
// sandbox of a signed file URL found by its signature.
func TestFakeE2BTargets(t *testing.T) {
	env := newFakeEnv(t)
	s := env.service(t, nil)
	ctx := context.Background()
	lizard := env.create(t, s, CreateRequest{})
	e2b := env.create(t, s, CreateRequest{E2B: true, Secure: true, PrivateTraffic: true, MaskRequestHost: "localhost:${PORT}"})
	other := env.create(t, s, CreateRequest{E2B: true, Secure: true})
	if _, err := s.Create(ctx, CreateRequest{ProjectID: env.p.ID, E2B: true, MaskRequestHost: "not a host"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("a bad mask: %v, want ErrInvalid", err)
	}

	if _, err := s.E2BTarget(lizard.ID, 3000); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("a Lizard sandbox by E2B addressing: %v, want ErrNotFound", err)
	}
	host := env.agentHost(t, s, e2b.ID)
	app, err := s.E2BTarget(e2b.ID, 3000)
	if err != nil || app.Addr != net.JoinHostPort(host, "3000") || app.Envd || app.Host != "localhost:3000" || app.TrafficToken == "" {
		t.Fatalf("E2BTarget port 3000: %+v %v", app, err)
	}
	envd, err := s.E2BTarget(e2b.ID, agent.Port)
	if err != nil || !envd.Envd || envd.Host != "" {
		t.Fatalf("E2BTarget envd: %+v %v (envd keeps its Host: the mask is for the app's ports)", envd, err)
	}

	got, _ := s.Get(env.p.ID, e2b.ID)
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
	snap, err := s.TakeSnapshot(ctx, env.p.ID, e2b.ID, "masked", 0)
	if err != nil {
		t.Fatal(err)
	}
	copied, err := s.Restore(ctx, env.p.ID, snap.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	if c, err := s.E2BTarget(copied.ID, 8080); err != nil || c.Host != "localhost:8080" || c.TrafficToken == "" || c.TrafficToken == app.TrafficToken {
		t.Fatalf("the restored copy: %+v %v, want the mask and a traffic token of its own", c, err)
	}

	if err := s.Pause(ctx, env.p.ID, e2b.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.E2BTarget(e2b.ID, 3000); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("a paused sandbox: %v, want ErrUnavailable (never resumed by traffic)", err)
	}
	if _, _, ok := s.E2BSignedFile(sign(got.EnvdToken, "123"), "read"); ok {
		t.Fatalf("a paused sandbox's signed URL was routed")
	}
	if got, _ := s.Get(env.p.ID, e2b.ID); got.Status != StatusPaused {
		t.Fatalf("E2B traffic resumed it: %s", got.Status)
	}
	for _, port := range []int{0, 70000} {
		if _, err := s.E2BTarget(other.ID, port); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("port %s: %v, want ErrNotFound", strconv.Itoa(port), err)
		}
	}
}

// TestFakeAutoPauseKeepsTimeout: a sandbox paused by its deadline
// (autoPause) gets its whole timeout for its next run, not the moment it
// had left; a resume runs it that long.
func TestFakeAutoPauseKeepsTimeout(t *testing.T) {
	env := newFakeEnv(t)
	s := env.service(t, nil)
	rec := env.create(t, s, CreateRequest{TimeoutMs: 1500, AutoPause: true})
	eventually(t, "the deadline to pause", func() bool {
		got, err := s.Get(env.p.ID, rec.ID)
		return err == nil && got.Status == StatusPaused
	})
	got, _ := s.Get(env.p.ID, rec.ID)
	if got.RemainingMs != 1500 {
		t.Fatalf("after the autoPause: remainingMs %d, want the whole 1500", got.RemainingMs)
	}
	resumed, err := s.Resume(context.Background(), env.p.ID, rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	if resumed.EndAt == nil || time.Until(*resumed.EndAt) < time.Second {
		t.Fatalf("resumed with endAt %v: want about 1.5 s from now", resumed.EndAt)
	}
}
