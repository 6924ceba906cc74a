package api

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/lizard-build/lizard/internal/identity"
	"github.com/lizard-build/lizard/internal/store"
)

// Identity is the workload-identity issuer (*identity.Issuer): the tokens a
// sandbox registers at its create, minted on request, and the issuer's
// public documents. The E2B edge registers tokens through it too.
type Identity interface {
	Enabled() bool
	Path() string
	Discovery() identity.Discovery
	KeySet() identity.JWKS
	Check(field string, iam *identity.IAM) ([]store.SandboxToken, error)
	Register(ctx context.Context, projectID, sandboxID string, tokens []store.SandboxToken) error
	SandboxTokens(ctx context.Context, projectID, sandboxID string) ([]identity.Token, error)
	Mint(ctx context.Context, projectID, sandboxID, name string) (string, time.Time, error)
}

// RegisterTokens records the tokens a create checked (Identity.Check) for
// the sandbox it made; when that fails the sandbox is killed, so that no
// sandbox runs without the tokens its create asked for. Both APIs' creates
// call it.
func RegisterTokens(ctx context.Context, ids Identity, kill func(ctx context.Context, projectID, id string) error, projectID, sandboxID string, tokens []store.SandboxToken) error {
	if len(tokens) == 0 {
		return nil
	}
	err := ids.Register(ctx, projectID, sandboxID, tokens)
	if err != nil {
		if kerr := kill(context.WithoutCancel(ctx), projectID, sandboxID); kerr != nil {
			err = fmt.Errorf("%w (and the sandbox made without them was not killed: %v)", err, kerr)
		}
	}
	return err
}

// issuerRoutes serve the issuer's discovery document and key set,
// unauthenticated, under the issuer URL's path: relying parties (cloud
// providers) fetch them.
type issuerRoutes struct {
	ids Identity
}

func (s issuerRoutes) discovery(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "public, max-age=300")
	writeJSON(w, http.StatusOK, s.ids.Discovery())
}

func (s issuerRoutes) keySet(w http.ResponseWriter, r *http.Request) {
	// Keys are published an hour before they sign: five minutes of cache
	// never hides a key that signs.
	w.Header().Set("Cache-Control", "public, max-age=300")
	writeJSON(w, http.StatusOK, s.ids.KeySet())
}

// tokenRoutes serve a sandbox's registered workload tokens.
type tokenRoutes struct {
	ids Identity
}

// list is GET /api/sandboxes/{id}/iam/tokens: the sandbox's registered
// tokens (names, audiences, types, lifetimes).
func (s tokenRoutes) list(w http.ResponseWriter, r *http.Request, p store.Project) error {
	ts, err := s.ids.SandboxTokens(r.Context(), p.ID, r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, ts)
	return nil
}

// mint is POST /api/sandboxes/{id}/iam/tokens/{name}: a fresh token, as
// the egress proxy puts it in a request. The project's key holder can have
// one anyway (a transform rule to a host of theirs), so this grants nothing
// more.
func (s tokenRoutes) mint(w http.ResponseWriter, r *http.Request, p store.Project) error {
	if err := decode(w, r, maxBody, &struct{}{}); err != nil {
		return err
	}
	tok, exp, err := s.ids.Mint(r.Context(), p.ID, r.PathValue("id"), r.PathValue("name"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, struct {
		Token     string `json:"token"`
		ExpiresAt string `json:"expiresAt"`
	}{tok, exp.UTC().Format(time.RFC3339)})
	return nil
}

// TokenNames are the names of a create's workload tokens, which its
// network rules may name (${e2b.identity.tokens.NAME}).
func TokenNames(tokens []store.SandboxToken) []string {
	names := make([]string, len(tokens))
	for i, t := range tokens {
		names[i] = t.Name
	}
	return names
}
