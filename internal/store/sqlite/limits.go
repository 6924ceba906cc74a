package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"

	"github.com/lizard-build/lizard/internal/store"
)

// SetProjectLimit sets one of a project's limits (value >= 0, 0 = no
// limit); nil goes back to the server's default.
func (s *Store) SetProjectLimit(ctx context.Context, projectID string, l store.Limit, value *int) error {
	col, err := store.LimitColumn(l, value)
	if err != nil {
		return err
	}
	// col comes from a fixed set, never from the caller.
	_, err = s.db.ExecContext(ctx, `INSERT INTO project_limits(project_id, `+col+`) VALUES(?, ?)
		ON CONFLICT(project_id) DO UPDATE SET `+col+` = excluded.`+col, projectID, value)
	return err
}

// ProjectOverrides returns the limits a project has of its own.
func (s *Store) ProjectOverrides(ctx context.Context, projectID string) (store.Overrides, error) {
	v := make([]sql.NullInt64, len(store.AllLimits))
	dst := make([]any, len(v))
	for i := range v {
		dst[i] = &v[i]
	}
	err := s.db.QueryRowContext(ctx, `SELECT `+store.LimitColumns+` FROM project_limits WHERE project_id = ?`, projectID).Scan(dst...)
	out := store.Overrides{}
	if errors.Is(err, sql.ErrNoRows) {
		return out, nil
	}
	if err != nil {
		return nil, err
	}
	for i, l := range store.AllLimits {
		if v[i].Valid {
			out[l] = int(v[i].Int64)
		}
	}
	return out, nil
}

// SetDefaultLimits records the server's default limits.
func (s *Store) SetDefaultLimits(ctx context.Context, ls store.Limits) error {
	b, err := json.Marshal(ls)
	if err != nil {
		return err
	}
	_, err = s.db.ExecContext(ctx, `INSERT INTO settings(key, value) VALUES(?, ?)
		ON CONFLICT(key) DO UPDATE SET value = excluded.value`, store.DefaultLimitsKey, string(b))
	return err
}

// DefaultLimits returns what SetDefaultLimits recorded.
func (s *Store) DefaultLimits(ctx context.Context) (ls store.Limits, ok bool, err error) {
	var v string
	err = s.db.QueryRowContext(ctx, `SELECT value FROM settings WHERE key = ?`, store.DefaultLimitsKey).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return store.Limits{}, false, nil
	}
	if err != nil {
		return store.Limits{}, false, err
	}
	return ls, true, json.Unmarshal([]byte(v), &ls)
}
