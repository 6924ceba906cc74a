package api

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/store"
)

// logRoutes serve GET /api/sandboxes/{id}/logs.
type logRoutes struct {
	logs Logs
	log  *slog.Logger
}

// sandboxLogs streams the sandbox's log as Server-Sent Events: the last
// tail lines first, then each new one, until the client goes or the
// sandbox does; with follow=false the stream ends after the tail.
func (s logRoutes) sandboxLogs(w http.ResponseWriter, r *http.Request, p store.Project) error {
	tail := 0
	if t := r.URL.Query().Get("tail"); t != "" {
		n, err := strconv.Atoi(t)
		if err != nil {
			return fmt.Errorf("tail %q: must be a number from 0 to %d: %w", t, sandbox.MaxLogTail, errdefs.ErrInvalid)
		}
		tail = n
	}
	id := r.PathValue("id")
	if _, err := s.logs.Get(p.ID, id); err != nil {
		return err
	}
	if tail < 0 || tail > sandbox.MaxLogTail {
		return fmt.Errorf("tail %d: must be 0 to %d: %w", tail, sandbox.MaxLogTail, errdefs.ErrInvalid)
	}
	var lines []sandbox.LogLine
	follow := r.URL.Query().Get("follow") != "false"
	if !follow {
		var err error
		if lines, err = s.logs.LogTail(r.Context(), p.ID, id, tail); err != nil {
			return err
		}
	}
	rc := http.NewResponseController(w)
	startEventStream(w)
	fmt.Fprint(w, ": lizard sandbox log\n\n")
	rc.Flush()
	send := func(line sandbox.LogLine) error {
		b, err := json.Marshal(line)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			return err
		}
		return rc.Flush()
	}
	if !follow {
		for _, line := range lines {
			if send(line) != nil {
				break
			}
		}
		return nil
	}
	err := s.logs.Logs(r.Context(), p.ID, id, tail, send)
	if err != nil {
		s.log.Debug("log stream ended", "sandbox", id, "err", err)
	}
	return nil
}
