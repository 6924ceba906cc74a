package postgres

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lizard-build/lizard/internal/store"
)

// CreateKey makes an API key for a project and returns its secret, which is
// stored only as a hash. A non-empty secret is used as given.
func (s *Store) CreateKey(ctx context.Context, projectID, secret string) (string, error) {
	_, secret, err := s.NewKey(ctx, projectID, secret)
	return secret, err
}

// NewKey is CreateKey that also returns the key as listed.
func (s *Store) NewKey(ctx context.Context, projectID, secret string) (store.Key, string, error) {
	k, err := store.MakeKey(secret)
	if err != nil {
		return store.Key{}, "", err
	}
	key := store.Key{ID: k.ID, ProjectID: projectID, Prefix: k.Prefix}
	err = s.keyChange(ctx, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `INSERT INTO api_keys(id, project_id, hash, prefix) VALUES($1, $2, $3, $4) RETURNING created_at`,
			k.ID, projectID, k.Hash, k.Prefix).Scan(&key.CreatedAt)
	})
	if isUnique(err) {
		return store.Key{}, "", store.KeyExists()
	}
	if err != nil {
		return store.Key{}, "", err
	}
	key.CreatedAt = key.CreatedAt.UTC()
	return key, k.Secret, nil
}

// RevokeKey revokes a key by id. Revoking a revoked key is a no-op; an
// unknown id is ErrNotFound.
func (s *Store) RevokeKey(ctx context.Context, id string) error {
	return s.keyChange(ctx, func(tx pgx.Tx) error {
		var revoked *time.Time
		err := tx.QueryRow(ctx, `SELECT revoked_at FROM api_keys WHERE id = $1 FOR UPDATE`, id).Scan(&revoked)
		if errors.Is(err, pgx.ErrNoRows) {
			return store.KeyNotFound(id)
		}
		if err != nil || revoked != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE api_keys SET revoked_at = now() WHERE id = $1`, id)
		return err
	})
}

// keyChange runs f and bumps the key generation in one transaction.
func (s *Store) keyChange(ctx context.Context, f func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := f(tx); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE key_generation SET n = n + 1 WHERE one = 1`)
		return err
	})
}

// KeyGeneration is a number that changes whenever a key is created or
// revoked, by any server or CLI on the database.
func (s *Store) KeyGeneration(ctx context.Context) (int64, error) {
	var n int64
	err := s.pool.QueryRow(ctx, `SELECT n FROM key_generation WHERE one = 1`).Scan(&n)
	return n, err
}

// ActiveKeys lists every key that is not revoked, with its project.
func (s *Store) ActiveKeys(ctx context.Context) ([]store.ActiveKey, error) {
	rows, _ := s.pool.Query(ctx, `SELECT k.id, k.hash, p.id, p.slug, p.name FROM api_keys k JOIN projects p ON p.id = k.project_id WHERE k.revoked_at IS NULL`)
	return collect(rows, func(r pgx.CollectableRow) (k store.ActiveKey, err error) {
		err = r.Scan(&k.ID, &k.Hash, &k.Project.ID, &k.Project.Slug, &k.Project.Name)
		return k, err
	})
}

// Keys lists a project's keys, revoked ones included, oldest first.
func (s *Store) Keys(ctx context.Context, projectID string) ([]store.Key, error) {
	rows, _ := s.pool.Query(ctx, `SELECT id, project_id, prefix, created_at, last_used_at, revoked_at FROM api_keys WHERE project_id = $1 ORDER BY created_at, id`, projectID)
	return collect(rows, func(r pgx.CollectableRow) (k store.Key, err error) {
		err = r.Scan(&k.ID, &k.ProjectID, &k.Prefix, &k.CreatedAt, &k.LastUsed, &k.RevokedAt)
		k.CreatedAt, k.LastUsed, k.RevokedAt = k.CreatedAt.UTC(), utcPtr(k.LastUsed), utcPtr(k.RevokedAt)
		return k, err
	})
}

// TouchKeys records when keys were last used, in one statement: the server
// calls it with what it gathered in memory since the last call.
func (s *Store) TouchKeys(ctx context.Context, used map[string]time.Time) error {
	if len(used) == 0 {
		return nil
	}
	ids := make([]string, 0, len(used))
	times := make([]time.Time, 0, len(used))
	for id, t := range used {
		ids, times = append(ids, id), append(times, t)
	}
	_, err := s.pool.Exec(ctx, `UPDATE api_keys k SET last_used_at = u.t
		FROM unnest($1::text[], $2::timestamptz[]) AS u(id, t) WHERE k.id = u.id`, ids, times)
	return err
}
