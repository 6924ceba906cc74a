package netconf

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/lizard-build/lizard/internal/egress"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/network"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/sandbox/sandboxtest"
)

// Tests over the fake runtime (sandboxtest): no root. The secrets and the
// workload tokens are maps here (the server wires the secrets store).

type names struct {
	mu      sync.Mutex
	secrets map[string]bool // project/name
	tokens  map[string]bool // sandbox/name
}

func (n *names) SecretExists(ctx context.Context, projectID, name string) (bool, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.secrets[projectID+"/"+name], nil
}

func (n *names) TokenExists(ctx context.Context, projectID, sandboxID, name string) (bool, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.tokens[sandboxID+"/"+name], nil
}

// addresses is the network manager's Lookup over a map.
type addresses map[netip.Addr]network.Source

func (a addresses) Lookup(ip netip.Addr) (network.Source, bool) {
	s, ok := a[ip]
	return s, ok
}

type logs map[string][]egress.Entry

func (l logs) Entries(id string) []egress.Entry { return l[id] }

// newCore is the sandbox service over the fake runtime.
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

func parse(t *testing.T, s network.Settings) network.Egress {
	t.Helper()
	e, err := network.ParseSettings("network", s, nil)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestSetNetwork: an update replaces the egress part of the configuration
// in the record and in the runtime together, keeps httpsPorts and the node
// API, and works on a paused sandbox; a refused update changes nothing.
func TestSetNetwork(t *testing.T) {
	env, core := newCore(t)
	n := &names{secrets: map[string]bool{env.Project.ID + "/tok": true}, tokens: map[string]bool{}}
	s := New(Config{Core: core, Runtime: env.Runtime, Secrets: n, Tokens: n})
	ctx := context.Background()
	first := parse(t, network.Settings{AllowOut: []string{"a.example.com"}, DenyOut: []string{"0.0.0.0/0"}, HTTPSPorts: []int{8443}})
	first.NodeAPI = true
	rec, err := core.Create(ctx, sandbox.CreateRequest{ProjectID: env.Project.ID, Egress: first})
	if err != nil {
		t.Fatal(err)
	}
	next := parse(t, network.Settings{AllowOut: []string{"b.example.com"}, DenyOut: []string{"10.0.0.0/8"},
		Rules: map[string][]network.Rule{"b.example.com": {{Transform: &network.Transform{Headers: map[string]string{"Authorization": "Bearer ${e2b.secrets.tok}"}}}}}})
	got, err := s.SetNetwork(ctx, env.Project.ID, rec.ID, next)
	if err != nil {
		t.Fatal(err)
	}
	if !got.NodeAPI || len(got.HTTPSPorts) != 1 || got.Restricted || got.Allowed[0] != "b.example.com" || len(got.Rules) != 1 {
		t.Fatalf("after the update: %+v", got)
	}
	if applied, _ := env.Runtime.Egress(rec.ID); applied.Allowed[0] != "b.example.com" || !applied.NodeAPI {
		t.Fatalf("the runtime has %+v", applied)
	}
	if stored, _ := s.Network(env.Project.ID, rec.ID); stored.Allowed[0] != "b.example.com" {
		t.Fatalf("the record has %+v", stored)
	}

	// Placeholders the project or the sandbox does not have.
	for _, tt := range []struct{ value, want string }{
		{"${e2b.secrets.nope}", `names secret "nope", which the project does not have`},
		{"${e2b.identity.tokens.aws}", `names workload token "aws", which the sandbox does not have`},
	} {
		bad := parse(t, network.Settings{Rules: map[string][]network.Rule{"c.example.com": {{Transform: &network.Transform{Headers: map[string]string{"X": tt.value}}}}}})
		_, err := s.SetNetwork(ctx, env.Project.ID, rec.ID, bad)
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tt.want) || !strings.HasPrefix(err.Error(), "network.rules") {
			t.Fatalf("%s: %v", tt.value, err)
		}
	}
	if applied, _ := env.Runtime.Egress(rec.ID); applied.Allowed[0] != "b.example.com" {
		t.Fatalf("a refused update changed the runtime's: %+v", applied)
	}
	n.tokens[rec.ID+"/aws"] = true
	withToken := parse(t, network.Settings{Rules: map[string][]network.Rule{"c.example.com": {{Transform: &network.Transform{Headers: map[string]string{"X": "${e2b.identity.tokens.aws}"}}}}}})
	if _, err := s.SetNetwork(ctx, env.Project.ID, rec.ID, withToken); err != nil {
		t.Fatalf("a registered token: %v", err)
	}

	// Paused: the record and the runtime still change, and a resume keeps it.
	if err := core.Pause(ctx, env.Project.ID, rec.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SetNetwork(ctx, env.Project.ID, rec.ID, first); err != nil {
		t.Fatalf("paused: %v", err)
	}
	if _, err := core.Resume(ctx, env.Project.ID, rec.ID); err != nil {
		t.Fatal(err)
	}
	if stored, _ := s.Network(env.Project.ID, rec.ID); stored.Allowed[0] != "a.example.com" || !stored.Restricted {
		t.Fatalf("after the resume: %+v", stored)
	}

	// Another project's sandbox, an unknown one.
	if _, err := s.SetNetwork(ctx, "prj_other", rec.ID, first); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another project: %v", err)
	}
	if _, err := s.Log("prj_other", rec.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another project's log: %v", err)
	}
}

// TestCheck: a new sandbox's placeholders are checked against the
// project's secrets and the create's own tokens; without a secrets store
// none is taken.
func TestCheck(t *testing.T) {
	n := &names{secrets: map[string]bool{"p/tok": true}}
	s := New(Config{Secrets: n, Tokens: n})
	e := parse(t, network.Settings{Rules: map[string][]network.Rule{"a.example.com": {{Transform: &network.Transform{Headers: map[string]string{
		"Authorization": "Bearer ${e2b.secrets.tok}", "X-Id": "${e2b.identity.tokens.aws}"}}}}}})
	ctx := context.Background()
	if err := s.Check(ctx, "p", e, []string{"aws"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Check(ctx, "p", e, nil); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "iam.tokens") {
		t.Fatalf("an unregistered token: %v", err)
	}
	if err := s.Check(ctx, "q", e, []string{"aws"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("another project's secret: %v", err)
	}
	if err := New(Config{}).Check(ctx, "p", e, []string{"aws"}); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "keeps none") {
		t.Fatalf("no secrets store: %v", err)
	}
}

// TestSource: the proxy learns the sandbox at an address with the
// configuration the network enforces and the project of the live record.
func TestSource(t *testing.T) {
	env, core := newCore(t)
	rec, err := core.Create(context.Background(), sandbox.CreateRequest{ProjectID: env.Project.ID})
	if err != nil {
		t.Fatal(err)
	}
	a := netip.MustParseAddr("10.250.0.9")
	enforced := network.Egress{Restricted: true}
	s := New(Config{Core: core, Addresses: addresses{a: {ID: rec.ID, Egress: enforced}},
		Logs: logs{rec.ID: {{Host: "x.example.com", Decision: egress.Denied}}}})
	src, ok := s.Source(a)
	if !ok || src.SandboxID != rec.ID || src.ProjectID != env.Project.ID || !src.Egress.Restricted {
		t.Fatalf("Source: %+v %v", src, ok)
	}
	if _, ok := s.Source(netip.MustParseAddr("10.250.0.10")); ok {
		t.Fatal("an address of no sandbox is known")
	}
	if l, err := s.Log(env.Project.ID, rec.ID); err != nil || len(l) != 1 || l[0].Host != "x.example.com" {
		t.Fatalf("Log: %+v %v", l, err)
	}
	if !s.Exists(rec.ID) {
		t.Fatal("a live sandbox does not exist")
	}
	if err := core.Kill(context.Background(), env.Project.ID, rec.ID); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Source(a); ok || s.Exists(rec.ID) {
		t.Fatal("a killed sandbox is still a source")
	}
}
