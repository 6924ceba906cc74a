package postgres

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lizard-build/lizard/internal/store"
)

var _ store.Schedules = (*Store)(nil)

const scheduleColumns = `id, project_id, sandbox_id, spec::text, enabled, disabled_reason, next_run_at, run_requested, last_run_at,
	last_status, consecutive_failures, skipped_count, created_at,
	EXISTS (SELECT 1 FROM schedule_runs r WHERE r.schedule_id = schedules.id AND r.status = 'running')`

func scanSchedule(r pgx.CollectableRow) (sc store.Schedule, err error) {
	var spec string
	err = r.Scan(&sc.ID, &sc.ProjectID, &sc.SandboxID, &spec, &sc.Enabled, &sc.DisabledReason, &sc.NextRunAt, &sc.RunRequested,
		&sc.LastRunAt, &sc.LastStatus, &sc.ConsecutiveFailures, &sc.SkippedCount, &sc.CreatedAt, &sc.Running)
	sc.Spec = []byte(spec)
	sc.NextRunAt, sc.RunRequested, sc.LastRunAt, sc.CreatedAt = utcPtr(sc.NextRunAt), utcPtr(sc.RunRequested), utcPtr(sc.LastRunAt), sc.CreatedAt.UTC()
	return sc, err
}

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

func querySchedules(ctx context.Context, q querier, where string, args ...any) ([]store.Schedule, error) {
	rows, _ := q.Query(ctx, `SELECT `+scheduleColumns+` FROM schedules `+where+` ORDER BY created_at, id`, args...)
	return collect(rows, scanSchedule)
}

// InsertSchedule adds a schedule within its quotas.
func (s *Store) InsertSchedule(ctx context.Context, sc store.Schedule, perSandbox, perProject int) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// The project row's lock orders the inserts of one project, so
		// that two at once cannot both pass the quota.
		if _, err := tx.Exec(ctx, `SELECT 1 FROM projects WHERE id = $1 FOR NO KEY UPDATE`, sc.ProjectID); err != nil {
			return err
		}
		var project string
		err := tx.QueryRow(ctx, `SELECT project_id FROM sandboxes WHERE id = $1`, sc.SandboxID).Scan(&project)
		if errors.Is(err, pgx.ErrNoRows) || err == nil && project != sc.ProjectID {
			return store.SandboxNotFound(sc.SandboxID)
		}
		if err != nil {
			return err
		}
		var n, m int
		if err := tx.QueryRow(ctx, `SELECT count(*) FILTER (WHERE sandbox_id = $1), count(*) FROM schedules WHERE project_id = $2`,
			sc.SandboxID, sc.ProjectID).Scan(&n, &m); err != nil {
			return err
		}
		if err := store.ScheduleQuota(n, perSandbox, m, perProject); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO schedules(id, project_id, sandbox_id, spec, enabled, disabled_reason, next_run_at,
				consecutive_failures, created_at) VALUES($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
			sc.ID, sc.ProjectID, sc.SandboxID, string(sc.Spec), sc.Enabled, sc.DisabledReason, sc.NextRunAt, sc.ConsecutiveFailures, sc.CreatedAt)
		return err
	})
}

// SetSchedule replaces a schedule's settings.
func (s *Store) SetSchedule(ctx context.Context, sc store.Schedule) error {
	tag, err := s.pool.Exec(ctx, `UPDATE schedules SET spec = $1, enabled = $2, disabled_reason = $3, next_run_at = $4,
			consecutive_failures = $5 WHERE id = $6`,
		string(sc.Spec), sc.Enabled, sc.DisabledReason, sc.NextRunAt, sc.ConsecutiveFailures, sc.ID)
	if err == nil && tag.RowsAffected() == 0 {
		return store.ScheduleNotFound(sc.ID)
	}
	return err
}

// RequestRun asks for a run now.
func (s *Store) RequestRun(ctx context.Context, id string, at time.Time) error {
	tag, err := s.pool.Exec(ctx, `UPDATE schedules SET run_requested = $1, disabled_reason = '', consecutive_failures = CASE WHEN enabled THEN consecutive_failures ELSE 0 END, enabled = true WHERE id = $2`, at, id)
	if err == nil && tag.RowsAffected() == 0 {
		return store.ScheduleNotFound(id)
	}
	return err
}

// Schedule returns one schedule.
func (s *Store) Schedule(ctx context.Context, id string) (store.Schedule, error) {
	l, err := querySchedules(ctx, s.pool, `WHERE id = $1`, id)
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
	return querySchedules(ctx, s.pool, `WHERE ($1 = '' OR project_id = $1) AND ($2 = '' OR sandbox_id = $2)`, projectID, sandboxID)
}

// DeleteSchedule removes a schedule and its runs.
func (s *Store) DeleteSchedule(ctx context.Context, id string) error {
	_, err := s.pool.Exec(ctx, `DELETE FROM schedules WHERE id = $1`, id)
	return err
}

// DueSchedules lists the schedules due at now.
func (s *Store) DueSchedules(ctx context.Context, now time.Time) ([]store.Schedule, error) {
	return querySchedules(ctx, s.pool, `WHERE enabled AND (next_run_at <= $1 OR run_requested IS NOT NULL)`, now)
}

// ClaimRun claims one due time of a schedule.
func (s *Store) ClaimRun(ctx context.Context, c store.RunClaim) (result store.ClaimResult, err error) {
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := fenceSchedule(ctx, tx, c.Fence, c.Run.SandboxID); err != nil {
			return err
		}
		// The update locks the schedule's row: a second claim of the
		// same due time waits, then finds it changed.
		var tag interface{ RowsAffected() int64 }
		var err error
		if c.Requested {
			tag, err = tx.Exec(ctx, `UPDATE schedules SET run_requested = NULL, skipped_count = skipped_count + $1
				WHERE id = $2 AND enabled AND run_requested = $3`, c.Missed, c.Run.ScheduleID, c.Due)
		} else {
			tag, err = tx.Exec(ctx, `UPDATE schedules SET next_run_at = $1, skipped_count = skipped_count + $2
				WHERE id = $3 AND enabled AND next_run_at = $4`, c.Next, c.Missed, c.Run.ScheduleID, c.Due)
		}
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			result = store.ClaimLost
			return nil
		}
		var running bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM schedule_runs WHERE schedule_id = $1 AND status = 'running')`,
			c.Run.ScheduleID).Scan(&running); err != nil {
			return err
		}
		if running {
			result = store.ClaimOverlapped
			_, err := tx.Exec(ctx, `UPDATE schedules SET skipped_count = skipped_count + 1 WHERE id = $1`, c.Run.ScheduleID)
			return err
		}
		r := c.Run
		tag, err = tx.Exec(ctx, `INSERT INTO schedule_runs(id, schedule_id, sandbox_id, project_id, node, due_at, status, woke,
				slept, started_at) VALUES($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT (schedule_id, due_at) DO NOTHING`,
			r.ID, r.ScheduleID, r.SandboxID, r.ProjectID, r.Node, c.Due, r.Status, r.Woke, r.Slept, r.StartedAt)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 { // this due time ran already
			result = store.ClaimLost
			return errRollback
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
func fenceSchedule(ctx context.Context, tx pgx.Tx, f *store.Fence, sandboxID string) error {
	if f == nil {
		return nil
	}
	if err := lockNode(ctx, tx, *f); err != nil {
		return err
	}
	var node string
	err := tx.QueryRow(ctx, `SELECT node FROM sandboxes WHERE id = $1`, sandboxID).Scan(&node)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
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
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := fenceSchedule(ctx, tx, f, r.SandboxID); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `UPDATE schedule_runs SET status = $1, woke = $2, slept = $3, ended_at = $4, exit_code = $5,
				output = $6, error = $7, duration_ms = $8 WHERE id = $9`,
			r.Status, r.Woke, r.Slept, r.EndedAt, r.ExitCode, r.Output, r.Error, r.DurationMs, r.ID)
		if err != nil || tag.RowsAffected() == 0 || end == nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE schedules SET last_run_at = $1, last_status = $2,
				consecutive_failures = CASE WHEN $3 THEN consecutive_failures + 1 ELSE 0 END WHERE id = $4`,
			r.StartedAt, r.Status, end.Failed, r.ScheduleID); err != nil {
			return err
		}
		if end.Failed && end.DisableAfter > 0 {
			if _, err := tx.Exec(ctx, `UPDATE schedules SET enabled = false, disabled_reason = $1, next_run_at = NULL
					WHERE id = $2 AND enabled AND consecutive_failures >= $3`, end.DisabledReason, r.ScheduleID, end.DisableAfter); err != nil {
				return err
			}
		}
		_, err = tx.Exec(ctx, `DELETE FROM schedule_runs WHERE schedule_id = $1 AND id NOT IN
				(SELECT id FROM schedule_runs WHERE schedule_id = $1 ORDER BY started_at DESC, id DESC LIMIT $2)`,
			r.ScheduleID, store.KeptRuns)
		return err
	})
}

const runColumns = `id, schedule_id, sandbox_id, project_id, node, due_at, status, woke, slept, started_at, ended_at, exit_code,
	output, error, duration_ms`

func scanRun(row pgx.CollectableRow) (r store.ScheduleRun, err error) {
	err = row.Scan(&r.ID, &r.ScheduleID, &r.SandboxID, &r.ProjectID, &r.Node, &r.Due, &r.Status, &r.Woke, &r.Slept,
		&r.StartedAt, &r.EndedAt, &r.ExitCode, &r.Output, &r.Error, &r.DurationMs)
	r.Due, r.StartedAt, r.EndedAt = r.Due.UTC(), r.StartedAt.UTC(), utcPtr(r.EndedAt)
	return r, err
}

// Runs lists a schedule's last runs, newest first.
func (s *Store) Runs(ctx context.Context, scheduleID string, limit int) ([]store.ScheduleRun, error) {
	rows, _ := s.pool.Query(ctx, `SELECT `+runColumns+` FROM schedule_runs WHERE schedule_id = $1 ORDER BY started_at DESC, id DESC LIMIT $2`,
		scheduleID, limit)
	return collect(rows, scanRun)
}

// InterruptRuns ends the runs still running on node.
func (s *Store) InterruptRuns(ctx context.Context, node string, at time.Time) (out []store.ScheduleRun, err error) {
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		rows, _ := tx.Query(ctx, `SELECT `+runColumns+` FROM schedule_runs WHERE status = 'running' AND node = $1 FOR UPDATE`, node)
		if out, err = collect(rows, scanRun); err != nil {
			return err
		}
		for i := range out {
			r := &out[i]
			store.Interrupt(r, at)
			if _, err := tx.Exec(ctx, `UPDATE schedule_runs SET status = $1, ended_at = $2, duration_ms = $3, error = $4 WHERE id = $5`,
				r.Status, at, r.DurationMs, r.Error, r.ID); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `UPDATE schedules SET last_run_at = $1, last_status = $2 WHERE id = $3`,
				r.StartedAt, r.Status, r.ScheduleID); err != nil {
				return err
			}
		}
		return nil
	})
	return out, err
}
