package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// ReadyCheck is one thing GET /readyz needs usable: the store, the
// runtime, the network, in a cluster the lease. Check must return within
// its context's deadline.
type ReadyCheck struct {
	Name  string
	Check func(context.Context) error
}

// readyTimeout bounds all checks of one /readyz.
const readyTimeout = 3 * time.Second

// healthz answers while the process serves. Like /readyz it is
// unauthenticated and says nothing more than its status.
func (s *server) healthz(w http.ResponseWriter, r *http.Request) {
	plain(w, http.StatusOK, "ok")
}

// readyz runs every check; any failure is a 503 whose reasons go to the
// log only.
func (s *server) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
	defer cancel()
	var errs []error
	for _, c := range s.ready {
		if err := c.Check(ctx); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", c.Name, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		s.log.Warn("not ready", "err", err)
		plain(w, http.StatusServiceUnavailable, "not ready")
		return
	}
	plain(w, http.StatusOK, "ok")
}

func plain(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	io.WriteString(w, body+"\n")
}
