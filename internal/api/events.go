package api

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/events"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/webhook"
)

// Events follows a project's lifecycle events (*events.Log).
type Events interface {
	Follow(ctx context.Context, q events.Query, out events.Stream) error
}

// Webhooks manages a project's webhooks and reads their deliveries
// (*webhook.Service).
type Webhooks interface {
	Create(ctx context.Context, projectID string, req webhook.Request) (store.Webhook, error)
	List(ctx context.Context, projectID string) ([]store.Webhook, error)
	Get(ctx context.Context, projectID, id string) (store.Webhook, error)
	Delete(ctx context.Context, projectID, id string) error
	Deliveries(ctx context.Context, projectID, id string, limit int) ([]store.Delivery, error)
}

var (
	_ Events   = (*events.Log)(nil)
	_ Webhooks = (*webhook.Service)(nil)
)

// eventRoutes serve GET /api/events.
type eventRoutes struct {
	events Events
	log    *slog.Logger
}

// streamEvents is GET /api/events: the project's lifecycle events as
// Server-Sent Events (each `id: <event id>` and `data: <event JSON>`),
// from now on, or from `since`, or after the event a reconnecting client
// names (Last-Event-ID, or lastEventId in the query); `sandboxId` and
// `type` (repeated or comma-separated) filter. In a cluster any node
// serves it: the log is the shared database's.
func (s eventRoutes) streamEvents(w http.ResponseWriter, r *http.Request, p store.Project) error {
	qv := r.URL.Query()
	q := events.Query{ProjectID: p.ID, SandboxID: qv.Get("sandboxId"), LastEventID: r.Header.Get("Last-Event-ID")}
	if q.LastEventID == "" {
		q.LastEventID = qv.Get("lastEventId")
	}
	for _, v := range qv["type"] {
		for _, t := range strings.Split(v, ",") {
			if t = strings.TrimSpace(t); t != "" {
				q.Types = append(q.Types, t)
			}
		}
	}
	if err := events.CheckTypes("type", q.Types); err != nil {
		return err
	}
	if v := qv.Get("since"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return fmt.Errorf("since %q: want an RFC 3339 time (2026-05-01T12:00:00Z): %w", v, errdefs.ErrInvalid)
		}
		q.Since = t
	}
	rc := http.NewResponseController(w)
	comment := func(text string) error {
		if _, err := fmt.Fprintf(w, ": %s\n\n", text); err != nil {
			return err
		}
		return rc.Flush()
	}
	opened := false
	err := s.events.Follow(r.Context(), q, events.Stream{
		Opened: func() error {
			opened = true
			startEventStream(w)
			// EventSource reconnects after retry ms, with the last id.
			fmt.Fprint(w, "retry: 3000\n")
			return comment("lizard events")
		},
		Send: func(ev store.Event) error {
			if _, err := fmt.Fprintf(w, "id: %s\ndata: %s\n\n", ev.ID, ev.Data); err != nil {
				return err
			}
			return rc.Flush()
		},
		Keepalive: func() error { return comment("keepalive") },
	})
	if err != nil && opened {
		// Under way: the status is sent; the log says why it ended.
		s.log.Warn("event stream ended", "project", p.ID, "err", err)
		return nil
	}
	return err
}

// startEventStream answers 200 as a stream of Server-Sent Events, which
// nothing between the server and the client may buffer or cache.
func startEventStream(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
}

// webhookRoutes serve /api/webhooks.
type webhookRoutes struct {
	webhooks Webhooks
}

// webhookInfo is a webhook as the API shows it; Secret only in the answer
// to its creation.
type webhookInfo struct {
	ID        string   `json:"id"`
	URL       string   `json:"url"`
	Events    []string `json:"events"` // []: every type
	CreatedAt string   `json:"createdAt"`
	Secret    string   `json:"secret,omitempty"`
}

func webhookInfoOf(w store.Webhook) webhookInfo {
	types := w.Types
	if types == nil {
		types = []string{}
	}
	return webhookInfo{ID: w.ID, URL: w.URL, Events: types, CreatedAt: w.CreatedAt.UTC().Format(time.RFC3339Nano), Secret: w.Secret}
}

// createWebhook is POST /api/webhooks {url, events?, secret?}.
func (s webhookRoutes) createWebhook(w http.ResponseWriter, r *http.Request, p store.Project) error {
	var body struct {
		URL    string   `json:"url"`
		Events []string `json:"events"`
		Secret string   `json:"secret"`
	}
	if err := decode(w, r, maxBody, &body); err != nil {
		return err
	}
	hook, err := s.webhooks.Create(r.Context(), p.ID, webhook.Request{URL: body.URL, Types: body.Events, Secret: body.Secret})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, webhookInfoOf(hook))
	return nil
}

// listWebhooks is GET /api/webhooks: the project's, oldest first.
func (s webhookRoutes) listWebhooks(w http.ResponseWriter, r *http.Request, p store.Project) error {
	ws, err := s.webhooks.List(r.Context(), p.ID)
	if err != nil {
		return err
	}
	out := make([]webhookInfo, len(ws))
	for i, hook := range ws {
		out[i] = webhookInfoOf(hook)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// getWebhook is GET /api/webhooks/{wid}.
func (s webhookRoutes) getWebhook(w http.ResponseWriter, r *http.Request, p store.Project) error {
	hook, err := s.webhooks.Get(r.Context(), p.ID, r.PathValue("wid"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, webhookInfoOf(hook))
	return nil
}

// deleteWebhook is DELETE /api/webhooks/{wid}: no more deliveries.
func (s webhookRoutes) deleteWebhook(w http.ResponseWriter, r *http.Request, p store.Project) error {
	if err := s.webhooks.Delete(r.Context(), p.ID, r.PathValue("wid")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// deliveryInfo is a delivery with its attempts as the API shows it.
type deliveryInfo struct {
	ID            string          `json:"id"`
	EventID       string          `json:"eventId"`
	EventType     string          `json:"eventType"`
	State         string          `json:"state"`
	CreatedAt     string          `json:"createdAt"`
	UpdatedAt     string          `json:"updatedAt"`
	NextAttemptAt *string         `json:"nextAttemptAt"` // pending only
	Attempts      []attemptInfo   `json:"attempts"`
	Event         json.RawMessage `json:"event"`
}

type attemptInfo struct {
	Attempt    int    `json:"attempt"`
	At         string `json:"at"`
	StatusCode int    `json:"statusCode"` // 0: no answer
	Error      string `json:"error,omitempty"`
	DurationMs int64  `json:"durationMs"`
}

// defaultDeliveries is how many deliveries a list shows unless limit says.
const defaultDeliveries = 50

// listDeliveries is GET /api/webhooks/{wid}/deliveries?limit=: the
// latest deliveries, newest first, each with its attempts.
func (s webhookRoutes) listDeliveries(w http.ResponseWriter, r *http.Request, p store.Project) error {
	limit := defaultDeliveries
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("limit %q: want a number from 1 to %d: %w", v, webhook.MaxDeliveries, errdefs.ErrInvalid)
		}
		limit = n
	}
	ds, err := s.webhooks.Deliveries(r.Context(), p.ID, r.PathValue("wid"), limit)
	if err != nil {
		return err
	}
	ts := func(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
	out := make([]deliveryInfo, len(ds))
	for i, d := range ds {
		info := deliveryInfo{ID: d.ID, EventID: d.EventID, EventType: d.EventType, State: d.State, CreatedAt: ts(d.CreatedAt),
			UpdatedAt: ts(d.UpdatedAt), Attempts: make([]attemptInfo, len(d.History)), Event: d.Body}
		if d.State == store.DeliveryPending {
			next := ts(d.NextAt)
			info.NextAttemptAt = &next
		}
		for j, a := range d.History {
			info.Attempts[j] = attemptInfo{Attempt: a.N, At: ts(a.At), StatusCode: a.StatusCode, Error: a.Error, DurationMs: a.Duration.Milliseconds()}
		}
		out[i] = info
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
