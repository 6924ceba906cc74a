package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/lizard-build/lizard/internal/api"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
)

// TestPeerErrorKeepsClass: a peer's refusal of an /internal/v1 call (here
// a resume, drain --move) comes back of the class it had there: the
// calling node's API answers the status, code, message, Retry-After and
// limit details the peer's would have, and never the peer's cause.
func TestPeerErrorKeepsClass(t *testing.T) {
	tests := []struct {
		name   string
		err    error
		status int
		code   string
		retry  string
	}{
		{"not found", fmt.Errorf("sandbox %q: %w", "sbx1", errdefs.ErrNotFound), http.StatusNotFound, "not_found", ""},
		{"conflict", fmt.Errorf("sandbox %q is running: %w", "sbx1", errdefs.ErrConflict), http.StatusConflict, "conflict", ""},
		{"invalid", fmt.Errorf("template %q: want a name of 1 to 64 letters: %w", "x y", errdefs.ErrInvalid), http.StatusBadRequest, "invalid_request", ""},
		{"permission", fmt.Errorf("snapshot of another project: %w", errdefs.ErrPermission), http.StatusForbidden, "permission_denied", ""},
		{"unauthenticated", fmt.Errorf("no key: %w", errdefs.ErrUnauthenticated), http.StatusUnauthorized, "unauthenticated", ""},
		{"code override", errdefs.WithCode("template_not_found", fmt.Errorf("template %q: %w", "base", errdefs.ErrNotFound)), http.StatusNotFound, "template_not_found", ""},
		{"quota", &errdefs.Exceeded{Unit: "vcpu", Limit: 8, InUse: 6, Needed: 4, Err: fmt.Errorf("project p1 would use 10 vcpu of 8: %w", errdefs.ErrQuota)},
			http.StatusTooManyRequests, "quota_exceeded", ""},
		{"capacity", fmt.Errorf("node b is full: %w", errdefs.ErrCapacity), http.StatusServiceUnavailable, "capacity", "5"},
		{"recovering", errdefs.WithCode("recovering", fmt.Errorf("sandbox %q is being reattached: %w", "sbx1", errdefs.ErrUnavailable)), http.StatusServiceUnavailable, "recovering", "1"},
		{"unavailable with a cause", errdefs.WithCause(errdefs.ErrUnavailable, "runsc restore failed", errors.New("exit status 1: open /var/lib/lizard/secret: denied")),
			http.StatusServiceUnavailable, "unavailable", ""},
		{"too large", fmt.Errorf("file of 2 GiB over 1 GiB: %w", errdefs.ErrTooLarge), http.StatusRequestEntityTooLarge, "too_large", ""},
		{"limit", fmt.Errorf("20 sandboxes at most: %w", errdefs.ErrLimit), http.StatusTooManyRequests, "limit_exceeded", ""},
		{"no space", fmt.Errorf("state disk full: %w", errdefs.ErrNoSpace), http.StatusInsufficientStorage, "insufficient_storage", ""},
		{"timeout", fmt.Errorf("agent did not start in 30s: %w", errdefs.ErrTimeout), http.StatusGatewayTimeout, "timeout", ""},
		{"no class", errors.New("disk on fire at /var/lib/lizard"), http.StatusInternalServerError, "internal", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got atomic.Value
			b := resumingPeer(t, "b", tt.err, &got)
			withBuild := func(n store.Node) store.Node {
				n.RunscBuild, n.Templates = "r1", []string{"base"}
				return n
			}
			fc := &fakeCluster{owners: map[string]store.Owner{"sbx1": {Node: store.Orphan, ProjectID: "p1", Status: store.SandboxPaused, Template: "base"}},
				nodes: []store.Node{withBuild(readyNode("a", "127.0.0.1:1")), withBuild(readyNode("b", addrOf(b)))}}
			rt := newTestRouter(t, "a", fc, nil, nil)
			err := rt.ResumeElsewhere(context.Background(), "sbx1")
			if err == nil || got.Load() != "b:sbx1" {
				t.Fatalf("resume elsewhere: %v (b saw %v), want b's refusal", err, got.Load())
			}
			status, code, msg := api.StatusOf(err)
			_, _, peerMsg := api.StatusOf(tt.err)
			if status != tt.status || code != tt.code || msg != peerMsg {
				t.Fatalf("answered %d %s %q, want %d %s %q", status, code, msg, tt.status, tt.code, peerMsg)
			}
			if strings.Contains(msg, "/var/lib") {
				t.Fatalf("client message %q carries the peer's cause", msg)
			}
			w := httptest.NewRecorder()
			api.SetRetryAfter(w, err)
			if g := w.Header().Get("Retry-After"); g != tt.retry {
				t.Fatalf("Retry-After %q, want %q", g, tt.retry)
			}
			var want, ex *errdefs.Exceeded
			if errors.As(tt.err, &want) != errors.As(err, &ex) || want != nil && (ex.Unit != want.Unit || ex.Limit != want.Limit || ex.InUse != want.InUse || ex.Needed != want.Needed) {
				t.Fatalf("limit details %+v, want %+v", ex, want)
			}
			if !strings.Contains(err.Error(), "node b") {
				t.Fatalf("error %q does not name the peer for the log", err)
			}
		})
	}
}

// TestPeerAnswerOther: an answer that is no peerError (the internal
// listener's 401 for a bad signature, a 503 of something in between) is
// not taken for the client's fault: a 503 is retryable ErrUnavailable,
// anything else an internal error; the body stays in the log.
func TestPeerAnswerOther(t *testing.T) {
	n := readyNode("b", "10.0.0.2:9000")
	for _, tt := range []struct {
		status int
		want   int
	}{
		{http.StatusUnauthorized, http.StatusInternalServerError},
		{http.StatusNotFound, http.StatusInternalServerError},
		{http.StatusServiceUnavailable, http.StatusServiceUnavailable},
	} {
		rec := httptest.NewRecorder()
		http.Error(rec, "secret detail at /srv/lizard", tt.status)
		err := peerAnswer(n, rec.Result())
		status, _, msg := api.StatusOf(err)
		if status != tt.want || strings.Contains(msg, "/srv/lizard") || !strings.Contains(err.Error(), "/srv/lizard") {
			t.Fatalf("peer's plain %d: %d %q (log %q), want %d, the body in the log only", tt.status, status, msg, err, tt.want)
		}
	}
	// A peer that cannot be dialled: its address is in the log, not the
	// message.
	err := unreachable(n, errors.New("dial tcp 10.0.0.2:9000: connection refused"))
	if status, code, msg := api.StatusOf(err); status != http.StatusServiceUnavailable || code != codeNodeUnavailable || strings.Contains(msg, "10.0.0.2") {
		t.Fatalf("unreachable peer: %d %s %q", status, code, msg)
	}
}
