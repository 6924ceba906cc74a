package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/lizard-build/lizard/internal/store"
)

var _ store.Cluster = (*Store)(nil)

// On SQLite the database's clock is this process's: one file is never
// shared by several machines. Lease times are Unix nanoseconds. Admission
// needs no row locks: a transaction on the single connection excludes every
// other writer of the file.

func nanos(t time.Time) int64 { return t.UnixNano() }

// RegisterNode inserts the node or takes its row over with a new
// incarnation.
func (s *Store) RegisterNode(ctx context.Context, info store.NodeInfo, lease time.Duration) (store.Fence, error) {
	tmpl, err := templatesJSON(info)
	if err != nil {
		return store.Fence{}, err
	}
	now := time.Now()
	var inc int64
	err = s.db.QueryRowContext(ctx, `INSERT INTO nodes(name, address, incarnation, runsc_build, vcpus, memory_mb, max_sandboxes, templates,
			lease_until, heartbeat_at, joined_at)
		VALUES(?, ?, 1, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT(name) DO UPDATE SET address = excluded.address, incarnation = nodes.incarnation + 1, gone = '',
			runsc_build = excluded.runsc_build, vcpus = excluded.vcpus, memory_mb = excluded.memory_mb,
			max_sandboxes = excluded.max_sandboxes, templates = excluded.templates,
			lease_until = excluded.lease_until, heartbeat_at = excluded.heartbeat_at, joined_at = excluded.joined_at
		RETURNING incarnation`,
		info.Name, info.Address, info.RunscBuild, info.VCPUs, info.MemoryMB, info.MaxSandboxes, tmpl,
		nanos(now.Add(lease)), nanos(now), nanos(now)).Scan(&inc)
	if err != nil {
		return store.Fence{}, err
	}
	return store.Fence{Node: info.Name, Incarnation: inc}, nil
}

func templatesJSON(info store.NodeInfo) (string, error) {
	t := info.Templates
	if t == nil {
		t = []string{}
	}
	b, err := json.Marshal(t)
	return string(b), err
}

// Heartbeat renews f's lease and records info.
func (s *Store) Heartbeat(ctx context.Context, f store.Fence, info store.NodeInfo, lease time.Duration) error {
	tmpl, err := templatesJSON(info)
	if err != nil {
		return err
	}
	now := time.Now()
	res, err := s.db.ExecContext(ctx, `UPDATE nodes SET lease_until = ?, heartbeat_at = ?, address = ?,
			runsc_build = ?, vcpus = ?, memory_mb = ?, max_sandboxes = ?, templates = ?
		WHERE name = ? AND incarnation = ? AND gone = ''`,
		nanos(now.Add(lease)), nanos(now), info.Address, info.RunscBuild, info.VCPUs, info.MemoryMB, info.MaxSandboxes, tmpl,
		f.Node, f.Incarnation)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return errors.Join(err, store.Fenced(f))
	}
	return nil
}

// notIn is "(?, ?, …)" for n values.
func notIn(n int) string { return "(" + strings.TrimSuffix(strings.Repeat("?, ", n), ", ") + ")" }

func anys(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// Nodes lists every node by name.
func (s *Store) Nodes(ctx context.Context) ([]store.Node, error) {
	reserving := `status NOT IN ` + notIn(len(store.NotReserving))
	args := append(append(anys(store.NotReserving), anys(store.NotReserving)...), store.SandboxLost)
	rows, err := s.db.QueryContext(ctx, `SELECT n.name, n.address, n.incarnation, n.gone, n.draining, n.move, n.runsc_build, n.vcpus, n.memory_mb,
			n.max_sandboxes, n.templates, n.heartbeat_at, n.joined_at, n.lease_until,
			coalesce(u.cpus, 0), coalesce(u.memory_mb, 0), coalesce(u.n, 0)
		FROM nodes n LEFT JOIN (
			SELECT node, count(*) AS n,
				sum(CASE WHEN `+reserving+` THEN cpus ELSE 0 END) AS cpus,
				sum(CASE WHEN `+reserving+` THEN memory_mb ELSE 0 END) AS memory_mb
			FROM sandboxes WHERE status <> ? GROUP BY node) u ON u.node = n.name
		ORDER BY n.name`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	now := time.Now()
	out := []store.Node{}
	for rows.Next() {
		var n store.Node
		var gone, tmpl string
		var hb, joined, until int64
		if err := rows.Scan(&n.Name, &n.Address, &n.Incarnation, &gone, &n.Draining, &n.Moving, &n.RunscBuild, &n.VCPUs, &n.MemoryMB,
			&n.MaxSandboxes, &tmpl, &hb, &joined, &until, &n.ReservedVCPUs, &n.ReservedMemoryMB, &n.Sandboxes); err != nil {
			return nil, err
		}
		n.Heartbeat, n.JoinedAt = time.Unix(0, hb).UTC(), time.Unix(0, joined).UTC()
		n.LeaseLeft = time.Unix(0, until).Sub(now)
		n.State = store.NodeState(gone, n.Draining, n.LeaseLeft)
		if err := json.Unmarshal([]byte(tmpl), &n.Templates); err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, rows.Err()
}

// SetDraining sets or clears a node's draining flag.
func (s *Store) SetDraining(ctx context.Context, name string, draining bool) error {
	res, err := s.db.ExecContext(ctx, `UPDATE nodes SET draining = ?, move = move AND ? WHERE name = ?`, draining, draining, name)
	return affected(res, err, name)
}

// affected is err, or ErrNotFound for the node when res changed no row.
func affected(res sql.Result, err error, name string) error {
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return errors.Join(err, store.NodeNotFound(name))
	}
	return nil
}

// inTx runs fn in a transaction, committed if fn returns nil.
func (s *Store) inTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

// DeclareDead marks a node dead once its lease has lapsed for after, and
// its sandboxes lost.
func (s *Store) DeclareDead(ctx context.Context, name string, after time.Duration) (bool, error) {
	var done bool
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE nodes SET gone = ? WHERE name = ? AND gone = '' AND lease_until <= ?`,
			store.NodeDead, name, nanos(time.Now().Add(-after)))
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return err
		}
		done = true
		return loseSandboxes(ctx, tx, name)
	})
	return done, err
}

// loseSandboxes orphans the node's durable paused sandboxes and marks the
// rest lost.
func loseSandboxes(ctx context.Context, tx *sql.Tx, node string) error {
	_, err := tx.ExecContext(ctx, `UPDATE sandboxes SET node = ? WHERE node = ? AND status = ? AND json_extract(spec, ?) IS NOT NULL`,
		store.Orphan, node, store.SandboxPaused, "$."+store.DurableKey)
	if err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, `UPDATE sandboxes SET status = ? WHERE node = ?`, store.SandboxLost, node)
	return err
}

// RemoveNode marks a node removed and its sandboxes lost.
func (s *Store) RemoveNode(ctx context.Context, name string) error {
	return s.inTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE nodes SET gone = ? WHERE name = ?`, store.NodeRemoved, name)
		if err := affected(res, err, name); err != nil {
			return err
		}
		return loseSandboxes(ctx, tx, name)
	})
}

// SetMoving asks a node to move its sandboxes away, or says it is done.
func (s *Store) SetMoving(ctx context.Context, name string, move bool) error {
	res, err := s.db.ExecContext(ctx, `UPDATE nodes SET move = ?, draining = draining OR ? WHERE name = ?`, move, move, name)
	return affected(res, err, name)
}

// ReleaseSandbox orphans a durable paused sandbox of f's node.
func (s *Store) ReleaseSandbox(ctx context.Context, f store.Fence, id string) error {
	return s.inTx(ctx, func(tx *sql.Tx) error {
		if err := checkFence(ctx, tx, f); err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, `UPDATE sandboxes SET node = ? WHERE id = ? AND node = ? AND status = ? AND json_extract(spec, ?) IS NOT NULL`,
			store.Orphan, id, f.Node, store.SandboxPaused, "$."+store.DurableKey)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			if err == nil {
				err = store.NotReleasable(id, f.Node)
			}
			return err
		}
		return nil
	})
}

// AdoptPool makes f's node keep snapshot id's warm copies if from keeps
// them now.
func (s *Store) AdoptPool(ctx context.Context, f store.Fence, id, from string) error {
	return s.inTx(ctx, func(tx *sql.Tx) error {
		if err := checkFence(ctx, tx, f); err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, `UPDATE snapshots SET pool_node = ? WHERE id = ? AND (CASE WHEN pool_node = '' THEN node ELSE pool_node END) = ?`,
			f.Node, id, from)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			if err == nil {
				err = store.NotAdoptable(id, from)
			}
			return err
		}
		return nil
	})
}

// checkFence checks that f is its node's current incarnation.
func checkFence(ctx context.Context, tx *sql.Tx, f store.Fence) error {
	var inc int64
	var gone string
	err := tx.QueryRowContext(ctx, `SELECT incarnation, gone FROM nodes WHERE name = ?`, f.Node).Scan(&inc, &gone)
	if errors.Is(err, sql.ErrNoRows) || err == nil && (inc != f.Incarnation || gone != "") {
		return store.Fenced(f)
	}
	return err
}

// PutSandboxFenced writes sb on f's node, admitting it.
func (s *Store) PutSandboxFenced(ctx context.Context, f store.Fence, sb store.Sandbox, admit *store.Admission) error {
	sb.Node = f.Node
	return s.inTx(ctx, func(tx *sql.Tx) error {
		if err := checkFence(ctx, tx, f); err != nil {
			return err
		}
		got, err := querySandboxes(ctx, tx, `SELECT `+sandboxColumns+` FROM sandboxes WHERE id = ?`, sb.ID)
		if err != nil {
			return err
		}
		old, err := store.OldRow(got, f)
		if err != nil {
			return err
		}
		if admit != nil {
			if need := admit.Need(old, sb); need != (store.Usage{}) {
				live, err := querySandboxes(ctx, tx, `SELECT `+sandboxColumns+` FROM sandboxes
					WHERE id <> ? AND status <> ? AND (node = ? OR project_id = ?)`, sb.ID, store.SandboxLost, f.Node, sb.ProjectID)
				if err != nil {
					return err
				}
				var node, proj store.Usage
				for _, r := range live {
					u := store.Usage{Sandboxes: 1}
					if slices.Contains(admit.Holding, r.Status) {
						u.VCPUs, u.MemoryMB = r.CPUs, r.MemoryMB
					}
					if r.Node == f.Node {
						node = node.Plus(u)
					}
					if r.ProjectID == sb.ProjectID {
						proj = proj.Plus(u)
					}
				}
				if err := admit.Check(node, proj, need); err != nil {
					return err
				}
			}
		}
		if old != nil && old.Node == store.Orphan {
			if _, err := tx.ExecContext(ctx, `UPDATE sandboxes SET node = ? WHERE id = ?`, f.Node, sb.ID); err != nil {
				return err
			}
		}
		_, err = tx.ExecContext(ctx, upsertSandbox, sandboxArgs(sb)...)
		return err
	})
}

// DeleteSandboxFenced removes a sandbox row of f's node.
func (s *Store) DeleteSandboxFenced(ctx context.Context, f store.Fence, id string) error {
	return s.inTx(ctx, func(tx *sql.Tx) error {
		if err := checkFence(ctx, tx, f); err != nil {
			return err
		}
		var node string
		err := tx.QueryRowContext(ctx, `SELECT node FROM sandboxes WHERE id = ?`, id).Scan(&node)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return nil
		case err != nil:
			return err
		case node != f.Node:
			return store.SandboxElsewhere(id, node)
		}
		_, err = tx.ExecContext(ctx, `DELETE FROM sandboxes WHERE id = ?`, id)
		return err
	})
}

// SandboxesOn lists one node's sandbox rows, lost ones included.
func (s *Store) SandboxesOn(ctx context.Context, node string) ([]store.Sandbox, error) {
	return querySandboxes(ctx, s.db, `SELECT `+sandboxColumns+` FROM sandboxes WHERE node = ?`, node)
}

// SandboxOwner says which node holds a sandbox.
func (s *Store) SandboxOwner(ctx context.Context, id string) (store.Owner, error) {
	var o store.Owner
	err := s.db.QueryRowContext(ctx, `SELECT node, project_id, status, template FROM sandboxes WHERE id = ?`, id).Scan(&o.Node, &o.ProjectID, &o.Status, &o.Template)
	if errors.Is(err, sql.ErrNoRows) {
		return store.Owner{}, store.SandboxNotFound(id)
	}
	o.Lost = o.Status == store.SandboxLost
	return o, err
}
