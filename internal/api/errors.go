package api

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// errorBody is every error answer: the SDKs read error, code and message.
type errorBody struct {
	Error   string `json:"error"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

// classes maps each error class to its status and default code, in the
// order they are tried.
var classes = []struct {
	err    error
	status int
	code   string
}{
	{errdefs.ErrInvalid, http.StatusBadRequest, "invalid_request"},
	{errdefs.ErrUnauthenticated, http.StatusUnauthorized, "unauthenticated"},
	{errdefs.ErrPermission, http.StatusForbidden, "permission_denied"},
	{errdefs.ErrNotFound, http.StatusNotFound, "not_found"},
	{errdefs.ErrConflict, http.StatusConflict, "conflict"},
	{errdefs.ErrTooLarge, http.StatusRequestEntityTooLarge, "too_large"},
	{errdefs.ErrLimit, http.StatusTooManyRequests, "limit_exceeded"},
	{errdefs.ErrTimeout, http.StatusGatewayTimeout, "timeout"},
	{errdefs.ErrUnavailable, http.StatusServiceUnavailable, "unavailable"},
}

// statusOf is the one place where an error becomes an HTTP status and code.
// Errors of no class are internal: the client gets a generic message and
// the cause goes to the log.
func statusOf(err error) (status int, code, msg string) {
	for _, c := range classes {
		if errors.Is(err, c.err) {
			code = c.code
			if cc := errdefs.Code(err); cc != "" {
				code = cc
			}
			return c.status, code, err.Error()
		}
	}
	return http.StatusInternalServerError, "internal", "internal error"
}

// StatusOf is statusOf for the E2B edge (internal/e2b), which answers in
// E2B's error shape but maps errors exactly as this API does.
func StatusOf(err error) (status int, code, msg string) { return statusOf(err) }

// WriteJSON answers v as JSON with status.
func WriteJSON(w http.ResponseWriter, status int, v any) { writeJSON(w, status, v) }

// writeError answers with err mapped by statusOf.
func writeError(w http.ResponseWriter, r *http.Request, log *slog.Logger, err error) {
	status, code, msg := statusOf(err)
	if status >= 500 {
		log.Error("request failed", "method", r.Method, "path", r.URL.Path, "status", status, "err", err)
	} else {
		log.Debug("request refused", "method", r.Method, "path", r.URL.Path, "status", status, "err", err)
	}
	writeJSON(w, status, errorBody{Error: msg, Code: code, Message: msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}
