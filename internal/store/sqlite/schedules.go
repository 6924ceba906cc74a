package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/lizard-build/lizard/internal/store"
)

var _ store.Schedules = (*Store)(nil)

// Schedule times are kept in a fixed-width form, so that the text compares
// as the times do (RFC 3339 with a variable fraction does not).
const fixedTime = "2006-01-02T15:04:05.000000000Z"

func fixTime(t time.Time) string { return t.UTC().Format(fixedTime) }

func fixTimePtr(t *time.Time) any {
	if t == nil {
		return nil
	}
	return fixTime(*t)
}

const scheduleColumns = `id, project_id, sandbox_id, spec, enabled, disabled_reason, next_run_at, run_requested, last_run_at,
	last_status, consecutive_failures, skipped_count, created_at,
	EXISTS (SELECT 1 FROM schedule_runs r WHERE r.schedule_id = schedules.id AND r.status = 'running')`

func scanSchedule(rows *sql.Rows) (store.Schedule, error) {
	var sc store.Schedule
	var spec, created string
	var next, req, last sql.NullString
	err := rows.Scan(&sc.ID, &sc.ProjectID, &sc.SandboxID, &spec, &sc.Enabled, &sc.DisabledReason, &next, &req, &last,
		&sc.LastStatus, &sc.ConsecutiveFailures, &sc.SkippedCount, &created, &sc.Running)
	sc.Spec = []byte(spec)
	sc.NextRunAt, sc.RunRequested, sc.LastRunAt = parseTimePtr(next), parseTimePtr(req), parseTimePtr(last)
	sc.CreatedAt, _ = time.Parse(time.RFC3339Nano, created)
	return sc, err
}

func querySchedules(ctx context.Context, q interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, where string, args ...any) ([]store.Schedule, error) {
	rows, err := q.QueryContext(ctx, `SELECT `+scheduleColumns+` FROM schedules `+where+` ORDER BY created_at, id`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []store.Schedule{}
	for rows.Next() {
		sc, err := scanSchedule(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, sc)
	}
	return out, rows.Err()
}

// InsertSchedule adds a schedule within its quotas.
func (s *Store) InsertSchedule(ctx context.Context, sc store.Schedule, perSandbox, perProject int) error {
	return s.inTx(ctx, func(tx *sql.Tx) error {
		var project string
		err := tx.QueryRowContext(ctx, `SELECT project_id FROM sandboxes WHERE id = ?`, sc.SandboxID).Scan(&project)
		if errors.Is(err, sql.ErrNoRows) || err == nil && project != sc.ProjectID {
			return store.SandboxNotFound(sc.SandboxID)
		}
		if err != nil {
			return err
		}
		var n, m int
		if err := tx.QueryRowContext(ctx, `SELECT count(*) FILTER (WHERE sandbox_id = ?), count(*) FROM schedules WHERE project_id = ?`,
			sc.SandboxID, sc.ProjectID).Scan(&n, &m); err != nil {
			return err
		}
		if err := store.ScheduleQuota(n, perSandbox, m, perProject); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO schedules(id, project_id, sandbox_id, spec, enabled, disabled_reason, next_run_at,
				consecutive_failures, created_at) VALUES(?,?,?,?,?,?,?,?,?)`,
			sc.ID, sc.ProjectID, sc.SandboxID, string(sc.Spec), sc.Enabled, sc.DisabledReason, fixTimePtr(sc.NextRunAt),
			sc.ConsecutiveFailures, fixTime(sc.CreatedAt))
		return err
	})
}

// SetSchedule replaces a schedule's settings.
func (s *Store) SetSchedule(ctx context.Context, sc store.Schedule) error {
	res, err := s.db.ExecContext(ctx, `UPDATE schedules SET spec = ?, enabled = ?, disabled_reason = ?, next_run_at = ?,
			consecutive_failures = ? WHERE id = ?`,
		string(sc.Spec), sc.Enabled, sc.DisabledReason, fixTimePtr(sc.NextRunAt), sc.ConsecutiveFailures, sc.ID)
	return oneRow(res, err, sc.ID)
}

// oneRow turns an update that changed no row into ErrNotFound.
func oneRow(res sql.Result, err error, id string) error {
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return errors.Join(err, store.ScheduleNotFound(id))
	}
	return nil
}

// RequestRun asks for a run now.
func (s *Store) RequestRun(ctx context.Context, id string, at time.Time) error {
	res, err := s.db.ExecContext(ctx, `UPDATE schedules SET run_requested = ?, disabled_reason = '', consecutive_failures = CASE WHEN enabled THEN consecutive_failures ELSE 0 END, enabled = 1 WHERE id = ?`, fixTime(at), id)
	return oneRow(res, err, id)
}

// Schedule returns one schedule.
func (s *Store) Schedule(ctx context.Context, id string) (store.Schedule, error) {
	l, err := querySchedules(ctx, s.db, `WHERE id = ?`, id)
	if err != nil {
		return store.Schedule{}, err
	}
	if len(l) == 0 {
		return store.Schedule{}, store.ScheduleNotFound(id)
	}
	return l[0], nil
}

// Schedules lists a project's schedules, or one sandbox's.
func (s *Store) Schedules(ctx context.Context, projectID, sandboxID string) ([]store.Schedule, error) {
	return querySchedules(ctx, s.db, `WHERE (? = '' OR project_id = ?) AND (? = '' OR sandbox_id = ?)`,
		projectID, projectID, sandboxID, sandboxID)
}

// DeleteSchedule removes a schedule and its runs.
func (s *Store) DeleteSchedule(ctx context.Context, id string) error {
	_, err := s.db.ExecContext(ctx, `DELETE FROM schedules WHERE id = ?`, id)
	return err
}

// DueSchedules lists the schedules due at now.
func (s *Store) DueSchedules(ctx context.Context, now time.Time) ([]store.Schedule, error) {
	return querySchedules(ctx, s.db, `WHERE enabled = 1 AND (next_run_at <= ? OR run_requested IS NOT NULL)`, fixTime(now))
}

// ClaimRun claims one due time of a schedule.
func (s *Store) ClaimRun(ctx context.Context, c store.RunClaim) (result store.ClaimResult, err error) {
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		if err := s.fenceSchedule(ctx, tx, c.Fence, c.Run.SandboxID); err != nil {
			return err
		}
		var running bool
		if err := tx.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM schedule_runs WHERE schedule_id = ? AND status = 'running')`,
			c.Run.ScheduleID).Scan(&running); err != nil {
			return err
		}
		skipped := c.Missed
		if running {
			skipped++
		}
		var res sql.Result
		var err error
		if c.Requested {
			res, err = tx.ExecContext(ctx, `UPDATE schedules SET run_requested = NULL, skipped_count = skipped_count + ?
				WHERE id = ? AND enabled = 1 AND run_requested = ?`, skipped, c.Run.ScheduleID, fixTime(c.Due))
		} else {
			res, err = tx.ExecContext(ctx, `UPDATE schedules SET next_run_at = ?, skipped_count = skipped_count + ?
				WHERE id = ? AND enabled = 1 AND next_run_at = ?`, fixTime(c.Next), skipped, c.Run.ScheduleID, fixTime(c.Due))
		}
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			result = store.ClaimLost
			return err
		}
		if running {
			result = store.ClaimOverlapped
			return nil
		}
		r := c.Run
		if _, err := tx.ExecContext(ctx, `INSERT INTO schedule_runs(id, schedule_id, sandbox_id, project_id, node, due_at, status, woke,
				slept, started_at) VALUES(?,?,?,?,?,?,?,?,?,?)`,
			r.ID, r.ScheduleID, r.SandboxID, r.ProjectID, r.Node, fixTime(c.Due), r.Status, r.Woke, r.Slept, fixTime(r.StartedAt)); err != nil {
			if isUnique(err) {
				result = store.ClaimLost
				return errRollback
			}
			return err
		}
		result = store.Claimed
		return nil
	})
	if errors.Is(err, errRollback) {
		err = nil
	}
	return result, err
}

// errRollback rolls a transaction back without it being an error.
var errRollback = errors.New("rollback")

// fenceSchedule checks, with f set, that f is current and the sandbox is
// on its node.
func (s *Store) fenceSchedule(ctx context.Context, tx *sql.Tx, f *store.Fence, sandboxID string) error {
	if f == nil {
		return nil
	}
	if err := checkFence(ctx, tx, *f); err != nil {
		return err
	}
	var node string
	err := tx.QueryRowContext(ctx, `SELECT node FROM sandboxes WHERE id = ?`, sandboxID).Scan(&node)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return store.SandboxNotFound(sandboxID)
	case err != nil:
		return err
	case node != f.Node:
		return store.SandboxElsewhere(sandboxID, node)
	}
	return nil
}

// UpdateRun records a run's progress or end.
func (s *Store) UpdateRun(ctx context.Context, f *store.Fence, r store.ScheduleRun, end *store.RunEnd) error {
	return s.inTx(ctx, func(tx *sql.Tx) error {
		if err := s.fenceSchedule(ctx, tx, f, r.SandboxID); err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, `UPDATE schedule_runs SET status = ?, woke = ?, slept = ?, ended_at = ?, exit_code = ?,
				output = ?, error = ?, duration_ms = ? WHERE id = ?`,
			r.Status, r.Woke, r.Slept, fixTimePtr(r.EndedAt), r.ExitCode, r.Output, r.Error, r.DurationMs, r.ID)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 || end == nil {
			return err
		}
		last := r.StartedAt
		if _, err := tx.ExecContext(ctx, `UPDATE schedules SET last_run_at = ?, last_status = ?,
				consecutive_failures = CASE WHEN ? THEN consecutive_failures + 1 ELSE 0 END WHERE id = ?`,
			fixTime(last), r.Status, end.Failed, r.ScheduleID); err != nil {
			return err
		}
		if end.Failed && end.DisableAfter > 0 {
			if _, err := tx.ExecContext(ctx, `UPDATE schedules SET enabled = 0, disabled_reason = ?, next_run_at = NULL
					WHERE id = ? AND enabled = 1 AND consecutive_failures >= ?`, end.DisabledReason, r.ScheduleID, end.DisableAfter); err != nil {
				return err
			}
		}
		_, err = tx.ExecContext(ctx, `DELETE FROM schedule_runs WHERE schedule_id = ? AND id NOT IN
				(SELECT id FROM schedule_runs WHERE schedule_id = ? ORDER BY started_at DESC, id DESC LIMIT ?)`,
			r.ScheduleID, r.ScheduleID, store.KeptRuns)
		return err
	})
}

const runColumns = `id, schedule_id, sandbox_id, project_id, node, due_at, status, woke, slept, started_at, ended_at, exit_code,
	output, error, duration_ms`

func queryRuns(ctx context.Context, q interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, query string, args ...any) ([]store.ScheduleRun, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []store.ScheduleRun{}
	for rows.Next() {
		var r store.ScheduleRun
		var due, started string
		var ended sql.NullString
		var exit, dur sql.NullInt64
		if err := rows.Scan(&r.ID, &r.ScheduleID, &r.SandboxID, &r.ProjectID, &r.Node, &due, &r.Status, &r.Woke, &r.Slept,
			&started, &ended, &exit, &r.Output, &r.Error, &dur); err != nil {
			return nil, err
		}
		r.Due, _ = time.Parse(time.RFC3339Nano, due)
		r.StartedAt, _ = time.Parse(time.RFC3339Nano, started)
		r.EndedAt = parseTimePtr(ended)
		if exit.Valid {
			v := int(exit.Int64)
			r.ExitCode = &v
		}
		if dur.Valid {
			r.DurationMs = &dur.Int64
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// Runs lists a schedule's last runs, newest first.
func (s *Store) Runs(ctx context.Context, scheduleID string, limit int) ([]store.ScheduleRun, error) {
	return queryRuns(ctx, s.db, `SELECT `+runColumns+` FROM schedule_runs WHERE schedule_id = ? ORDER BY started_at DESC, id DESC LIMIT ?`,
		scheduleID, limit)
}

// InterruptRuns ends the runs still running on node.
func (s *Store) InterruptRuns(ctx context.Context, node string, at time.Time) (out []store.ScheduleRun, err error) {
	err = s.inTx(ctx, func(tx *sql.Tx) error {
		if out, err = queryRuns(ctx, tx, `SELECT `+runColumns+` FROM schedule_runs WHERE status = 'running' AND node = ?`, node); err != nil {
			return err
		}
		for i := range out {
			r := &out[i]
			store.Interrupt(r, at)
			if _, err := tx.ExecContext(ctx, `UPDATE schedule_runs SET status = ?, ended_at = ?, duration_ms = ?, error = ? WHERE id = ?`,
				r.Status, fixTime(at), r.DurationMs, r.Error, r.ID); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, `UPDATE schedules SET last_run_at = ?, last_status = ? WHERE id = ?`,
				fixTime(r.StartedAt), r.Status, r.ScheduleID); err != nil {
				return err
			}
		}
		return nil
	})
	return out, err
}
