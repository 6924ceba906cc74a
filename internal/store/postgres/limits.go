package postgres

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/jackc/pgx/v5"

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
	_, err = s.pool.Exec(ctx, `INSERT INTO project_limits(project_id, `+col+`) VALUES($1, $2)
		ON CONFLICT(project_id) DO UPDATE SET `+col+` = excluded.`+col, projectID, value)
	return err
}

// ProjectOverrides returns the limits a project has of its own.
func (s *Store) ProjectOverrides(ctx context.Context, projectID string) (store.Overrides, error) {
	v := make([]*int, len(store.AllLimits))
	dst := make([]any, len(v))
	for i := range v {
		dst[i] = &v[i]
	}
	err := s.pool.QueryRow(ctx, `SELECT `+store.LimitColumns+` FROM project_limits WHERE project_id = $1`, projectID).Scan(dst...)
	out := store.Overrides{}
	if errors.Is(err, pgx.ErrNoRows) {
		return out, nil
	}
	if err != nil {
		return nil, err
	}
	for i, l := range store.AllLimits {
		if v[i] != nil {
			out[l] = *v[i]
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
	_, err = s.pool.Exec(ctx, `INSERT INTO settings(key, value) VALUES($1, $2)
		ON CONFLICT(key) DO UPDATE SET value = excluded.value`, store.DefaultLimitsKey, string(b))
	return err
}

// DefaultLimits returns what SetDefaultLimits recorded.
func (s *Store) DefaultLimits(ctx context.Context) (ls store.Limits, ok bool, err error) {
	var v string
	err = s.pool.QueryRow(ctx, `SELECT value::text FROM settings WHERE key = $1`, store.DefaultLimitsKey).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Limits{}, false, nil
	}
	if err != nil {
		return store.Limits{}, false, err
	}
	return ls, true, json.Unmarshal([]byte(v), &ls)
}
