package api

import (
	"fmt"
	"net/http"
	"strconv"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/sandbox/schedule"
	"github.com/lizard-build/lizard/internal/store"
)

// scheduleRoutes serve a sandbox's schedules (the Lizard SDK's
// sandbox.schedule() and Sandbox.*Schedule* calls). The routes under a
// sandbox go to its node in a cluster; /api/sandbox-schedules/ are
// answered by any node from the store.
type scheduleRoutes struct {
	schedules Schedules
}

// decodePatch reads a schedule's settings: a JSON object.
func decodePatch(w http.ResponseWriter, r *http.Request) (schedule.Patch, error) {
	b, err := readBody(w, r, maxBody)
	if err != nil {
		return nil, err
	}
	var raw any
	if err := unmarshal(b, &raw); err != nil {
		return nil, err
	}
	if _, ok := raw.(map[string]any); raw != nil && !ok {
		return nil, fmt.Errorf("body: must be a JSON object of the schedule's settings: %w", errdefs.ErrInvalid)
	}
	p := schedule.Patch{}
	return p, unmarshal(b, &p)
}

func (s scheduleRoutes) create(w http.ResponseWriter, r *http.Request, p store.Project) error {
	patch, err := decodePatch(w, r)
	if err != nil {
		return err
	}
	v, err := s.schedules.Create(r.Context(), p.ID, r.PathValue("id"), patch)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, v)
	return nil
}

func (s scheduleRoutes) listOfSandbox(w http.ResponseWriter, r *http.Request, p store.Project) error {
	l, err := s.schedules.OfSandbox(r.Context(), p.ID, r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"schedules": l})
	return nil
}

func (s scheduleRoutes) list(w http.ResponseWriter, r *http.Request, p store.Project) error {
	l, err := s.schedules.List(r.Context(), p.ID, r.URL.Query().Get("sandboxId"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"schedules": l})
	return nil
}

func (s scheduleRoutes) get(w http.ResponseWriter, r *http.Request, p store.Project) error {
	v, err := s.schedules.Get(r.Context(), p.ID, r.PathValue("schid"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, v)
	return nil
}

func (s scheduleRoutes) update(w http.ResponseWriter, r *http.Request, p store.Project) error {
	patch, err := decodePatch(w, r)
	if err != nil {
		return err
	}
	v, err := s.schedules.Update(r.Context(), p.ID, r.PathValue("schid"), patch)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, v)
	return nil
}

func (s scheduleRoutes) remove(w http.ResponseWriter, r *http.Request, p store.Project) error {
	if err := s.schedules.Delete(r.Context(), p.ID, r.PathValue("schid")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s scheduleRoutes) run(w http.ResponseWriter, r *http.Request, p store.Project) error {
	v, err := s.schedules.RunNow(r.Context(), p.ID, r.PathValue("schid"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, v)
	return nil
}

func (s scheduleRoutes) runs(w http.ResponseWriter, r *http.Request, p store.Project) error {
	limit := 0
	if q := r.URL.Query().Get("limit"); q != "" {
		n, err := strconv.Atoi(q)
		if err != nil {
			return fmt.Errorf("limit %q: must be a number from 1 to %d: %w", q, schedule.MaxRuns, errdefs.ErrInvalid)
		}
		limit = n
	}
	l, err := s.schedules.Runs(r.Context(), p.ID, r.PathValue("schid"), limit)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"runs": l})
	return nil
}
