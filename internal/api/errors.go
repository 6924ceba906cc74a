package api

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/tmplqueue"
)

// errorBody is every error answer: the SDKs read error, code and message.
type errorBody struct {
	Error   string `json:"error"`
	Code    string `json:"code"`
	Message string `json:"message"`
	// A refusal for a limit (quota, capacity) tells which and how much:
	// the SDKs' LimitExceededError reads these.
	Unit        string   `json:"unit,omitempty"`
	Limit       *float64 `json:"limit,omitempty"`
	Running     *float64 `json:"running,omitempty"`
	Needed      *float64 `json:"needed,omitempty"`
	RetryAfterS int      `json:"retryAfterS,omitempty"`
}

// classes maps each error class to its status and default code (errdefs
// decides which class an error of two is).
var classes = map[error]struct {
	status int
	code   string
}{
	errdefs.ErrInvalid:         {http.StatusBadRequest, "invalid_request"},
	errdefs.ErrUnauthenticated: {http.StatusUnauthorized, "unauthenticated"},
	errdefs.ErrPermission:      {http.StatusForbidden, "permission_denied"},
	errdefs.ErrNotFound:        {http.StatusNotFound, "not_found"},
	errdefs.ErrConflict:        {http.StatusConflict, "conflict"},
	errdefs.ErrTooLarge:        {http.StatusRequestEntityTooLarge, "too_large"},
	errdefs.ErrQuota:           {http.StatusTooManyRequests, "quota_exceeded"},
	errdefs.ErrLimit:           {http.StatusTooManyRequests, "limit_exceeded"},
	errdefs.ErrCapacity:        {http.StatusServiceUnavailable, "capacity"},
	errdefs.ErrNoSpace:         {http.StatusInsufficientStorage, "insufficient_storage"},
	errdefs.ErrTimeout:         {http.StatusGatewayTimeout, "timeout"},
	errdefs.ErrUnavailable:     {http.StatusServiceUnavailable, "unavailable"},
}

// retryAfterCapacity is the Retry-After (seconds) of a 503 capacity.
const retryAfterCapacity = 5

// statusOf is the one place where an error becomes an HTTP status, a code
// and the message the client reads. That message is the error's text with
// the causes marked errdefs.Detailed (a command's output, host paths) left
// out; writeError logs the whole. Errors of no class are internal: the
// client gets a generic message.
func statusOf(err error) (status int, code, msg string) {
	c, ok := classes[errdefs.Class(err)]
	if !ok {
		return http.StatusInternalServerError, "internal", "internal error"
	}
	code = c.code
	if cc := errdefs.Code(err); cc != "" {
		code = cc
	}
	return c.status, code, errdefs.ClientMessage(err)
}

// StatusOf is statusOf for the E2B edge (internal/e2b), which answers in
// E2B's error shape but maps errors exactly as this API does.
func StatusOf(err error) (status int, code, msg string) { return statusOf(err) }

// WriteJSON answers v as JSON with status.
func WriteJSON(w http.ResponseWriter, status int, v any) { writeJSON(w, status, v) }

// writeError answers with err mapped by statusOf.
func writeError(w http.ResponseWriter, r *http.Request, log *slog.Logger, err error) {
	status, code, msg := statusOf(err)
	retry := SetRetryAfter(w, err)
	if status >= 500 && code != "recovering" && code != "unresponsive" {
		log.Error("request failed", "method", r.Method, "path", r.URL.Path, "status", status, "err", err)
	} else {
		log.Debug("request refused", "method", r.Method, "path", r.URL.Path, "status", status, "err", err)
	}
	MarkMissing(w, err)
	body := errorBody{Error: msg, Code: code, Message: msg}
	if ex := (*errdefs.Exceeded)(nil); errors.As(err, &ex) {
		body.Unit, body.Limit, body.Running, body.Needed = ex.Unit, &ex.Limit, &ex.InUse, &ex.Needed
	}
	if errors.Is(err, errdefs.ErrCapacity) {
		body.RetryAfterS = retry
	}
	writeJSON(w, status, body)
}

// retryAfterUnresponsive is the Retry-After (seconds) of a 503 for an
// unresponsive sandbox (probed again with backoff).
const retryAfterUnresponsive = 5

// SetRetryAfter sets Retry-After on w for the errors that pass with time
// and returns its seconds (0: none set): a sandbox being reattached after a
// restart, an unresponsive one, a node at capacity, a template being built. Both APIs call it.
func SetRetryAfter(w http.ResponseWriter, err error) int {
	secs := 0
	switch {
	case errdefs.Code(err) == "recovering":
		// The sandbox is there; the restarted server is reattaching it.
		secs = 1
	case errdefs.Code(err) == "unresponsive":
		secs = retryAfterUnresponsive
	case errdefs.Code(err) == tmplqueue.ErrBuilding:
		secs = tmplqueue.RetryAfter
	case errors.Is(err, errdefs.ErrCapacity):
		// Capacity comes back as sandboxes end or pause: ask to retry soon.
		secs = retryAfterCapacity
	}
	if secs > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(secs))
	}
	return secs
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}
