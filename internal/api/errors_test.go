package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// rewording hides the text of the error it wraps.
type rewording struct{ err error }

func (e rewording) Error() string { return "something went wrong" }
func (e rewording) Unwrap() error { return e.err }

// TestErrorMapping is the whole error → (status, code, message) mapping of
// both APIs (statusOf), every class bare and wrapped, and what writeError
// answers and logs: the client's message never carries a Detailed cause
// (runsc output, host paths), the log line always does.
func TestErrorMapping(t *testing.T) {
	const hostPath = "/var/lib/lizard/sandboxes/sbx1/bundle"
	runsc := errdefs.WithCause(errdefs.ErrUnavailable, "runsc failed (its output is in the server log)",
		errors.New("exit status 1: open "+hostPath+": operation not permitted"))
	classes := []struct {
		class  error
		status int
		code   string
		retry  string
	}{
		{errdefs.ErrInvalid, 400, "invalid_request", ""},
		{errdefs.ErrUnauthenticated, 401, "unauthenticated", ""},
		{errdefs.ErrPermission, 403, "permission_denied", ""},
		{errdefs.ErrNotFound, 404, "not_found", ""},
		{errdefs.ErrConflict, 409, "conflict", ""},
		{errdefs.ErrTooLarge, 413, "too_large", ""},
		{errdefs.ErrQuota, 429, "quota_exceeded", ""},
		{errdefs.ErrLimit, 429, "limit_exceeded", ""},
		{errdefs.ErrCapacity, 503, "capacity", "5"}, // come back soon
		{errdefs.ErrNoSpace, 507, "insufficient_storage", ""},
		{errdefs.ErrTimeout, 504, "timeout", ""},
		{errdefs.ErrUnavailable, 503, "unavailable", ""},
	}
	type row struct {
		name   string
		err    error
		status int
		code   string
		msg    string
		retry  string // Retry-After
		log    string // the log line must say this
	}
	var rows []row
	for _, c := range classes {
		rows = append(rows,
			row{"bare " + c.code, c.class, c.status, c.code, c.class.Error(), c.retry, ""},
			row{"wrapped " + c.code, fmt.Errorf("sandbox %q: %w", "sbx1", c.class), c.status, c.code, `sandbox "sbx1": ` + c.class.Error(), c.retry, ""})
	}
	rows = append(rows,
		row{"exceeded", &errdefs.Exceeded{Unit: "vcpu", Limit: 8, InUse: 6, Needed: 4, Err: fmt.Errorf("project would use 10 vcpu of 8: %w", errdefs.ErrQuota)},
			429, "quota_exceeded", "project would use 10 vcpu of 8: quota exceeded", "", ""},
		row{"code override", errdefs.WithCode("template_not_found", fmt.Errorf("template %q: %w", "x", errdefs.ErrNotFound)),
			404, "template_not_found", `template "x": not found`, "", ""},
		row{"recovering", errdefs.WithCode("recovering", fmt.Errorf("sandbox %q is being reattached: %w", "sbx1", errdefs.ErrUnavailable)),
			503, "recovering", `sandbox "sbx1" is being reattached: unavailable`, "1", ""},
		row{"quota before limit", fmt.Errorf("%w: %w", errdefs.ErrLimit, errdefs.ErrQuota), 429, "quota_exceeded", "limit exceeded: quota exceeded", "", ""},
		row{"capacity before unavailable", fmt.Errorf("%w: %w", errdefs.ErrUnavailable, errdefs.ErrCapacity), 503, "capacity", "unavailable: node at capacity", "5", ""},
		row{"no class", fmt.Errorf("open %s: %w", hostPath, errors.New("input/output error")), 500, "internal", "internal error", "", hostPath},
		row{"gvisor: runsc output and a host path", fmt.Errorf("sandbox %q: runsc create: %w", "sbx1", runsc),
			503, "unavailable", `sandbox "sbx1": runsc create: runsc failed (its output is in the server log)`, "", hostPath},
		row{"gvisor, coded", errdefs.WithCode("unresponsive", fmt.Errorf("start: %w", runsc)),
			503, "unresponsive", "start: runsc failed (its output is in the server log)", "5", ""},
		row{"host path in a conflict", errdefs.WithCause(errdefs.ErrConflict, "the snapshot's directory exists", errors.New("snapshot directory "+hostPath)),
			409, "conflict", "the snapshot's directory exists", "", ""},
		row{"reworded Detailed", rewording{runsc}, 503, "unavailable", "runsc failed (its output is in the server log)", "", ""},
		row{"joined", errors.Join(runsc, errors.New("and a second failure")), 503, "unavailable", "runsc failed (its output is in the server log)\nand a second failure", "", hostPath},
	)
	for _, tt := range rows {
		t.Run(tt.name, func(t *testing.T) {
			status, code, msg := statusOf(tt.err)
			if status != tt.status || code != tt.code || msg != tt.msg {
				t.Fatalf("statusOf = %d %s %q, want %d %s %q", status, code, msg, tt.status, tt.code, tt.msg)
			}
			if s, c, m := StatusOf(tt.err); s != status || c != code || m != msg {
				t.Fatalf("StatusOf (the E2B edge) = %d %s %q, differs from statusOf", s, c, m)
			}
			var logged bytes.Buffer
			log := slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelDebug}))
			w := httptest.NewRecorder()
			writeError(w, httptest.NewRequest(http.MethodPost, "/api/sandboxes", nil), log, tt.err)
			var body errorBody
			if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
				t.Fatal(err)
			}
			if w.Code != tt.status || body.Code != tt.code || body.Message != tt.msg || body.Error != tt.msg {
				t.Fatalf("answered %d %+v, want %d %s %q", w.Code, body, tt.status, tt.code, tt.msg)
			}
			if g := w.Header().Get("Retry-After"); g != tt.retry {
				t.Fatalf("Retry-After %q, want %q", g, tt.retry)
			}
			if strings.Contains(w.Body.String(), hostPath) || strings.Contains(w.Body.String(), "not permitted") {
				t.Fatalf("answer %s carries a cause", w.Body.String())
			}
			if tt.log != "" && !strings.Contains(logged.String(), tt.log) {
				t.Fatalf("log %q lacks the cause %q", logged.String(), tt.log)
			}
			var ex *errdefs.Exceeded
			if errors.As(tt.err, &ex) && (body.Unit != ex.Unit || body.Limit == nil || *body.Limit != ex.Limit || *body.Running != ex.InUse || *body.Needed != ex.Needed) {
				t.Fatalf("limit details %+v, want %+v", body, ex)
			}
		})
	}
}
