package api

import (
	"context"
	"fmt"
	"net/http"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/sandbox/tplpool"
	"github.com/lizard-build/lizard/internal/store"
)

// TemplatePools is what the API needs of templates' warm pools
// (tplpool.Manager).
type TemplatePools interface {
	Set(ctx context.Context, projectID, tplName, sandboxSize string, size int) (tplpool.Pool, error)
	List(ctx context.Context, projectID string) ([]tplpool.Pool, error)
}

// templatePoolRoutes serve GET /api/template-pools and
// PUT /api/template-pools/{name}: the project's warm pools of templates.
// Any node answers from the store; ready counts the answering node's
// copies.
type templatePoolRoutes struct {
	pools TemplatePools
}

// poolRequest is the body of PUT /api/template-pools/{name}.
type poolRequest struct {
	// Size is how many warm copies each node keeps; 0 removes the pool.
	Size *int `json:"size"`
	// SandboxSize is the sandboxes' size ("" for the default).
	SandboxSize string `json:"sandboxSize"`
}

func (s templatePoolRoutes) available() error {
	if s.pools == nil {
		return errdefs.WithCode("feature_unavailable", fmt.Errorf("template pools: this server keeps none: %w", errdefs.ErrUnavailable))
	}
	return nil
}

func (s templatePoolRoutes) set(w http.ResponseWriter, r *http.Request, p store.Project) error {
	if err := s.available(); err != nil {
		return err
	}
	var req poolRequest
	if err := decode(w, r, maxBody, &req); err != nil {
		return err
	}
	if req.Size == nil {
		return fmt.Errorf("size: required (warm sandboxes per node, 0 removes the pool): %w", errdefs.ErrInvalid)
	}
	pool, err := s.pools.Set(r.Context(), p.ID, r.PathValue("name"), req.SandboxSize, *req.Size)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, pool)
	return nil
}

func (s templatePoolRoutes) list(w http.ResponseWriter, r *http.Request, p store.Project) error {
	if err := s.available(); err != nil {
		return err
	}
	pools, err := s.pools.List(r.Context(), p.ID)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"pools": pools})
	return nil
}
