package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/lizard-build/lizard/internal/store"
)

var _ store.Events = (*Store)(nil)

// On SQLite the event log's order is the single writer's: seq
// AUTOINCREMENT in the order of commits. Times are Unix nanoseconds of
// this process's clock (one file is never shared by several machines).

// AppendEvents adds events to the log with their webhooks' deliveries.
func (s *Store) AppendEvents(ctx context.Context, evs []store.Event) error {
	if len(evs) == 0 {
		return nil
	}
	return s.inTx(ctx, func(tx *sql.Tx) error {
		hooks := map[string][]store.Webhook{} // by project, read once
		now := nanos(time.Now())
		for _, ev := range evs {
			res, err := tx.ExecContext(ctx, `INSERT INTO events(id, project_id, sandbox_id, type, at, data) VALUES(?,?,?,?,?,?)
				ON CONFLICT(id) DO NOTHING`, ev.ID, ev.ProjectID, ev.SandboxID, ev.Type, nanos(ev.At), string(ev.Data))
			if err != nil {
				return err
			}
			if n, err := res.RowsAffected(); err != nil || n == 0 {
				if err != nil {
					return err
				}
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
				if _, err := tx.ExecContext(ctx, `INSERT INTO webhook_deliveries(id, webhook_id, project_id, event_id, event_type, body, state,
						created_at, updated_at, next_at) VALUES(?,?,?,?,?,?,?,?,?,?)`,
					store.NewID("dlv_", 20), w.ID, ev.ProjectID, ev.ID, ev.Type, string(ev.Data), store.DeliveryPending, now, now, now); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// Events lists the events q selects, by seq.
func (s *Store) Events(ctx context.Context, q store.EventQuery) ([]store.Event, error) {
	where := []string{"project_id = ?", "seq > ?"}
	args := []any{q.ProjectID, q.After}
	if !q.Since.IsZero() {
		where, args = append(where, "at >= ?"), append(args, nanos(q.Since))
	}
	if q.SandboxID != "" {
		where, args = append(where, "sandbox_id = ?"), append(args, q.SandboxID)
	}
	if len(q.Types) > 0 {
		where, args = append(where, "type IN "+notIn(len(q.Types))), append(args, anys(q.Types)...)
	}
	limit := q.Limit
	if limit <= 0 {
		limit = store.DefaultEventPage
	}
	rows, err := s.db.QueryContext(ctx, `SELECT seq, id, project_id, sandbox_id, type, at, data FROM events WHERE `+
		strings.Join(where, " AND ")+` ORDER BY seq LIMIT ?`, append(args, limit)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []store.Event{}
	for rows.Next() {
		var ev store.Event
		var at int64
		var data string
		if err := rows.Scan(&ev.Seq, &ev.ID, &ev.ProjectID, &ev.SandboxID, &ev.Type, &at, &data); err != nil {
			return nil, err
		}
		ev.At, ev.Data = time.Unix(0, at).UTC(), json.RawMessage(data)
		out = append(out, ev)
	}
	return out, rows.Err()
}

// EventSeq is the seq of a project's event.
func (s *Store) EventSeq(ctx context.Context, projectID, id string) (int64, error) {
	var seq int64
	err := s.db.QueryRowContext(ctx, `SELECT seq FROM events WHERE id = ? AND project_id = ?`, id, projectID).Scan(&seq)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, store.EventNotFound(id)
	}
	return seq, err
}

// LastEventSeq is the highest seq in the log.
func (s *Store) LastEventSeq(ctx context.Context) (int64, error) {
	var seq int64
	err := s.db.QueryRowContext(ctx, `SELECT coalesce(max(seq), 0) FROM events`).Scan(&seq)
	return seq, err
}

// PruneEvents removes the events that happened before before.
func (s *Store) PruneEvents(ctx context.Context, before time.Time) (int64, error) {
	res, err := s.db.ExecContext(ctx, `DELETE FROM events WHERE at < ?`, nanos(before))
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// CreateWebhook adds a webhook unless the project has max already.
func (s *Store) CreateWebhook(ctx context.Context, w store.Webhook, max int) (store.Webhook, error) {
	w.CreatedAt = time.Now().UTC()
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		if max > 0 {
			var n int
			if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM webhooks WHERE project_id = ?`, w.ProjectID).Scan(&n); err != nil {
				return err
			}
			if n >= max {
				return store.WebhookLimit(max)
			}
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO webhooks(id, project_id, url, types, secret, created_at) VALUES(?,?,?,?,?,?)`,
			w.ID, w.ProjectID, w.URL, store.TypesJSON(w.Types), w.Secret, nanos(w.CreatedAt))
		return err
	})
	return w, err
}

// Webhooks lists a project's webhooks, oldest first.
func (s *Store) Webhooks(ctx context.Context, projectID string) ([]store.Webhook, error) {
	return webhooksOf(ctx, s.db, projectID)
}

func webhooksOf(ctx context.Context, q interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, projectID string) ([]store.Webhook, error) {
	rows, err := q.QueryContext(ctx, `SELECT id, project_id, url, types, secret, created_at FROM webhooks WHERE project_id = ? ORDER BY created_at, id`, projectID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []store.Webhook{}
	for rows.Next() {
		var w store.Webhook
		var types string
		var created int64
		if err := rows.Scan(&w.ID, &w.ProjectID, &w.URL, &types, &w.Secret, &created); err != nil {
			return nil, err
		}
		if w.Types, err = store.ParseTypes(types); err != nil {
			return nil, err
		}
		w.CreatedAt = time.Unix(0, created).UTC()
		out = append(out, w)
	}
	return out, rows.Err()
}

// DeleteWebhook removes a project's webhook and its deliveries.
func (s *Store) DeleteWebhook(ctx context.Context, projectID, id string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM webhooks WHERE id = ? AND project_id = ?`, id, projectID)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return errors.Join(err, store.WebhookNotFound(id))
	}
	return nil
}

// fenceIfCluster checks f when it names a node (cluster mode).
func fenceIfCluster(ctx context.Context, tx *sql.Tx, f store.Fence) error {
	if f.Node == "" {
		return nil
	}
	return checkFence(ctx, tx, f)
}

// ClaimDeliveries claims due deliveries for lease.
func (s *Store) ClaimDeliveries(ctx context.Context, f store.Fence, lease time.Duration, limit int) ([]store.Delivery, error) {
	var out []store.Delivery
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		if err := fenceIfCluster(ctx, tx, f); err != nil {
			return err
		}
		now := nanos(time.Now())
		claim := store.NewID("clm_", 16)
		rows, err := tx.QueryContext(ctx, `UPDATE webhook_deliveries SET claim = ?, claim_node = ?, claim_inc = ?, claim_until = ?
			WHERE id IN (SELECT id FROM webhook_deliveries WHERE state = ? AND next_at <= ? AND (claim = '' OR claim_until < ?)
				ORDER BY next_at, created_at LIMIT ?)
			RETURNING id`, claim, f.Node, f.Incarnation, now+int64(lease), store.DeliveryPending, now, now, limit)
		if err != nil {
			return err
		}
		var ids []string
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return err
			}
			ids = append(ids, id)
		}
		rows.Close()
		if err := rows.Err(); err != nil || len(ids) == 0 {
			return err
		}
		out, err = deliveries(ctx, tx, `d.id IN `+notIn(len(ids))+` ORDER BY d.next_at, d.created_at`, anys(ids)...)
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
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, where string, args ...any) ([]store.Delivery, error) {
	rows, err := q.QueryContext(ctx, `SELECT `+deliveryColumns+` FROM webhook_deliveries d JOIN webhooks w ON w.id = d.webhook_id WHERE `+where, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []store.Delivery{}
	for rows.Next() {
		var d store.Delivery
		var body string
		var created, next, updated int64
		if err := rows.Scan(&d.ID, &d.WebhookID, &d.ProjectID, &d.EventID, &d.EventType, &body, &d.State, &d.Attempts,
			&created, &next, &updated, &d.URL, &d.Secret, &d.Claim); err != nil {
			return nil, err
		}
		d.Body = json.RawMessage(body)
		d.CreatedAt, d.NextAt, d.UpdatedAt = time.Unix(0, created).UTC(), time.Unix(0, next).UTC(), time.Unix(0, updated).UTC()
		out = append(out, d)
	}
	return out, rows.Err()
}

// RecordAttempt records an attempt under its claim and ends the claim.
func (s *Store) RecordAttempt(ctx context.Context, f store.Fence, id, claim string, r store.AttemptResult) error {
	return s.inTx(ctx, func(tx *sql.Tx) error {
		if err := fenceIfCluster(ctx, tx, f); err != nil {
			return err
		}
		now := time.Now()
		res, err := tx.ExecContext(ctx, `UPDATE webhook_deliveries SET state = ?, attempts = attempts + 1, updated_at = ?, next_at = ?,
				claim = '', claim_until = 0
			WHERE id = ? AND claim = ? AND claim <> ''`, r.State, nanos(now), nanos(now.Add(r.RetryIn)), id, claim)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return errors.Join(err, store.DeliveryClaimLost(id))
		}
		a := r.Attempt
		_, err = tx.ExecContext(ctx, `INSERT INTO webhook_attempts(delivery_id, n, at, status_code, error, duration_ms)
			VALUES(?, (SELECT attempts FROM webhook_deliveries WHERE id = ?), ?, ?, ?, ?)`,
			id, id, nanos(a.At), a.StatusCode, a.Error, a.Duration.Milliseconds())
		return err
	})
}

// ReleaseClaims ends the claims of f's node's earlier incarnations.
func (s *Store) ReleaseClaims(ctx context.Context, f store.Fence) error {
	_, err := s.db.ExecContext(ctx, `UPDATE webhook_deliveries SET claim = '', claim_until = 0
		WHERE claim <> '' AND claim_node = ? AND claim_inc <> ?`, f.Node, f.Incarnation)
	return err
}

// Deliveries lists a webhook's deliveries, newest first, with their
// attempts.
func (s *Store) Deliveries(ctx context.Context, projectID, webhookID string, limit int) ([]store.Delivery, error) {
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM webhooks WHERE id = ? AND project_id = ?`, webhookID, projectID).Scan(&n); err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, store.WebhookNotFound(webhookID)
	}
	out, err := deliveries(ctx, s.db, `d.webhook_id = ? ORDER BY d.created_at DESC, d.id DESC LIMIT ?`, webhookID, limit)
	if err != nil || len(out) == 0 {
		return out, err
	}
	h := store.NewHistory(out)
	ids := h.IDs()
	rows, err := s.db.QueryContext(ctx, `SELECT delivery_id, n, at, status_code, error, duration_ms FROM webhook_attempts
		WHERE delivery_id IN `+notIn(len(ids))+` ORDER BY delivery_id, n`, anys(ids)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var a store.Attempt
		var t, ms int64
		if err := rows.Scan(&id, &a.N, &t, &a.StatusCode, &a.Error, &ms); err != nil {
			return nil, err
		}
		a.At, a.Duration = time.Unix(0, t).UTC(), time.Duration(ms)*time.Millisecond
		h.Add(id, a)
	}
	return out, rows.Err()
}

// PruneDeliveries removes the deliveries that ended before before.
func (s *Store) PruneDeliveries(ctx context.Context, before time.Time) (int64, error) {
	res, err := s.db.ExecContext(ctx, `DELETE FROM webhook_deliveries WHERE state <> ? AND updated_at < ?`, store.DeliveryPending, nanos(before))
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}
