package api

import (
	"fmt"
	"net/http"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
)

// watchFiles starts a watcher in the sandbox's agent; events queue there
// (bounded) until drained, and survive a pause and resume with it.
func (s *server) watchFiles(w http.ResponseWriter, r *http.Request, p store.Project) error {
	var req struct {
		Path      string `json:"path"`
		Recursive bool   `json:"recursive"`
		User      string `json:"user"`
	}
	if err := decode(w, r, maxBody, &req); err != nil {
		return err
	}
	if err := requirePath("path", req.Path); err != nil {
		return err
	}
	ag, err := s.agentFor(r, p)
	if err != nil {
		return err
	}
	id, err := ag.Watch(r.Context(), req.Path, req.Recursive, req.User)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]string{"watcherId": id})
	return nil
}

// watcher reads the required watcherId and finds the sandbox's agent.
func (s *server) watcher(r *http.Request, p store.Project) (*agent.Client, string, error) {
	id := r.URL.Query().Get("watcherId")
	if id == "" {
		return nil, "", fmt.Errorf("watcherId: required: %w", errdefs.ErrInvalid)
	}
	ag, err := s.agentFor(r, p)
	return ag, id, err
}

// watchEvents drains the watcher's queue.
func (s *server) watchEvents(w http.ResponseWriter, r *http.Request, p store.Project) error {
	ag, id, err := s.watcher(r, p)
	if err != nil {
		return err
	}
	evs, err := ag.WatchEvents(r.Context(), id)
	if err != nil {
		return err
	}
	if evs == nil {
		evs = []agent.WatchEvent{}
	}
	writeJSON(w, http.StatusOK, evs)
	return nil
}

func (s *server) unwatchFiles(w http.ResponseWriter, r *http.Request, p store.Project) error {
	ag, id, err := s.watcher(r, p)
	if err != nil {
		return err
	}
	if err := ag.Unwatch(r.Context(), id); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
