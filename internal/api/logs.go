package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/store"
)

// sandboxLogs streams the sandbox's log as Server-Sent Events: the last
// tail lines first, then each new one, until the client goes or the
// sandbox does.
func (s *server) sandboxLogs(w http.ResponseWriter, r *http.Request, p store.Project) error {
	tail := 0
	if t := r.URL.Query().Get("tail"); t != "" {
		n, err := strconv.Atoi(t)
		if err != nil {
			return fmt.Errorf("tail %q: must be a number from 0 to %d: %w", t, sandbox.MaxLogTail, errdefs.ErrInvalid)
		}
		tail = n
	}
	id := r.PathValue("id")
	if _, err := s.sandboxes.Get(p.ID, id); err != nil {
		return err
	}
	if tail < 0 || tail > sandbox.MaxLogTail {
		return fmt.Errorf("tail %d: must be 0 to %d: %w", tail, sandbox.MaxLogTail, errdefs.ErrInvalid)
	}
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	fmt.Fprint(w, ": lizard sandbox log\n\n")
	rc.Flush()
	err := s.sandboxes.Logs(r.Context(), p.ID, id, tail, func(line sandbox.LogLine) error {
		b, err := json.Marshal(line)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			return err
		}
		return rc.Flush()
	})
	if err != nil {
		s.log.Debug("log stream ended", "sandbox", id, "err", err)
	}
	return nil
}
