package template

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"

	"github.com/lizard-build/lizard/internal/netguard"
)

// TestCheckRegistry: pulls follow netguard's rule with --registry-allow's
// entries (the rule itself is tested in internal/netguard).
func TestCheckRegistry(t *testing.T) {
	p, err := NewPullPolicy([]string{"127.0.0.1:5000", "registry.internal"}, "")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for reg, refused := range map[string]bool{
		"127.0.0.1:5000":         false, // allowed
		"127.0.0.1:5001":         true,  // another port
		"localhost:5000":         true,  // resolves to loopback
		"registry.internal:8443": false, // allowed at any port
		"8.8.8.8":                false,
	} {
		err := p.checkRegistry(ctx, reg)
		if got := errors.Is(err, netguard.ErrRefused); got != refused {
			t.Errorf("checkRegistry(%s) = %v, want refused %v", reg, err, refused)
		}
	}
	var nilPolicy *PullPolicy
	if err := nilPolicy.checkRegistry(ctx, "127.0.0.1:5000"); !errors.Is(err, netguard.ErrRefused) {
		t.Errorf("no policy: %v", err)
	}
	for _, bad := range []string{"", "a/b", "host:port", "user@host"} {
		if _, err := NewPullPolicy([]string{bad}, ""); err == nil {
			t.Errorf("--registry-allow %q accepted", bad)
		}
	}
}

func TestPullPolicyAuth(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "config.json")
	os.WriteFile(file, []byte(`{"auths": {"https://index.docker.io/v1/": {"auth": "dXNlcjpwYXNz"},
		"registry.example:5000": {"username": "u2", "password": "p2"}}}`), 0o600)
	p, err := NewPullPolicy(nil, file)
	if err != nil {
		t.Fatal(err)
	}
	for ref, want := range map[string]authn.AuthConfig{
		"busybox:1":                 {Username: "user", Password: "pass"},
		"registry.example:5000/x:1": {Username: "u2", Password: "p2"},
		"other.example/x:1":         {},
	} {
		r, err := name.ParseReference(ref)
		if err != nil {
			t.Fatal(err)
		}
		a, err := p.Resolve(r.Context())
		if err != nil {
			t.Fatal(err)
		}
		got, err := a.Authorization()
		if err != nil || got.Username != want.Username || got.Password != want.Password {
			t.Errorf("%s: %+v, %v; want %+v", ref, got, err, want)
		}
	}
	os.WriteFile(file, []byte(`{"credsStore": "desktop"}`), 0o600)
	if _, err := NewPullPolicy(nil, file); err == nil {
		t.Error("a credential helper was accepted")
	}
	if _, err := NewPullPolicy(nil, filepath.Join(dir, "missing.json")); err == nil {
		t.Error("a missing file was accepted")
	}
}
