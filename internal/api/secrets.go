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

// SecretRoutes serve a secrets API over Secrets: the Lizard API's
// /api/projects/{pid}/secrets and E2B's /secrets (internal/e2b) are these
// handlers with two shapes of a secret. Shape turns a secret into what the
// API answers (never its value); RefParam is the path value naming a
// secret (its id or name). Bodies are read by the secrets package's
// parsers, whose errors never repeat a value.
type SecretRoutes[T any] struct {
	Secrets  Secrets
	Shape    func(secrets.Info) T
	RefParam string
}

// Create makes a secret: 201 and the secret.
func (s SecretRoutes[T]) Create(w http.ResponseWriter, r *http.Request, p store.Project) error {
	req, err := parseBody(w, r, secrets.ParseNew)
	if err != nil {
		return err
	}
	return s.answer(w, http.StatusCreated)(s.Secrets.Create(r.Context(), p.ID, req))
}

// List answers a page of the project's secrets, with the next page's token
// in X-Next-Token.
func (s SecretRoutes[T]) List(w http.ResponseWriter, r *http.Request, p store.Project) error {
	page, err := secrets.ParsePage(r.URL.Query())
	if err != nil {
		return err
	}
	l, next, err := s.Secrets.List(r.Context(), p.ID, page)
	if err != nil {
		return err
	}
	out := make([]T, 0, len(l))
	for _, sec := range l {
		out = append(out, s.Shape(sec))
	}
	if next != "" {
		w.Header().Set(NextTokenHeader, next)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// Get answers a secret by id or name.
func (s SecretRoutes[T]) Get(w http.ResponseWriter, r *http.Request, p store.Project) error {
	return s.answer(w, http.StatusOK)(s.Secrets.Get(r.Context(), p.ID, r.PathValue(s.RefParam)))
}

// Update gives a secret a new value: 200 and the secret at its next version.
func (s SecretRoutes[T]) Update(w http.ResponseWriter, r *http.Request, p store.Project) error {
	req, err := parseBody(w, r, secrets.ParseUpdate)
	if err != nil {
		return err
	}
	return s.answer(w, http.StatusOK)(s.Secrets.Update(r.Context(), p.ID, r.PathValue(s.RefParam), req))
}

// Delete removes a secret: 204.
func (s SecretRoutes[T]) Delete(w http.ResponseWriter, r *http.Request, p store.Project) error {
	if err := s.Secrets.Delete(r.Context(), p.ID, r.PathValue(s.RefParam)); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// answer writes a secret with status, or returns the error that came
// instead.
func (s SecretRoutes[T]) answer(w http.ResponseWriter, status int) func(secrets.Info, error) error {
	return func(info secrets.Info, err error) error {
		if err != nil {
			return err
		}
		writeJSON(w, status, s.Shape(info))
		return nil
	}
}

// parseBody reads a body holding a secret value with parse, and wipes the
// bytes read once parsed.
func parseBody[T any](w http.ResponseWriter, r *http.Request, parse func([]byte) (T, error)) (T, error) {
	body, err := readBody(w, r, maxBody)
	if err != nil {
		var zero T
		return zero, err
	}
	defer clear(body)
	return parse(body)
}

// secretInfo is a secret as the Lizard API shows it.
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

// inProject checks that a route's {pid} is the key's project before h.
func inProject(h func(http.ResponseWriter, *http.Request, store.Project) error) func(http.ResponseWriter, *http.Request, store.Project) error {
	return func(w http.ResponseWriter, r *http.Request, p store.Project) error {
		if err := sameProject(p, r.PathValue("pid")); err != nil {
			return err
		}
		return h(w, r, p)
	}
}
