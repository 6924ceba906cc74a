package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lizard-build/lizard/internal/store"
)

var _ store.Events = (*Store)(nil)

// eventsLock is the key of the transaction-level advisory lock every
// append of events takes: appends commit one at a time, so seq (taken
// inside the lock) grows in the order of commits and a reader never sees
// seq n before an event with a lower seq that commits later.
const eventsLock = 0x6c697a6172640002 // "lizard" 2

// AppendEvents adds events to the log with their webhooks' deliveries.
func (s *Store) AppendEvents(ctx context.Context, evs []store.Event) error {
	if len(evs) == 0 {
		return nil
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(eventsLock)); err != nil {
			return err
		}
		hooks := map[string][]store.Webhook{} // by project, read once
		for _, ev := range evs {
			tag, err := tx.Exec(ctx, `INSERT INTO events(id, project_id, sandbox_id, type, at, data) VALUES($1, $2, $3, $4, $5, $6)
				ON CONFLICT(id) DO NOTHING`, ev.ID, ev.ProjectID, ev.SandboxID, ev.Type, ev.At, string(ev.Data))
			if err != nil {
				return err
			}
			if tag.RowsAffected() == 0 {
				continue // appended before
			}
			ws, ok := hooks[ev.ProjectID]
			if !ok {
				if ws, err = webhooksOf(ctx, tx, ev.ProjectID); err != nil {
					return err
				}
				hooks[ev.ProjectID] = ws
			}
			for _, w := range ws {
				if !w.Wants(ev.Type) {
					continue
				}
				if _, err := tx.Exec(ctx, `INSERT INTO webhook_deliveries(id, webhook_id, project_id, event_id, event_type, body, state)
						VALUES($1, $2, $3, $4, $5, $6, $7)`,
					store.NewID("dlv_", 20), w.ID, ev.ProjectID, ev.ID, ev.Type, string(ev.Data), store.DeliveryPending); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// Events lists the events q selects, by seq.
func (s *Store) Events(ctx context.Context, q store.EventQuery) ([]store.Event, error) {
	where := []string{"project_id = $1", "seq > $2"}
	args := []any{q.ProjectID, q.After}
	arg := func(cond string, v any) {
		args = append(args, v)
		where = append(where, fmt.Sprintf(cond, len(args)))
	}
	if !q.Since.IsZero() {
		arg("at >= $%d", q.Since)
	}
	if q.SandboxID != "" {
		arg("sandbox_id = $%d", q.SandboxID)
	}
	if len(q.Types) > 0 {
		arg("type = ANY($%d)", q.Types)
	}
	limit := q.Limit
	if limit <= 0 {
		limit = store.DefaultEventPage
	}
	args = append(args, limit)
	rows, _ := s.pool.Query(ctx, `SELECT seq, id, project_id, sandbox_id, type, at, data FROM events WHERE `+
		strings.Join(where, " AND ")+fmt.Sprintf(` ORDER BY seq LIMIT $%d`, len(args)), args...)
	return collect(rows, func(r pgx.CollectableRow) (ev store.Event, err error) {
		var data string
		err = r.Scan(&ev.Seq, &ev.ID, &ev.ProjectID, &ev.SandboxID, &ev.Type, &ev.At, &data)
		ev.At, ev.Data = ev.At.UTC(), json.RawMessage(data)
		return ev, err
	})
}

// EventSeq is the seq of a project's event.
func (s *Store) EventSeq(ctx context.Context, projectID, id string) (int64, error) {
	var seq int64
	err := s.pool.QueryRow(ctx, `SELECT seq FROM events WHERE id = $1 AND project_id = $2`, id, projectID).Scan(&seq)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, store.EventNotFound(id)
	}
	return seq, err
}

// LastEventSeq is the highest seq in the log.
func (s *Store) LastEventSeq(ctx context.Context) (int64, error) {
	var seq int64
	err := s.pool.QueryRow(ctx, `SELECT coalesce(max(seq), 0) FROM events`).Scan(&seq)
	return seq, err
}

// PruneEvents removes the events that happened before before.
func (s *Store) PruneEvents(ctx context.Context, before time.Time) (int64, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM events WHERE at < $1`, before)
	return tag.RowsAffected(), err
}

// CreateWebhook adds a webhook unless the project has max already; the
// project's row is locked so that two creates count one after the other.
func (s *Store) CreateWebhook(ctx context.Context, w store.Webhook, max int) (store.Webhook, error) {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT 1 FROM projects WHERE id = $1 FOR NO KEY UPDATE`, w.ProjectID); err != nil {
			return err
		}
		if max > 0 {
			var n int
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM webhooks WHERE project_id = $1`, w.ProjectID).Scan(&n); err != nil {
				return err
			}
			if n >= max {
				return store.WebhookLimit(max)
			}
		}
		return tx.QueryRow(ctx, `INSERT INTO webhooks(id, project_id, url, types, secret) VALUES($1, $2, $3, $4, $5) RETURNING created_at`,
			w.ID, w.ProjectID, w.URL, store.TypesJSON(w.Types), w.Secret).Scan(&w.CreatedAt)
	})
	w.CreatedAt = w.CreatedAt.UTC()
	return w, err
}

// Webhooks lists a project's webhooks, oldest first.
func (s *Store) Webhooks(ctx context.Context, projectID string) ([]store.Webhook, error) {
	return webhooksOf(ctx, s.pool, projectID)
}

func webhooksOf(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, projectID string) ([]store.Webhook, error) {
	rows, _ := q.Query(ctx, `SELECT id, project_id, url, types, secret, created_at FROM webhooks WHERE project_id = $1 ORDER BY created_at, id`, projectID)
	return collect(rows, func(r pgx.CollectableRow) (w store.Webhook, err error) {
		var types string
		if err = r.Scan(&w.ID, &w.ProjectID, &w.URL, &types, &w.Secret, &w.CreatedAt); err != nil {
			return w, err
		}
		w.CreatedAt = w.CreatedAt.UTC()
		w.Types, err = store.ParseTypes(types)
		return w, err
	})
}

// DeleteWebhook removes a project's webhook and its deliveries.
func (s *Store) DeleteWebhook(ctx context.Context, projectID, id string) error {
	tag, err := s.pool.Exec(ctx, `DELETE FROM webhooks WHERE id = $1 AND project_id = $2`, id, projectID)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return store.WebhookNotFound(id)
	}
	return nil
}

// fenceIfCluster checks f, locking its node's row, when it names a node
// (cluster mode).
func fenceIfCluster(ctx context.Context, tx pgx.Tx, f store.Fence) error {
	if f.Node == "" {
		return nil
	}
	return lockNode(ctx, tx, f)
}

// ClaimDeliveries claims due deliveries for lease; rows another node is
// claiming at the same moment are skipped, not waited for.
func (s *Store) ClaimDeliveries(ctx context.Context, f store.Fence, lease time.Duration, limit int) ([]store.Delivery, error) {
	var out []store.Delivery
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := fenceIfCluster(ctx, tx, f); err != nil {
			return err
		}
		rows, _ := tx.Query(ctx, `UPDATE webhook_deliveries SET claim = $1, claim_node = $2, claim_inc = $3,
				claim_until = now() + make_interval(secs => $4)
			WHERE id IN (SELECT id FROM webhook_deliveries WHERE state = $5 AND next_at <= now() AND (claim = '' OR claim_until < now())
				ORDER BY next_at, created_at LIMIT $6 FOR UPDATE SKIP LOCKED)
			RETURNING id`, store.NewID("clm_", 16), f.Node, f.Incarnation, lease.Seconds(), store.DeliveryPending, limit)
		ids, err := collect(rows, pgx.RowTo[string])
		if err != nil || len(ids) == 0 {
			return err
		}
		out, err = deliveries(ctx, tx, `d.id = ANY($1) ORDER BY d.next_at, d.created_at`, ids)
		return err
	})
	if out == nil {
		out = []store.Delivery{}
	}
	return out, err
}

// deliveryColumns are what deliveries reads, of d (webhook_deliveries)
// and w (webhooks).
const deliveryColumns = `d.id, d.webhook_id, d.project_id, d.event_id, d.event_type, d.body, d.state, d.attempts,
	d.created_at, d.next_at, d.updated_at, w.url, w.secret, d.claim`

func deliveries(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, where string, args ...any) ([]store.Delivery, error) {
	rows, _ := q.Query(ctx, `SELECT `+deliveryColumns+` FROM webhook_deliveries d JOIN webhooks w ON w.id = d.webhook_id WHERE `+where, args...)
	return collect(rows, func(r pgx.CollectableRow) (d store.Delivery, err error) {
		var body string
		err = r.Scan(&d.ID, &d.WebhookID, &d.ProjectID, &d.EventID, &d.EventType, &body, &d.State, &d.Attempts,
			&d.CreatedAt, &d.NextAt, &d.UpdatedAt, &d.URL, &d.Secret, &d.Claim)
		d.Body = json.RawMessage(body)
		d.CreatedAt, d.NextAt, d.UpdatedAt = d.CreatedAt.UTC(), d.NextAt.UTC(), d.UpdatedAt.UTC()
		return d, err
	})
}

// RecordAttempt records an attempt under its claim and ends the claim.
func (s *Store) RecordAttempt(ctx context.Context, f store.Fence, id, claim string, r store.AttemptResult) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := fenceIfCluster(ctx, tx, f); err != nil {
			return err
		}
		var n int
		err := tx.QueryRow(ctx, `UPDATE webhook_deliveries SET state = $1, attempts = attempts + 1, updated_at = now(),
				next_at = now() + make_interval(secs => $2), claim = '', claim_until = 'epoch'
			WHERE id = $3 AND claim = $4 AND claim <> '' RETURNING attempts`, r.State, r.RetryIn.Seconds(), id, claim).Scan(&n)
		if errors.Is(err, pgx.ErrNoRows) {
			return store.DeliveryClaimLost(id)
		}
		if err != nil {
			return err
		}
		a := r.Attempt
		_, err = tx.Exec(ctx, `INSERT INTO webhook_attempts(delivery_id, n, at, status_code, error, duration_ms) VALUES($1, $2, $3, $4, $5, $6)`,
			id, n, a.At, a.StatusCode, a.Error, a.Duration.Milliseconds())
		return err
	})
}

// ReleaseClaims ends the claims of f's node's earlier incarnations.
func (s *Store) ReleaseClaims(ctx context.Context, f store.Fence) error {
	_, err := s.pool.Exec(ctx, `UPDATE webhook_deliveries SET claim = '', claim_until = 'epoch'
		WHERE claim <> '' AND claim_node = $1 AND claim_inc <> $2`, f.Node, f.Incarnation)
	return err
}

// Deliveries lists a webhook's deliveries, newest first, with their
// attempts.
func (s *Store) Deliveries(ctx context.Context, projectID, webhookID string, limit int) ([]store.Delivery, error) {
	var n int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM webhooks WHERE id = $1 AND project_id = $2`, webhookID, projectID).Scan(&n); err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, store.WebhookNotFound(webhookID)
	}
	out, err := deliveries(ctx, s.pool, `d.webhook_id = $1 ORDER BY d.created_at DESC, d.id DESC LIMIT $2`, webhookID, limit)
	if err != nil || len(out) == 0 {
		return out, err
	}
	h := store.NewHistory(out)
	rows, _ := s.pool.Query(ctx, `SELECT delivery_id, n, at, status_code, error, duration_ms FROM webhook_attempts
		WHERE delivery_id = ANY($1) ORDER BY delivery_id, n`, h.IDs())
	type row struct {
		id string
		a  store.Attempt
	}
	got, err := collect(rows, func(r pgx.CollectableRow) (x row, err error) {
		var ms int64
		err = r.Scan(&x.id, &x.a.N, &x.a.At, &x.a.StatusCode, &x.a.Error, &ms)
		x.a.At, x.a.Duration = x.a.At.UTC(), time.Duration(ms)*time.Millisecond
		return x, err
	})
	if err != nil {
		return nil, err
	}
	for _, x := range got {
		h.Add(x.id, x.a)
	}
	return out, nil
}

// PruneDeliveries removes the deliveries that ended before before.
func (s *Store) PruneDeliveries(ctx context.Context, before time.Time) (int64, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM webhook_deliveries WHERE state <> $1 AND updated_at < $2`, store.DeliveryPending, before)
	return tag.RowsAffected(), err
}
