package api

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
)

// KeyStore manages API keys in the database.
type KeyStore interface {
	Keys(ctx context.Context, projectID string) ([]store.Key, error)
	NewKey(ctx context.Context, projectID, secret string) (store.Key, string, error)
	RevokeKey(ctx context.Context, id string) error
}

// reloader is a Keys that can take a change of the store into account at
// once (apikey.Set): a revoked key is refused from the next request on.
type reloader interface {
	Reload(ctx context.Context) error
}

// keyInfo is an API key as /api/keys lists it; Key (the secret) only in
// the answer to its creation.
type keyInfo struct {
	ID         string  `json:"id"`
	Prefix     string  `json:"prefix"`
	CreatedAt  string  `json:"createdAt"`
	LastUsedAt *string `json:"lastUsedAt"`
	RevokedAt  *string `json:"revokedAt"`
	Current    bool    `json:"current"` // the key this request came with
	Key        string  `json:"key,omitempty"`
}

func keyInfoOf(k store.Key, current string) keyInfo {
	ts := func(t *time.Time) *string {
		if t == nil {
			return nil
		}
		s := t.UTC().Format(time.RFC3339)
		return &s
	}
	return keyInfo{ID: k.ID, Prefix: k.Prefix, CreatedAt: k.CreatedAt.UTC().Format(time.RFC3339),
		LastUsedAt: ts(k.LastUsed), RevokedAt: ts(k.RevokedAt), Current: k.ID == current}
}

// keyRoutes serve /api/keys.
type keyRoutes struct {
	keyStore KeyStore
	keys     Keys
	log      *slog.Logger
}

// listKeys is GET /api/keys: the keys of the caller's project, revoked
// ones included, oldest first. Secrets are never listed.
func (s keyRoutes) listKeys(w http.ResponseWriter, r *http.Request, p store.Project) error {
	keys, err := s.keyStore.Keys(r.Context(), p.ID)
	if err != nil {
		return err
	}
	out := make([]keyInfo, 0, len(keys))
	for _, k := range keys {
		out = append(out, keyInfoOf(k, requestKeyID(r.Context())))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// createKey is POST /api/keys: a new key of the caller's project. The
// answer is the only time its secret is shown.
func (s keyRoutes) createKey(w http.ResponseWriter, r *http.Request, p store.Project) error {
	if err := decode(w, r, maxBody, &struct{}{}); err != nil {
		return err
	}
	k, secret, err := s.keyStore.NewKey(r.Context(), p.ID, "")
	if err != nil {
		return err
	}
	s.reloadKeys(r.Context())
	info := keyInfoOf(k, requestKeyID(r.Context()))
	info.Key = secret
	writeJSON(w, http.StatusCreated, info)
	return nil
}

// revokeKey is DELETE /api/keys/{kid}: the key is refused from the next
// request on (sessions signed in with it end). Another project's key is
// not found; revoking a revoked key is a no-op.
func (s keyRoutes) revokeKey(w http.ResponseWriter, r *http.Request, p store.Project) error {
	id := r.PathValue("kid")
	keys, err := s.keyStore.Keys(r.Context(), p.ID)
	if err != nil {
		return err
	}
	if !slices.ContainsFunc(keys, func(k store.Key) bool { return k.ID == id }) {
		return errdefs.WithCode("key_not_found", fmt.Errorf("API key %q: %w", id, errdefs.ErrNotFound))
	}
	if err := s.keyStore.RevokeKey(r.Context(), id); err != nil {
		return err
	}
	s.reloadKeys(r.Context())
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// reloadKeys makes the key view follow a change now; if that fails the
// next poll does it.
func (s keyRoutes) reloadKeys(ctx context.Context) {
	if rl, ok := s.keys.(reloader); ok {
		if err := rl.Reload(ctx); err != nil {
			s.log.Warn("reload API keys", "err", err)
		}
	}
}
