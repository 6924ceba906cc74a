package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lizard-build/lizard/internal/store"
)

var _ store.Cluster = (*Store)(nil)

// Every time here is the database's: leases are compared with its now(),
// never with a node's clock.
//
// Admission (PutSandboxFenced) is serialized by row locks taken in one
// order, node row then project row, both SELECT … FOR NO KEY UPDATE in a
// READ COMMITTED transaction: every write of a node's sandboxes holds its
// node row, so the sums over the node's rows read after the lock see every
// earlier admission committed; every admission for a project holds its
// project row, so the cluster-wide project sums do too. One order means no
// deadlock, and no SERIALIZABLE retries: a create waits at most for the
// admissions before it on the same node or project. FOR NO KEY UPDATE
// (not FOR UPDATE) leaves the project row's KEY SHARE free for the foreign
// key checks of other inserts.

// RegisterNode inserts the node or takes its row over with a new
// incarnation.
func (s *Store) RegisterNode(ctx context.Context, info store.NodeInfo, lease time.Duration) (store.Fence, error) {
	tmpl, err := json.Marshal(templatesOf(info))
	if err != nil {
		return store.Fence{}, err
	}
	var inc int64
	err = s.pool.QueryRow(ctx, `INSERT INTO nodes(name, address, incarnation, runsc_build, vcpus, memory_mb, max_sandboxes, templates,
			lease_until, heartbeat_at, joined_at)
		VALUES($1, $2, 1, $3, $4, $5, $6, $7, now() + make_interval(secs => $8), now(), now())
		ON CONFLICT(name) DO UPDATE SET address = excluded.address, incarnation = nodes.incarnation + 1, gone = '',
			runsc_build = excluded.runsc_build, vcpus = excluded.vcpus, memory_mb = excluded.memory_mb,
			max_sandboxes = excluded.max_sandboxes, templates = excluded.templates,
			lease_until = excluded.lease_until, heartbeat_at = excluded.heartbeat_at, joined_at = excluded.joined_at
		RETURNING incarnation`,
		info.Name, info.Address, info.RunscBuild, info.VCPUs, info.MemoryMB, info.MaxSandboxes, string(tmpl), lease.Seconds()).Scan(&inc)
	if err != nil {
		return store.Fence{}, err
	}
	return store.Fence{Node: info.Name, Incarnation: inc}, nil
}

func templatesOf(info store.NodeInfo) []string {
	if info.Templates == nil {
		return []string{}
	}
	return info.Templates
}

// Heartbeat renews f's lease and records info.
func (s *Store) Heartbeat(ctx context.Context, f store.Fence, info store.NodeInfo, lease time.Duration) error {
	tmpl, err := json.Marshal(templatesOf(info))
	if err != nil {
		return err
	}
	tag, err := s.pool.Exec(ctx, `UPDATE nodes SET lease_until = now() + make_interval(secs => $3), heartbeat_at = now(), address = $4,
			runsc_build = $5, vcpus = $6, memory_mb = $7, max_sandboxes = $8, templates = $9
		WHERE name = $1 AND incarnation = $2 AND gone = ''`,
		f.Node, f.Incarnation, lease.Seconds(), info.Address, info.RunscBuild, info.VCPUs, info.MemoryMB, info.MaxSandboxes, string(tmpl))
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return store.Fenced(f)
	}
	return nil
}

// Nodes lists every node by name.
func (s *Store) Nodes(ctx context.Context) ([]store.Node, error) {
	rows, _ := s.pool.Query(ctx, `SELECT n.name, n.address, n.incarnation, n.gone, n.draining, n.move, n.runsc_build, n.vcpus, n.memory_mb,
			n.max_sandboxes, n.templates::text, n.heartbeat_at, n.joined_at,
			extract(epoch FROM n.lease_until - now())::double precision,
			coalesce(u.cpus, 0), coalesce(u.memory_mb, 0), coalesce(u.n, 0)
		FROM nodes n LEFT JOIN (
			SELECT node, count(*) AS n,
				sum(cpus) FILTER (WHERE status <> ALL($2)) AS cpus,
				sum(memory_mb) FILTER (WHERE status <> ALL($2)) AS memory_mb
			FROM sandboxes WHERE status <> $1 GROUP BY node) u ON u.node = n.name
		ORDER BY n.name`, store.SandboxLost, store.NotReserving)
	return collect(rows, func(r pgx.CollectableRow) (n store.Node, err error) {
		var gone, tmpl string
		var left float64
		err = r.Scan(&n.Name, &n.Address, &n.Incarnation, &gone, &n.Draining, &n.Moving, &n.RunscBuild, &n.VCPUs, &n.MemoryMB,
			&n.MaxSandboxes, &tmpl, &n.Heartbeat, &n.JoinedAt, &left, &n.ReservedVCPUs, &n.ReservedMemoryMB, &n.Sandboxes)
		if err != nil {
			return n, err
		}
		n.LeaseLeft = time.Duration(left * float64(time.Second))
		n.State = store.NodeState(gone, n.Draining, n.LeaseLeft)
		n.Heartbeat, n.JoinedAt = n.Heartbeat.UTC(), n.JoinedAt.UTC()
		return n, json.Unmarshal([]byte(tmpl), &n.Templates)
	})
}

// SetDraining sets or clears a node's draining flag.
func (s *Store) SetDraining(ctx context.Context, name string, draining bool) error {
	tag, err := s.pool.Exec(ctx, `UPDATE nodes SET draining = $2, move = move AND $2 WHERE name = $1`, name, draining)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return store.NodeNotFound(name)
	}
	return nil
}

// SetMoving asks a node to move its sandboxes away, or says it is done.
func (s *Store) SetMoving(ctx context.Context, name string, move bool) error {
	tag, err := s.pool.Exec(ctx, `UPDATE nodes SET move = $2, draining = draining OR $2 WHERE name = $1`, name, move)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return store.NodeNotFound(name)
	}
	return nil
}

// ReleaseSandbox orphans a durable paused sandbox of f's node.
func (s *Store) ReleaseSandbox(ctx context.Context, f store.Fence, id string) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := lockNode(ctx, tx, f); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `UPDATE sandboxes SET node = $3 WHERE id = $1 AND node = $2 AND status = $4 AND spec->>$5 IS NOT NULL`,
			id, f.Node, store.Orphan, store.SandboxPaused, store.DurableKey)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return store.NotReleasable(id, f.Node)
		}
		return nil
	})
}

// AdoptPool makes f's node keep snapshot id's warm copies if from keeps
// them now.
func (s *Store) AdoptPool(ctx context.Context, f store.Fence, id, from string) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := lockNode(ctx, tx, f); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `UPDATE snapshots SET pool_node = $2 WHERE id = $1 AND (CASE WHEN pool_node = '' THEN node ELSE pool_node END) = $3`,
			id, f.Node, from)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return store.NotAdoptable(id, from)
		}
		return nil
	})
}

// DeclareDead marks a node dead once its lease has lapsed for after, and
// its sandboxes lost.
func (s *Store) DeclareDead(ctx context.Context, name string, after time.Duration) (bool, error) {
	var done bool
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE nodes SET gone = $2 WHERE name = $1 AND gone = '' AND lease_until + make_interval(secs => $3) <= now()`,
			name, store.NodeDead, after.Seconds())
		if err != nil || tag.RowsAffected() == 0 {
			return err
		}
		done = true
		return loseSandboxes(ctx, tx, name)
	})
	return done, err
}

// loseSandboxes orphans the node's durable paused sandboxes and marks the
// rest lost.
func loseSandboxes(ctx context.Context, tx pgx.Tx, node string) error {
	_, err := tx.Exec(ctx, `UPDATE sandboxes SET node = $2 WHERE node = $1 AND status = $3 AND spec->>$4 IS NOT NULL`,
		node, store.Orphan, store.SandboxPaused, store.DurableKey)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `UPDATE sandboxes SET status = $2 WHERE node = $1`, node, store.SandboxLost)
	return err
}

// RemoveNode marks a node removed and its sandboxes lost.
func (s *Store) RemoveNode(ctx context.Context, name string) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE nodes SET gone = $2 WHERE name = $1`, name, store.NodeRemoved)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return store.NodeNotFound(name)
		}
		return loseSandboxes(ctx, tx, name)
	})
}

// lockNode locks f's node row for the transaction and checks that f is
// current.
func lockNode(ctx context.Context, tx pgx.Tx, f store.Fence) error {
	var inc int64
	var gone string
	err := tx.QueryRow(ctx, `SELECT incarnation, gone FROM nodes WHERE name = $1 FOR NO KEY UPDATE`, f.Node).Scan(&inc, &gone)
	if errors.Is(err, pgx.ErrNoRows) || err == nil && (inc != f.Incarnation || gone != "") {
		return store.Fenced(f)
	}
	return err
}

// PutSandboxFenced writes sb on f's node, admitting it cluster-wide.
func (s *Store) PutSandboxFenced(ctx context.Context, f store.Fence, sb store.Sandbox, admit *store.Admission) error {
	sb.Node = f.Node
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := lockNode(ctx, tx, f); err != nil {
			return err
		}
		rows, _ := tx.Query(ctx, `SELECT `+sandboxColumns+` FROM sandboxes WHERE id = $1 FOR UPDATE`, sb.ID)
		got, err := collect(rows, scanSandbox)
		if err != nil {
			return err
		}
		old, err := store.OldRow(got, f)
		if err != nil {
			return err
		}
		if admit != nil {
			if need := admit.Need(old, sb); need != (store.Usage{}) {
				if _, err := tx.Exec(ctx, `SELECT 1 FROM projects WHERE id = $1 FOR NO KEY UPDATE`, sb.ProjectID); err != nil {
					return err
				}
				node, err := usage(ctx, tx, admit, `node = $2`, sb.ID, f.Node)
				if err != nil {
					return err
				}
				proj, err := usage(ctx, tx, admit, `project_id = $2`, sb.ID, sb.ProjectID)
				if err != nil {
					return err
				}
				if err := admit.Check(node, proj, need); err != nil {
					return err
				}
			}
		}
		if old != nil && old.Node == store.Orphan {
			if _, err := tx.Exec(ctx, `UPDATE sandboxes SET node = $2 WHERE id = $1`, sb.ID, f.Node); err != nil {
				return err
			}
		}
		_, err = tx.Exec(ctx, upsertSandbox, sandboxArgs(sb)...)
		return err
	})
}

// usage sums what the live rows matching where (with $2) hold, but the
// row of id ($1).
func usage(ctx context.Context, tx pgx.Tx, a *store.Admission, where, id, arg string) (store.Usage, error) {
	var u store.Usage
	err := tx.QueryRow(ctx, `SELECT count(*), coalesce(sum(cpus) FILTER (WHERE status = ANY($3)), 0),
			coalesce(sum(memory_mb) FILTER (WHERE status = ANY($3)), 0)
		FROM sandboxes WHERE id <> $1 AND status <> $4 AND `+where, id, arg, a.Holding, store.SandboxLost).
		Scan(&u.Sandboxes, &u.VCPUs, &u.MemoryMB)
	return u, err
}

// DeleteSandboxFenced removes a sandbox row of f's node.
func (s *Store) DeleteSandboxFenced(ctx context.Context, f store.Fence, id string) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := lockNode(ctx, tx, f); err != nil {
			return err
		}
		var node string
		err := tx.QueryRow(ctx, `DELETE FROM sandboxes WHERE id = $1 RETURNING node`, id).Scan(&node)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return nil
		case err != nil:
			return err
		case node != f.Node:
			return store.SandboxElsewhere(id, node) // rolls the delete back
		}
		return nil
	})
}

// SandboxesOn lists one node's sandbox rows, lost ones included.
func (s *Store) SandboxesOn(ctx context.Context, node string) ([]store.Sandbox, error) {
	rows, _ := s.pool.Query(ctx, `SELECT `+sandboxColumns+` FROM sandboxes WHERE node = $1`, node)
	return collect(rows, scanSandbox)
}

// SandboxOwner says which node holds a sandbox.
func (s *Store) SandboxOwner(ctx context.Context, id string) (store.Owner, error) {
	var o store.Owner
	err := s.pool.QueryRow(ctx, `SELECT node, project_id, status, template FROM sandboxes WHERE id = $1`, id).Scan(&o.Node, &o.ProjectID, &o.Status, &o.Template)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Owner{}, store.SandboxNotFound(id)
	}
	o.Lost = o.Status == store.SandboxLost
	return o, err
}
