package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/lizard-build/lizard/internal/seal"
)

// secretsKeyFile writes a new secrets key to a file of the test's own
// (mode 600, as lizard requires) and returns its path.
func secretsKeyFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "secrets.key")
	if err := os.WriteFile(path, []byte(seal.NewKey().Encode()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestWorkloadIdentity: lizard as an OIDC issuer. A token minted for a
// sandbox's registered name verifies with go-jose against the key set the
// server publishes (fetched over HTTP through its discovery document) with
// the registered audience, a short expiry and a subject naming the project
// and the sandbox; after `lizard identity rotate-key`, the old token still
// verifies (its key stays published) while the new key signs; a killed
// sandbox's tokens mint nothing.
func TestWorkloadIdentity(t *testing.T) {
	addr := freeAddr(t)
	issuer := "http://" + addr + "/oidc"
	keyFile := secretsKeyFile(t)
	s := startServer(t, "", "--listen", addr, "--secrets-key-file", keyFile, "--oidc-issuer", issuer)
	ctx, cancel := context.WithTimeout(context.Background(), budget(5*time.Minute))
	defer cancel()

	call := func(method, path, body string, want int, out any) {
		t.Helper()
		var b any
		if body != "" {
			b = body
		}
		if code, raw := s.do(method, path, b, out); code != want {
			t.Fatalf("%s %s: %d %s, want %d", method, path, code, raw, want)
		}
	}
	var sb struct {
		ID        string `json:"sandboxId"`
		ProjectID string `json:"projectId"`
	}
	call("POST", "/api/sandboxes", `{"template":"base","timeoutMs":300000,"iam":{"tokens":{"aws":{"audience":"sts.amazonaws.com","tokenType":"JWT-SVID","lifetime":120}}}}`, 201, &sb)
	defer func() { s.do("DELETE", "/api/sandboxes/"+sb.ID, nil, nil) }()

	var doc struct {
		Issuer  string   `json:"issuer"`
		JWKSURI string   `json:"jwks_uri"`
		Algs    []string `json:"id_token_signing_alg_values_supported"`
	}
	getJSON(t, ctx, issuer+"/.well-known/openid-configuration", &doc)
	if doc.Issuer != issuer || doc.JWKSURI != issuer+"/.well-known/jwks.json" || len(doc.Algs) != 1 || doc.Algs[0] != "RS256" {
		t.Fatalf("discovery document %+v", doc)
	}
	mint := func() string {
		var out struct {
			Token string `json:"token"`
		}
		call("POST", "/api/sandboxes/"+sb.ID+"/iam/tokens/aws", "", 201, &out)
		return out.Token
	}
	verify := func(token string) (jwt.Claims, map[string]any, error) {
		var set jose.JSONWebKeySet
		getJSON(t, ctx, doc.JWKSURI, &set)
		parsed, err := jwt.ParseSigned(token, []jose.SignatureAlgorithm{jose.RS256})
		if err != nil {
			return jwt.Claims{}, nil, err
		}
		keys := set.Key(parsed.Headers[0].KeyID)
		if len(keys) != 1 {
			return jwt.Claims{}, nil, fmt.Errorf("the key set has no key %s", parsed.Headers[0].KeyID)
		}
		var std jwt.Claims
		var all map[string]any
		if err := parsed.Claims(keys[0].Key, &std, &all); err != nil {
			return jwt.Claims{}, nil, err
		}
		return std, all, std.Validate(jwt.Expected{Issuer: issuer, AnyAudience: jwt.Audience{"sts.amazonaws.com"}, Time: time.Now()})
	}
	old := mint()
	std, all, err := verify(old)
	if err != nil {
		t.Fatalf("the minted token does not verify against the published key set: %v", err)
	}
	if life := std.Expiry.Time().Sub(std.IssuedAt.Time()); life != 120*time.Second {
		t.Fatalf("the token lives %v, want the registered 2m", life)
	}
	if std.Subject != "spiffe://127.0.0.1/project/"+sb.ProjectID+"/sandbox/"+sb.ID || !strings.HasSuffix(std.Subject, "/sandbox/"+sb.ID) || all["sandbox_id"] != sb.ID {
		t.Fatalf("subject %q (claims %v): want the project and the sandbox %s", std.Subject, all, sb.ID)
	}
	if _, err := jwt.ParseSigned(old, []jose.SignatureAlgorithm{jose.RS256}); err != nil {
		t.Fatal(err)
	}
	if err := std.Validate(jwt.Expected{Issuer: issuer, AnyAudience: jwt.Audience{"another-audience"}, Time: time.Now()}); err == nil {
		t.Fatal("the token is valid for another audience")
	}

	// A rotation by the CLI, signing at once: the server takes the new key
	// within its reload (10 s); the old token keeps verifying.
	out := s.cli(t, "identity", "rotate-key", "--activate-in", "0s", "--oidc-issuer", issuer, "--secrets-key-file", keyFile)
	if !strings.Contains(out, "generation 2") {
		t.Fatalf("rotate-key said:\n%s", out)
	}
	oldKid := kidOf(t, old)
	var fresh string
	deadline := time.Now().Add(budget(30 * time.Second))
	for fresh = mint(); kidOf(t, fresh) == oldKid; fresh = mint() {
		if time.Now().After(deadline) {
			t.Fatalf("the server still signs with %s %v after the rotation", oldKid, budget(30*time.Second))
		}
		time.Sleep(200 * time.Millisecond)
	}
	if _, _, err := verify(fresh); err != nil {
		t.Fatalf("a token of the new key: %v", err)
	}
	if _, _, err := verify(old); err != nil {
		t.Fatalf("the old token after the rotation (it is valid for 2 minutes): %v", err)
	}
	var set jose.JSONWebKeySet
	getJSON(t, ctx, doc.JWKSURI, &set)
	if len(set.Keys) != 2 {
		t.Fatalf("%d published keys after the rotation, want both", len(set.Keys))
	}

	// A killed sandbox's tokens are gone with it.
	call("DELETE", "/api/sandboxes/"+sb.ID, "", 204, nil)
	call("POST", "/api/sandboxes/"+sb.ID+"/iam/tokens/aws", "", 404, nil)
	s.waitNoLeaks(t)
}

func kidOf(t *testing.T, token string) string {
	t.Helper()
	p, err := jwt.ParseSigned(token, []jose.SignatureAlgorithm{jose.RS256})
	if err != nil {
		t.Fatal(err)
	}
	return p.Headers[0].KeyID
}

// getJSON fetches url without credentials (relying parties have none) and
// decodes its JSON.
func getJSON(t *testing.T, ctx context.Context, url string, v any) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	if err := json.NewDecoder(bytes.NewReader(b)).Decode(v); err != nil {
		t.Fatalf("GET %s: %v: %s", url, err, b)
	}
}
