package api

import (
	"context"
	"net/http"
	"time"

	"github.com/lizard-build/lizard/internal/secrets"
	"github.com/lizard-build/lizard/internal/store"
)

// Secrets keeps projects' write-only secrets (*secrets.Service); the E2B
// edge serves the same service at /secrets.
type Secrets interface {
	Create(ctx context.Context, projectID string, req secrets.NewSecret) (secrets.Info, error)
	Get(ctx context.Context, projectID, ref string) (secrets.Info, error)
	Update(ctx context.Context, projectID, ref string, req secrets.SecretUpdate) (secrets.Info, error)
	Delete(ctx context.Context, projectID, ref string) error
	List(ctx context.Context, projectID string, page secrets.Page) ([]secrets.Info, string, error)
}

// NextTokenHeader carries the token of a list's next page (E2B's name; the
// Lizard API's secrets list uses it too).
const NextTokenHeader = "X-Next-Token"

// secretInfo is a secret as the Lizard API shows it: never its value.
type secretInfo struct {
	ID        string            `json:"id"`
	Name      string            `json:"name"`
	Version   int64             `json:"version"`
	Metadata  map[string]string `json:"metadata"`
	CreatedAt string            `json:"createdAt"`
	UpdatedAt string            `json:"updatedAt"`
}

func secretInfoOf(s secrets.Info) secretInfo {
	return secretInfo{ID: s.ID, Name: s.Name, Version: s.Version, Metadata: s.Metadata,
		CreatedAt: s.CreatedAt.UTC().Format(time.RFC3339Nano), UpdatedAt: s.UpdatedAt.UTC().Format(time.RFC3339Nano)}
}

// secretRoutes serve /api/projects/{pid}/secrets. Bodies are read by the
// secrets package's parsers, whose errors never repeat a value.
type secretRoutes struct {
	secrets Secrets
}

func (s secretRoutes) create(w http.ResponseWriter, r *http.Request, p store.Project) error {
	if err := sameProject(p, r.PathValue("pid")); err != nil {
		return err
	}
	body, err := readBody(w, r, maxBody)
	if err != nil {
		return err
	}
	defer clear(body)
	req, err := secrets.ParseNew(body)
	if err != nil {
		return err
	}
	info, err := s.secrets.Create(r.Context(), p.ID, req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, secretInfoOf(info))
	return nil
}

func (s secretRoutes) list(w http.ResponseWriter, r *http.Request, p store.Project) error {
	if err := sameProject(p, r.PathValue("pid")); err != nil {
		return err
	}
	page, err := secrets.ParsePage(r.URL.Query())
	if err != nil {
		return err
	}
	l, next, err := s.secrets.List(r.Context(), p.ID, page)
	if err != nil {
		return err
	}
	out := make([]secretInfo, 0, len(l))
	for _, sec := range l {
		out = append(out, secretInfoOf(sec))
	}
	if next != "" {
		w.Header().Set(NextTokenHeader, next)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s secretRoutes) get(w http.ResponseWriter, r *http.Request, p store.Project) error {
	if err := sameProject(p, r.PathValue("pid")); err != nil {
		return err
	}
	info, err := s.secrets.Get(r.Context(), p.ID, r.PathValue("ref"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, secretInfoOf(info))
	return nil
}

func (s secretRoutes) update(w http.ResponseWriter, r *http.Request, p store.Project) error {
	if err := sameProject(p, r.PathValue("pid")); err != nil {
		return err
	}
	body, err := readBody(w, r, maxBody)
	if err != nil {
		return err
	}
	defer clear(body)
	req, err := secrets.ParseUpdate(body)
	if err != nil {
		return err
	}
	info, err := s.secrets.Update(r.Context(), p.ID, r.PathValue("ref"), req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, secretInfoOf(info))
	return nil
}

func (s secretRoutes) delete(w http.ResponseWriter, r *http.Request, p store.Project) error {
	if err := sameProject(p, r.PathValue("pid")); err != nil {
		return err
	}
	if err := s.secrets.Delete(r.Context(), p.ID, r.PathValue("ref")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
