package identity

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
)

// IAM is a create's iam field, as E2B's API takes it: named token
// definitions.
type IAM struct {
	Tokens map[string]TokenDef `json:"tokens"`
}

// TokenDef is one token definition: E2B's audience and tokenType, and
// lizard's lifetime in seconds (0: the server's --oidc-token-lifetime).
type TokenDef struct {
	Audience  string `json:"audience"`
	TokenType string `json:"tokenType"`
	Lifetime  int    `json:"lifetime,omitempty"`
}

// Token is a registered token as the API lists it.
type Token struct {
	Name      string `json:"name"`
	Audience  string `json:"audience"`
	TokenType string `json:"tokenType"`
	Lifetime  int    `json:"lifetime"` // seconds
}

// Limits of a definition's fields.
const (
	maxNameBytes     = 128
	maxAudienceBytes = 1024
)

// Check validates a create's iam (field names it: "iam") and returns the
// tokens to register (none for an absent or empty map). Every refusal is a
// 400 naming the field.
func (i *Issuer) Check(field string, iam *IAM) ([]store.SandboxToken, error) {
	if iam == nil || len(iam.Tokens) == 0 {
		return nil, nil
	}
	if !i.Enabled() {
		return nil, fmt.Errorf("%s.tokens: %w", field, errOff())
	}
	if len(iam.Tokens) > MaxTokens {
		return nil, invalid(field+".tokens", "%d tokens, at most %d", len(iam.Tokens), MaxTokens)
	}
	var out []store.SandboxToken
	for name, def := range iam.Tokens {
		f := field + ".tokens." + name
		if err := CheckName(field+".tokens", name); err != nil {
			return nil, err
		}
		if def.Audience == "" || len(def.Audience) > maxAudienceBytes {
			return nil, invalid(f+".audience", "required, at most %d bytes", maxAudienceBytes)
		}
		if def.TokenType != TokenType {
			return nil, invalid(f+".tokenType", "only %q is supported", TokenType)
		}
		life := i.cfg.Lifetime
		if def.Lifetime != 0 {
			life = time.Duration(def.Lifetime) * time.Second
			if life < MinLifetime || life > MaxLifetime {
				return nil, invalid(f+".lifetime", "%d seconds: want %d to %d", def.Lifetime, int(MinLifetime/time.Second), int(MaxLifetime/time.Second))
			}
		}
		out = append(out, store.SandboxToken{Name: name, Audience: def.Audience, TokenType: def.TokenType, Lifetime: life})
	}
	return out, nil
}

// CheckName refuses a token name that cannot be in a
// ${e2b.identity.tokens.NAME} placeholder: empty, too long, a brace or a
// control character (as E2B's SDK checks it).
func CheckName(field, name string) error {
	if name == "" || len(name) > maxNameBytes {
		return invalid(field, "a token name is 1 to %d bytes", maxNameBytes)
	}
	if strings.ContainsFunc(name, func(r rune) bool { return r == '{' || r == '}' || unicode.IsControl(r) }) {
		return invalid(field, "token name %q: no '{', '}' or control characters (it goes into ${e2b.identity.tokens.NAME})", name)
	}
	return nil
}

// Register records a project's sandbox's tokens (what Check returned). They
// go with the sandbox's record.
func (i *Issuer) Register(ctx context.Context, projectID, sandboxID string, tokens []store.SandboxToken) error {
	if len(tokens) == 0 {
		return nil
	}
	return i.cfg.Store.PutSandboxTokens(ctx, projectID, sandboxID, tokens)
}

// SandboxTokens lists a project's sandbox's registered tokens.
func (i *Issuer) SandboxTokens(ctx context.Context, projectID, sandboxID string) ([]Token, error) {
	if !i.Enabled() {
		return []Token{}, nil
	}
	ts, err := i.cfg.Store.SandboxTokens(ctx, projectID, sandboxID)
	if err != nil {
		return nil, err
	}
	out := make([]Token, 0, len(ts))
	for _, t := range ts {
		out = append(out, Token{Name: t.Name, Audience: t.Audience, TokenType: t.TokenType, Lifetime: int(t.Lifetime / time.Second)})
	}
	return out, nil
}

// TokenExists reports whether a project's sandbox registered a token of
// that name: what a network update's placeholders are checked against. Its
// error is the store's, never "not found".
func (i *Issuer) TokenExists(ctx context.Context, projectID, sandboxID, name string) (bool, error) {
	_, err := i.token(ctx, projectID, sandboxID, name)
	if errors.Is(err, errdefs.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

func (i *Issuer) token(ctx context.Context, projectID, sandboxID, name string) (store.SandboxToken, error) {
	if !i.Enabled() {
		return store.SandboxToken{}, fmt.Errorf("workload token %q: %w", name, errOff(errdefs.ErrNotFound))
	}
	ts, err := i.cfg.Store.SandboxTokens(ctx, projectID, sandboxID)
	if err != nil {
		return store.SandboxToken{}, err
	}
	for _, t := range ts {
		if t.Name == name {
			return t, nil
		}
	}
	return store.SandboxToken{}, errdefs.WithCode("token_not_found",
		fmt.Errorf("workload token %q: sandbox %q registered none of that name: %w", name, sandboxID, errdefs.ErrNotFound))
}

// Claims are a workload token's claims.
type Claims struct {
	Issuer    string `json:"iss"`
	Subject   string `json:"sub"`
	Audience  string `json:"aud"`
	IssuedAt  int64  `json:"iat"`
	NotBefore int64  `json:"nbf"`
	Expiry    int64  `json:"exp"`
	ID        string `json:"jti"`
	Project   string `json:"project_id"`
	Sandbox   string `json:"sandbox_id"`
	TokenName string `json:"token_name"`
}

// Subject is the sub of a sandbox's tokens: a SPIFFE ID in the issuer's
// trust domain (its host) naming the project and the sandbox, which a
// cloud's trust policy matches (…/project/<id>/sandbox/*).
func (i *Issuer) Subject(projectID, sandboxID string) string {
	return "spiffe://" + i.trustDomain + "/project/" + projectID + "/sandbox/" + sandboxID
}

// Mint signs a fresh token of a project's sandbox's registered token name
// and returns it with its expiry. A name the sandbox did not register (or a
// sandbox that is gone, or another project's) is errdefs.ErrNotFound.
func (i *Issuer) Mint(ctx context.Context, projectID, sandboxID, name string) (string, time.Time, error) {
	t, err := i.token(ctx, projectID, sandboxID, name)
	if err != nil {
		return "", time.Time{}, err
	}
	now := i.cfg.Now()
	k, err := i.current(now)
	if err != nil {
		return "", time.Time{}, err
	}
	exp := now.Add(t.Lifetime)
	c := Claims{Issuer: i.issuer, Subject: i.Subject(projectID, sandboxID), Audience: t.Audience, IssuedAt: now.Unix(), NotBefore: now.Unix(),
		Expiry: exp.Unix(), ID: store.NewID("", 24), Project: projectID, Sandbox: sandboxID, TokenName: name}
	tok, err := sign(k, c)
	if err != nil {
		return "", time.Time{}, err
	}
	return tok, time.Unix(c.Expiry, 0).UTC(), nil
}

// MintToken is Mint without the expiry: what the egress proxy calls for a
// ${e2b.identity.tokens.NAME} placeholder.
func (i *Issuer) MintToken(ctx context.Context, projectID, sandboxID, name string) (string, error) {
	tok, _, err := i.Mint(ctx, projectID, sandboxID, name)
	return tok, err
}

func invalid(field, format string, args ...any) error {
	return fmt.Errorf("%s: %s: %w", field, fmt.Sprintf(format, args...), errdefs.ErrInvalid)
}
