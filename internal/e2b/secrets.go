package e2b

import (
	"net/http"
	"time"

	"github.com/lizard-build/lizard/internal/api"
	"github.com/lizard-build/lizard/internal/secrets"
	"github.com/lizard-build/lizard/internal/store"
)

// secret is E2B's Secret: metadata only, never the value.
type secret struct {
	SecretID       string            `json:"secretID"`
	Name           string            `json:"name"`
	CurrentVersion int64             `json:"currentVersion"`
	Metadata       map[string]string `json:"metadata"`
	CreatedAt      string            `json:"createdAt"`
	UpdatedAt      string            `json:"updatedAt"`
}

func secretOf(s secrets.Info) secret {
	return secret{SecretID: s.ID, Name: s.Name, CurrentVersion: s.Version, Metadata: s.Metadata,
		CreatedAt: s.CreatedAt.UTC().Format(time.RFC3339Nano), UpdatedAt: s.UpdatedAt.UTC().Format(time.RFC3339Nano)}
}

// secretRoutes serve E2B's /secrets (the SDK's Secret): create, list in
// pages (limit, nextToken, X-Next-Token), get, update (POST) and delete by
// id or name, values write-only.
type secretRoutes struct {
	secrets api.Secrets
}

func (s secretRoutes) create(w http.ResponseWriter, r *http.Request, p store.Project) error {
	body, err := api.ReadBody(w, r, maxBody)
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
	api.WriteJSON(w, http.StatusCreated, secretOf(info))
	return nil
}

func (s secretRoutes) list(w http.ResponseWriter, r *http.Request, p store.Project) error {
	page, err := secrets.ParsePage(r.URL.Query())
	if err != nil {
		return err
	}
	l, next, err := s.secrets.List(r.Context(), p.ID, page)
	if err != nil {
		return err
	}
	out := make([]secret, 0, len(l))
	for _, sec := range l {
		out = append(out, secretOf(sec))
	}
	if next != "" {
		w.Header().Set(api.NextTokenHeader, next)
	}
	api.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (s secretRoutes) get(w http.ResponseWriter, r *http.Request, p store.Project) error {
	info, err := s.secrets.Get(r.Context(), p.ID, r.PathValue("secretID"))
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, secretOf(info))
	return nil
}

func (s secretRoutes) update(w http.ResponseWriter, r *http.Request, p store.Project) error {
	body, err := api.ReadBody(w, r, maxBody)
	if err != nil {
		return err
	}
	defer clear(body)
	req, err := secrets.ParseUpdate(body)
	if err != nil {
		return err
	}
	info, err := s.secrets.Update(r.Context(), p.ID, r.PathValue("secretID"), req)
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, secretOf(info))
	return nil
}

func (s secretRoutes) delete(w http.ResponseWriter, r *http.Request, p store.Project) error {
	if err := s.secrets.Delete(r.Context(), p.ID, r.PathValue("secretID")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
