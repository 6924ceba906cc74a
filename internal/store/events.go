package store

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// Events is the part of the store that keeps the lifecycle event log of
// every project (internal/events), the projects' webhooks and their
// deliveries (internal/webhook). Both backends implement it; in a cluster
// every node appends to and reads the one log of the shared database.
type Events interface {
	// AppendEvents adds evs to the log in their order, each with a Seq
	// above that of every event appended before it by any process on
	// the database (Seq order is the order of commits, so a reader that
	// has seen Seq n has seen every event up to n), and, in the same
	// transaction, one pending delivery of each event to every webhook
	// of its project that wants its type (Webhook.Wants), due at once.
	// An event whose ID is in the log already is skipped, with its
	// deliveries: a retry of an append whose outcome was unknown adds
	// nothing twice.
	AppendEvents(ctx context.Context, evs []Event) error
	// Events lists the events q selects, by Seq, at most q.Limit (0:
	// DefaultEventPage).
	Events(ctx context.Context, q EventQuery) ([]Event, error)
	// EventSeq is the Seq of event id of project projectID; an id the
	// log does not hold (never was, pruned, another project's) is
	// ErrNotFound.
	EventSeq(ctx context.Context, projectID, id string) (int64, error)
	// LastEventSeq is the highest Seq in the log (0 when empty).
	LastEventSeq(ctx context.Context) (int64, error)
	// PruneEvents removes the events that happened before before and
	// says how many.
	PruneEvents(ctx context.Context, before time.Time) (int64, error)

	// CreateWebhook adds w (its ID, project, URL, types and secret as
	// given; CreatedAt is set by the store) unless its project has max
	// webhooks already: ErrLimit (max 0: no limit). Two creates at once
	// cannot both pass the limit.
	CreateWebhook(ctx context.Context, w Webhook, max int) (Webhook, error)
	// Webhooks lists a project's webhooks, oldest first.
	Webhooks(ctx context.Context, projectID string) ([]Webhook, error)
	// DeleteWebhook removes a webhook of the project with its
	// deliveries, pending ones included; another project's or an unknown
	// id is ErrNotFound.
	DeleteWebhook(ctx context.Context, projectID, id string) error

	// ClaimDeliveries claims up to limit pending deliveries that are due
	// (by the database's clock) and not claimed, or whose claim has
	// lapsed, for lease, and returns them with their webhook's URL and
	// secret and the claim's token (Delivery.Claim). Of nodes claiming at
	// once each delivery goes to one. With f.Node set (cluster mode) the
	// claim is fenced: f no longer current is ErrFenced.
	ClaimDeliveries(ctx context.Context, f Fence, lease time.Duration, limit int) ([]Delivery, error)
	// RecordAttempt records an attempt of delivery id under its claim
	// and ends the claim: the delivery's state becomes r.State, and a
	// pending one is due r.RetryIn from the database's now. A claim that
	// is no longer the delivery's (lapsed and taken, or released) is
	// ErrConflict and records nothing; f no longer current, ErrFenced.
	RecordAttempt(ctx context.Context, f Fence, id, claim string, r AttemptResult) error
	// ReleaseClaims ends the claims that earlier incarnations of node
	// f.Node (a restart) hold, so that their deliveries are due at once
	// rather than when the claims lapse.
	ReleaseClaims(ctx context.Context, f Fence) error
	// Deliveries lists a webhook's deliveries, newest first, at most
	// limit, each with its attempts (History), oldest first. Another
	// project's or an unknown webhook is ErrNotFound.
	Deliveries(ctx context.Context, projectID, webhookID string, limit int) ([]Delivery, error)
	// PruneDeliveries removes the deliveries that ended (delivered or
	// failed) before before, with their attempts, and says how many.
	PruneDeliveries(ctx context.Context, before time.Time) (int64, error)
}

// DefaultEventPage is what Events returns at most when the query says
// no limit.
const DefaultEventPage = 500

// Event is one entry of the lifecycle event log.
type Event struct {
	// Seq is its place in the log, set by the store.
	Seq int64
	// ID is its stable id, unique in the log ("evt_…").
	ID        string
	ProjectID string
	SandboxID string // "" for an event of no sandbox
	Type      string
	// At is when it happened.
	At time.Time
	// Data is the event as clients and webhooks read it (JSON); the
	// store does not look inside.
	Data json.RawMessage
}

// EventQuery selects events of one project.
type EventQuery struct {
	ProjectID string
	// After: only events with a higher Seq.
	After int64
	// Since: only events that happened at or after it (zero: any).
	Since time.Time
	// SandboxID: only that sandbox's ("": any).
	SandboxID string
	// Types: only these (none: any).
	Types []string
	Limit int
}

// Webhook is a project's subscription to its events.
type Webhook struct {
	ID        string
	ProjectID string
	URL       string
	// Types it wants (none: every type).
	Types []string
	// Secret signs its deliveries.
	Secret    string
	CreatedAt time.Time
}

// Wants reports whether w takes events of type typ.
func (w Webhook) Wants(typ string) bool { return len(w.Types) == 0 || slices.Contains(w.Types, typ) }

// Delivery states.
const (
	DeliveryPending   = "pending"   // to be attempted (again)
	DeliveryDelivered = "delivered" // a 2xx answer came
	DeliveryFailed    = "failed"    // given up
)

// Delivery is one event on its way to one webhook.
type Delivery struct {
	ID        string
	WebhookID string
	ProjectID string
	EventID   string
	EventType string
	// Body is what is sent: the event's Data.
	Body     json.RawMessage
	State    string
	Attempts int
	// CreatedAt is when the event was appended; NextAt when a pending
	// delivery is due; UpdatedAt when it last changed.
	CreatedAt, NextAt, UpdatedAt time.Time
	// URL, Secret and Claim are set by ClaimDeliveries: the webhook's
	// URL and secret, and the claim's token for RecordAttempt.
	URL, Secret, Claim string
	// History is its attempts, oldest first (set by Deliveries).
	History []Attempt
}

// Attempt is one try of a delivery.
type Attempt struct {
	N  int // 1 for the first
	At time.Time
	// StatusCode is the receiver's answer (0: none came).
	StatusCode int
	// Error says why the attempt failed ("" when it did not).
	Error    string
	Duration time.Duration
}

// AttemptResult is an attempt and what follows from it.
type AttemptResult struct {
	Attempt Attempt
	// State is the delivery's state after it.
	State string
	// RetryIn is when a pending delivery is due again, from now.
	RetryIn time.Duration
}

// History puts the attempts a backend reads into the deliveries Deliveries
// lists, and clears what a list does not show (claims, secrets).
type History struct {
	ds []Delivery
	at map[string]int
}

// NewHistory prepares ds (a list's deliveries) for their attempts.
func NewHistory(ds []Delivery) *History {
	h := &History{ds: ds, at: make(map[string]int, len(ds))}
	for i := range ds {
		h.at[ds[i].ID] = i
		ds[i].Claim, ds[i].Secret, ds[i].History = "", "", []Attempt{}
	}
	return h
}

// IDs are the deliveries' ids, whose attempts the backend reads.
func (h *History) IDs() []string {
	ids := make([]string, len(h.ds))
	for i, d := range h.ds {
		ids[i] = d.ID
	}
	return ids
}

// Add appends attempt a to delivery id's history (attempts are added in
// their order).
func (h *History) Add(id string, a Attempt) {
	if i, ok := h.at[id]; ok {
		h.ds[i].History = append(h.ds[i].History, a)
	}
}

// WebhookNotFound is the error for a webhook the project does not have.
func WebhookNotFound(id string) error {
	return errdefs.WithCode("webhook_not_found", fmt.Errorf("webhook %q: %w", id, errdefs.ErrNotFound))
}

// WebhookLimit is the error for a create over the project's max.
func WebhookLimit(max int) error {
	return errdefs.WithCode("webhook_limit", fmt.Errorf("webhooks: a project may have at most %d: %w", max, errdefs.ErrLimit))
}

// EventNotFound is the error for an event id the log does not hold.
func EventNotFound(id string) error {
	return errdefs.WithCode("event_not_found", fmt.Errorf("event %q: %w", id, errdefs.ErrNotFound))
}

// DeliveryClaimLost is the error for an attempt recorded under a claim that is no
// longer the delivery's.
func DeliveryClaimLost(id string) error {
	return fmt.Errorf("delivery %s: its claim lapsed or was released: %w", id, errdefs.ErrConflict)
}

// TypesJSON is types as the backends keep them (a JSON array, [] for
// none).
func TypesJSON(types []string) string {
	if types == nil {
		types = []string{}
	}
	b, _ := json.Marshal(types)
	return string(b)
}

// ParseTypes reads what TypesJSON wrote.
func ParseTypes(s string) ([]string, error) {
	var t []string
	if err := json.Unmarshal([]byte(s), &t); err != nil {
		return nil, fmt.Errorf("webhook types %q: %w", s, err)
	}
	return t, nil
}
