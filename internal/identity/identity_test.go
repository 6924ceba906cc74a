package identity

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/seal"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/store/sqlite"
)

// clock is a settable time for the tests.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

type env struct {
	st      *sqlite.Store
	key     seal.Key
	keys    *seal.Keyring
	clock   *clock
	project string
	sandbox string
}

func newEnv(t *testing.T) env {
	t.Helper()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "lizard.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	p, err := st.CreateProject(ctx, "p", "")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.PutSandbox(ctx, store.Sandbox{ID: "sbxone", ProjectID: p.ID, Template: "base", Size: "small", Status: "running", Spec: []byte(`{}`), StartedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	key := seal.NewKey()
	return env{st: st, key: key, keys: seal.NewKeyring(key), clock: &clock{t: time.Now().Truncate(time.Second)}, project: p.ID, sandbox: "sbxone"}
}

func (e env) issuer(t *testing.T) *Issuer {
	t.Helper()
	i, err := New(context.Background(), Config{Store: e.st, Keys: e.keys, Issuer: "https://lizard.example.com:8443/oidc/", Now: e.clock.now})
	if err != nil {
		t.Fatal(err)
	}
	return i
}

// verify checks a token with go-jose against the issuer's published key
// set, as a relying party does, and returns its claims.
func verify(t *testing.T, i *Issuer, token, audience string, at time.Time) (Claims, error) {
	t.Helper()
	ks, err := json.Marshal(i.KeySet())
	if err != nil {
		t.Fatal(err)
	}
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(ks, &set); err != nil {
		t.Fatalf("the key set does not parse as a JWKS: %v", err)
	}
	parsed, err := jwt.ParseSigned(token, []jose.SignatureAlgorithm{jose.RS256})
	if err != nil {
		return Claims{}, err
	}
	if len(parsed.Headers) != 1 {
		t.Fatalf("%d headers", len(parsed.Headers))
	}
	keys := set.Key(parsed.Headers[0].KeyID)
	if len(keys) != 1 {
		return Claims{}, errors.New("no published key of the token's kid " + parsed.Headers[0].KeyID)
	}
	var std jwt.Claims
	var mine Claims
	if err := parsed.Claims(keys[0].Key, &std, &mine); err != nil {
		return Claims{}, err
	}
	err = std.ValidateWithLeeway(jwt.Expected{Issuer: i.Discovery().Issuer, AnyAudience: jwt.Audience{audience}, Time: at}, 0)
	return mine, err
}

// TestMint: a registered token verifies against the published key set with
// its audience, a short expiry and a subject naming the project and the
// sandbox; an unknown name, another project or a gone sandbox mints nothing.
func TestMint(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	i := e.issuer(t)
	if d := i.Discovery(); d.Issuer != "https://lizard.example.com:8443/oidc" || d.JWKSURI != d.Issuer+"/.well-known/jwks.json" || i.Path() != "/oidc" {
		t.Fatalf("discovery %+v, path %q", d, i.Path())
	}
	toks, err := i.Check("iam", &IAM{Tokens: map[string]TokenDef{
		"aws": {Audience: "sts.amazonaws.com", TokenType: "JWT-SVID"},
		"gcp": {Audience: "//iam.googleapis.com/projects/1/pool", TokenType: "JWT-SVID", Lifetime: 120},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := i.Register(ctx, e.project, e.sandbox, toks); err != nil {
		t.Fatal(err)
	}
	listed, err := i.SandboxTokens(ctx, e.project, e.sandbox)
	if err != nil || len(listed) != 2 || listed[0] != (Token{Name: "aws", Audience: "sts.amazonaws.com", TokenType: "JWT-SVID", Lifetime: 300}) || listed[1].Lifetime != 120 {
		t.Fatalf("SandboxTokens: %+v %v", listed, err)
	}
	tok, exp, err := i.Mint(ctx, e.project, e.sandbox, "aws")
	if err != nil {
		t.Fatal(err)
	}
	now := e.clock.now()
	if !exp.Equal(now.Add(DefaultLifetime)) {
		t.Fatalf("expiry %v, want %v", exp, now.Add(DefaultLifetime))
	}
	c, err := verify(t, i, tok, "sts.amazonaws.com", now)
	if err != nil {
		t.Fatalf("the token does not verify: %v", err)
	}
	wantSub := "spiffe://lizard.example.com/project/" + e.project + "/sandbox/" + e.sandbox
	if c.Subject != wantSub || c.Sandbox != e.sandbox || c.Project != e.project || c.TokenName != "aws" || c.Expiry-c.IssuedAt != 300 || c.ID == "" {
		t.Fatalf("claims %+v, want sub %s and a 300 s life", c, wantSub)
	}
	if _, err := verify(t, i, tok, "another-audience", now); err == nil {
		t.Fatal("the token verifies for another audience")
	}
	if _, err := verify(t, i, tok, "sts.amazonaws.com", now.Add(DefaultLifetime+time.Second)); err == nil {
		t.Fatal("the token verifies after its expiry")
	}
	tok2, _, err := i.Mint(ctx, e.project, e.sandbox, "aws")
	if err != nil || tok2 == tok {
		t.Fatalf("a second mint is not a fresh token: %v", err)
	}
	gcp, _, err := i.Mint(ctx, e.project, e.sandbox, "gcp")
	if err != nil {
		t.Fatal(err)
	}
	if c, err := verify(t, i, gcp, "//iam.googleapis.com/projects/1/pool", now); err != nil || c.Expiry-c.IssuedAt != 120 {
		t.Fatalf("gcp token: %+v %v", c, err)
	}
	// A tampered payload does not verify.
	parts := strings.Split(tok, ".")
	parts[1] = strings.Replace(parts[1], parts[1][:4], "eyJz", 1)
	if _, err := verify(t, i, strings.Join(parts, "."), "sts.amazonaws.com", now); err == nil {
		t.Fatal("a tampered token verifies")
	}
	for _, c := range []struct{ project, sandbox, name string }{{e.project, e.sandbox, "azure"}, {"prj_other", e.sandbox, "aws"}, {e.project, "sbxnone", "aws"}} {
		if _, err := i.MintToken(ctx, c.project, c.sandbox, c.name); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("MintToken %+v: %v, want ErrNotFound", c, err)
		}
		if ok, err := i.TokenExists(ctx, c.project, c.sandbox, c.name); ok || err != nil {
			t.Fatalf("TokenExists %+v: %v %v", c, ok, err)
		}
	}
	if ok, err := i.TokenExists(ctx, e.project, e.sandbox, "gcp"); !ok || err != nil {
		t.Fatalf("TokenExists gcp: %v %v", ok, err)
	}
	// The sandbox's record goes: so do its tokens.
	if err := e.st.DeleteSandbox(ctx, e.sandbox); err != nil {
		t.Fatal(err)
	}
	if _, err := i.MintToken(ctx, e.project, e.sandbox, "aws"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("a token of a killed sandbox: %v", err)
	}
	if err := i.Register(ctx, e.project, e.sandbox, toks); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Register for a sandbox without a record: %v", err)
	}
}

// TestRotation: a rotated key is published before it signs; an old token
// keeps verifying until it expires; the old key leaves the key set once
// none of its tokens can be valid, and another node sees the same keys.
func TestRotation(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	i := e.issuer(t)
	other := e.issuer(t) // a second node on the same database
	toks, _ := i.Check("iam", &IAM{Tokens: map[string]TokenDef{"aws": {Audience: "sts", TokenType: "JWT-SVID", Lifetime: 3600}}})
	if err := i.Register(ctx, e.project, e.sandbox, toks); err != nil {
		t.Fatal(err)
	}
	if len(i.Keys()) != 1 || len(other.Keys()) != 1 || i.Keys()[0].ID != other.Keys()[0].ID {
		t.Fatalf("two nodes made or loaded different first keys: %+v %+v", i.Keys(), other.Keys())
	}
	old, _, err := i.Mint(ctx, e.project, e.sandbox, "aws")
	if err != nil {
		t.Fatal(err)
	}
	k2, err := other.Rotate(ctx, PublishAhead)
	if err != nil || k2.Generation != 2 {
		t.Fatalf("Rotate: %+v %v", k2, err)
	}
	if err := i.maintain(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(i.KeySet().Keys); n != 2 {
		t.Fatalf("%d published keys after a rotation, want both", n)
	}
	// Until the new key's time, the old one signs.
	before, _, _ := i.Mint(ctx, e.project, e.sandbox, "aws")
	if kidOf(t, before) == k2.ID {
		t.Fatal("the new key signs before its time")
	}
	e.clock.add(PublishAhead)
	after, _, _ := i.Mint(ctx, e.project, e.sandbox, "aws")
	if kidOf(t, after) != k2.ID {
		t.Fatalf("after its time the new key does not sign: kid %s, want %s", kidOf(t, after), k2.ID)
	}
	// The old token, an hour old, still verifies until its expiry.
	if _, err := verify(t, i, old, "sts", e.clock.now().Add(time.Second)); err == nil {
		t.Fatal("an expired token verifies")
	}
	if _, err := verify(t, i, before, "sts", e.clock.now().Add(-time.Second)); err != nil {
		t.Fatalf("a token of the old key, valid until %v, does not verify after the rotation: %v", e.clock.now().Add(time.Hour-PublishAhead), err)
	}
	e.clock.add(MaxLifetime + Grace - time.Second)
	if err := i.maintain(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(i.KeySet().Keys); n != 2 {
		t.Fatalf("the old key left before its tokens' time: %d keys", n)
	}
	e.clock.add(time.Second)
	if err := i.maintain(ctx); err != nil {
		t.Fatal(err)
	}
	if ks := i.KeySet().Keys; len(ks) != 1 || ks[0].Kid != k2.ID {
		t.Fatalf("after the old key's tokens expired: %+v, want only %s", ks, k2.ID)
	}
	if ks, _ := e.st.SigningKeys(ctx); len(ks) != 1 {
		t.Fatalf("the retired key is still stored: %d keys", len(ks))
	}
	if err := other.maintain(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := verify(t, other, after, "sts", e.clock.now().Add(-MaxLifetime)); err != nil {
		t.Fatalf("the other node's key set does not verify the new key's token: %v", err)
	}

	// Automatic rotation: once the newest key is older than Rotation, a
	// node makes the next, published ahead.
	e.clock.add(DefaultRotation)
	if err := other.maintain(ctx); err != nil {
		t.Fatal(err)
	}
	if ks := other.Keys(); len(ks) != 2 || ks[1].Generation != 3 || !ks[1].ActivateAt.Equal(e.clock.now().Add(PublishAhead)) {
		t.Fatalf("automatic rotation: %+v", ks)
	}
	// The node that did not rotate does not make another one.
	if err := i.maintain(ctx); err != nil {
		t.Fatal(err)
	}
	if ks, _ := e.st.SigningKeys(ctx); len(ks) != 2 {
		t.Fatalf("a second node rotated again: %d keys", len(ks))
	}

	// A leaked key: rotate at once and drop the others.
	k4, err := i.Rotate(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := i.DropOld(ctx); err != nil || n != 2 {
		t.Fatalf("DropOld: %d %v, want 2", n, err)
	}
	if ks := i.KeySet().Keys; len(ks) != 1 || ks[0].Kid != k4.ID {
		t.Fatalf("after DropOld: %+v", ks)
	}
}

// TestSealedKeys: signing keys are sealed with the operator's key; a node
// with another key cannot start, and `lizard secrets rotate-key` reseals
// them.
func TestSealedKeys(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	i := e.issuer(t)
	stored, _ := e.st.SigningKeys(ctx)
	if len(stored) != 1 || seal.SealedWith(stored[0].Private) == "" {
		t.Fatal("the signing key is not sealed")
	}
	if _, err := New(ctx, Config{Store: e.st, Keys: seal.NewKeyring(seal.NewKey()), Issuer: i.URL()}); !errors.Is(err, seal.ErrWrongKey) {
		t.Fatalf("an issuer with another seal key: %v, want ErrWrongKey", err)
	}
	next := seal.NewKey()
	both := seal.NewKeyring(next, seal.NewKey())
	if _, err := Reseal(ctx, e.st, both); !errors.Is(err, seal.ErrWrongKey) {
		t.Fatalf("Reseal without the old key: %v", err)
	}
	n, err := Reseal(ctx, e.st, seal.NewKeyring(next, e.key))
	if err != nil || n != 1 {
		t.Fatalf("Reseal: %d %v", n, err)
	}
	if _, err := New(ctx, Config{Store: e.st, Keys: seal.NewKeyring(next), Issuer: i.URL()}); err != nil {
		t.Fatalf("an issuer with the new seal key alone: %v", err)
	}
	if _, err := New(ctx, Config{Store: e.st, Issuer: i.URL()}); err == nil || !strings.Contains(err.Error(), "--secrets-key-file") {
		t.Fatalf("an issuer without a seal key: %v", err)
	}
}

// TestCheck: iam definitions as E2B's API takes them; each refusal names
// its field.
func TestCheck(t *testing.T) {
	e := newEnv(t)
	i := e.issuer(t)
	if ts, err := i.Check("iam", nil); err != nil || ts != nil {
		t.Fatalf("no iam: %v %v", ts, err)
	}
	many := map[string]TokenDef{}
	for _, n := range []string{"a", "b", "c", "d", "e", "f"} {
		many[n] = TokenDef{Audience: "x", TokenType: TokenType}
	}
	for _, c := range []struct {
		tokens map[string]TokenDef
		field  string
	}{
		{many, "iam.tokens"},
		{map[string]TokenDef{"": {Audience: "x", TokenType: TokenType}}, "iam.tokens"},
		{map[string]TokenDef{"a}b": {Audience: "x", TokenType: TokenType}}, "iam.tokens"},
		{map[string]TokenDef{"a\nb": {Audience: "x", TokenType: TokenType}}, "iam.tokens"},
		{map[string]TokenDef{"aws": {TokenType: TokenType}}, "iam.tokens.aws.audience"},
		{map[string]TokenDef{"aws": {Audience: "x", TokenType: "JWT"}}, "iam.tokens.aws.tokenType"},
		{map[string]TokenDef{"aws": {Audience: "x", TokenType: TokenType, Lifetime: 30}}, "iam.tokens.aws.lifetime"},
		{map[string]TokenDef{"aws": {Audience: "x", TokenType: TokenType, Lifetime: 7200}}, "iam.tokens.aws.lifetime"},
	} {
		_, err := i.Check("iam", &IAM{Tokens: c.tokens})
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.HasPrefix(err.Error(), c.field+":") {
			t.Fatalf("Check(%v): %v, want a 400 naming %s", c.tokens, err, c.field)
		}
	}
	for _, bad := range []string{"", "ftp://x", "https://", "https://x/?q=1", "https://u:p@x"} {
		if _, err := CheckIssuer(bad); err == nil {
			t.Fatalf("CheckIssuer(%q) passed", bad)
		}
	}
}

func kidOf(t *testing.T, token string) string {
	t.Helper()
	p, err := jwt.ParseSigned(token, []jose.SignatureAlgorithm{jose.RS256})
	if err != nil {
		t.Fatal(err)
	}
	return p.Headers[0].KeyID
}

// TestOff: without --oidc-issuer, a create registering tokens is a 400
// naming the flag, and nothing mints (not found).
func TestOff(t *testing.T) {
	ctx := context.Background()
	i, err := New(ctx, Config{})
	if err != nil || i.Enabled() {
		t.Fatalf("an issuer without a URL: %v, enabled %v", err, i.Enabled())
	}
	if ts, err := i.Check("iam", &IAM{}); err != nil || ts != nil {
		t.Fatalf("no tokens: %v %v", ts, err)
	}
	_, err = i.Check("iam", &IAM{Tokens: map[string]TokenDef{"aws": {Audience: "x", TokenType: TokenType}}})
	if !errors.Is(err, errdefs.ErrInvalid) || !strings.HasPrefix(err.Error(), "iam.tokens:") || !strings.Contains(err.Error(), "--oidc-issuer") {
		t.Fatalf("Check with tokens: %v", err)
	}
	if _, err := i.MintToken(ctx, "p", "s", "aws"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("MintToken: %v", err)
	}
	if l, err := i.SandboxTokens(ctx, "p", "s"); err != nil || len(l) != 0 {
		t.Fatalf("SandboxTokens: %v %v", l, err)
	}
}
