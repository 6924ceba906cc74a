// Package webhook carries a project's lifecycle events (internal/events)
// to the HTTP endpoints it subscribed (POST /api/webhooks): the webhooks'
// records and their checks (a URL on a loopback, link-local or private
// address is refused unless the operator allows its host, netguard), and
// the deliverer, which posts each event to each webhook that wants it,
// signed (sign.go), and retries a failure with exponential backoff and
// jitter for 24 hours (backoff.go), keeping every attempt and its answer.
//
// Deliveries are made in the store with the event they carry (store.Events
// AppendEvents), so they survive restarts: at least once, with the event's
// stable id, which receivers use to drop repeats. A node claims due
// deliveries for a lease on the database's clock, fenced by its
// incarnation in cluster mode, so that each attempt is made by one node of
// the cluster. Only cmd/lizard wires it; the API calls it through an
// interface of its own.
package webhook

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"unicode"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/events"
	"github.com/lizard-build/lizard/internal/netguard"
	"github.com/lizard-build/lizard/internal/store"
)

// DefaultMaxWebhooks is how many webhooks a project may have unless
// Config.MaxWebhooks says otherwise.
const DefaultMaxWebhooks = 20

// Bounds of a webhook's fields.
const (
	maxURL       = 2048
	minSecret    = 16
	maxSecret    = 256
	secretPrefix = "whsec_"
)

// CodeURLRefused is the code of a webhook URL on an address webhooks may
// not reach.
const CodeURLRefused = "webhook_url_refused"

// Request is a webhook to create.
type Request struct {
	URL string
	// Types are the event types it wants (none: every type).
	Types []string
	// Secret signs its deliveries ("": one is made).
	Secret string
}

// Create checks req and adds it as a webhook of the project; its secret
// is in the answer (the only answer that has it). A bad field is
// ErrInvalid naming it; a URL on a loopback, link-local or private
// address, unless the operator allows its host, is ErrInvalid with code
// webhook_url_refused; over the project's max, ErrLimit.
func (s *Service) Create(ctx context.Context, projectID string, req Request) (store.Webhook, error) {
	u, err := s.checkURL(ctx, req.URL)
	if err != nil {
		return store.Webhook{}, err
	}
	if err := events.CheckTypes("events", req.Types); err != nil {
		return store.Webhook{}, err
	}
	var types []string
	for _, t := range req.Types {
		if !slices.Contains(types, t) {
			types = append(types, t)
		}
	}
	secret := req.Secret
	if secret == "" {
		secret = store.NewID(secretPrefix, 32)
	} else if err := checkSecret(secret); err != nil {
		return store.Webhook{}, err
	}
	return s.cfg.Store.CreateWebhook(ctx, store.Webhook{ID: store.NewID("whk_", 16), ProjectID: projectID, URL: u,
		Types: types, Secret: secret}, s.cfg.MaxWebhooks)
}

// checkURL refuses a URL webhooks cannot or may not post to, naming the
// field, and returns it as it will be used.
func (s *Service) checkURL(ctx context.Context, raw string) (string, error) {
	bad := func(why string) error {
		return fmt.Errorf("url %q: %s: %w", raw, why, errdefs.ErrInvalid)
	}
	if raw == "" {
		return "", fmt.Errorf("url: required (the http or https URL events are posted to): %w", errdefs.ErrInvalid)
	}
	if len(raw) > maxURL {
		return "", fmt.Errorf("url: at most %d characters: %w", maxURL, errdefs.ErrInvalid)
	}
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return "", bad("not a URL")
	case u.Scheme != "http" && u.Scheme != "https":
		return "", bad("want an http or https URL")
	case u.Host == "" || u.Hostname() == "":
		return "", bad("no host")
	case u.User != nil:
		return "", bad("credentials in the URL are not supported (deliveries are signed: check the signature)")
	case u.Fragment != "":
		return "", bad("no fragment (#…) please")
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	if err := s.cfg.Guard.Check(ctx, net.JoinHostPort(u.Hostname(), port)); err != nil {
		if errors.Is(err, netguard.ErrRefused) {
			return "", errdefs.WithCode(CodeURLRefused, bad(
				"its host is, or resolves to, a loopback, link-local or private address, which webhooks may not reach unless the operator allows the host (--webhook-allow)"))
		}
		return "", bad(fmt.Sprintf("host %q does not resolve", u.Hostname()))
	}
	return u.String(), nil
}

// checkSecret refuses a secret too short, too long or with spaces or
// control characters.
func checkSecret(secret string) error {
	if len(secret) < minSecret || len(secret) > maxSecret {
		return fmt.Errorf("secret: %d to %d characters (or none: one is made): %w", minSecret, maxSecret, errdefs.ErrInvalid)
	}
	if strings.IndexFunc(secret, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0 {
		return fmt.Errorf("secret: no spaces or control characters: %w", errdefs.ErrInvalid)
	}
	return nil
}

// List lists the project's webhooks, oldest first, without their secrets.
func (s *Service) List(ctx context.Context, projectID string) ([]store.Webhook, error) {
	ws, err := s.cfg.Store.Webhooks(ctx, projectID)
	for i := range ws {
		ws[i].Secret = ""
	}
	return ws, err
}

// Get is one of the project's webhooks, without its secret; another
// project's or an unknown id is ErrNotFound.
func (s *Service) Get(ctx context.Context, projectID, id string) (store.Webhook, error) {
	ws, err := s.List(ctx, projectID)
	if err != nil {
		return store.Webhook{}, err
	}
	for _, w := range ws {
		if w.ID == id {
			return w, nil
		}
	}
	return store.Webhook{}, store.WebhookNotFound(id)
}

// Delete removes a webhook of the project; its pending deliveries are not
// attempted again. Another project's or an unknown id is ErrNotFound.
func (s *Service) Delete(ctx context.Context, projectID, id string) error {
	return s.cfg.Store.DeleteWebhook(ctx, projectID, id)
}

// MaxDeliveries is the most deliveries Deliveries lists.
const MaxDeliveries = 500

// Deliveries lists a webhook's latest deliveries, newest first (at most
// limit, 1 to MaxDeliveries), each with its attempts and their answers.
func (s *Service) Deliveries(ctx context.Context, projectID, id string, limit int) ([]store.Delivery, error) {
	if limit < 1 || limit > MaxDeliveries {
		return nil, fmt.Errorf("limit %d: 1 to %d: %w", limit, MaxDeliveries, errdefs.ErrInvalid)
	}
	return s.cfg.Store.Deliveries(ctx, projectID, id, limit)
}
