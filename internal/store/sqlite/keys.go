package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/lizard-build/lizard/internal/store"
)

// keysSchema is what the key functions need beyond the first api_keys
// table: when a key was last used and revoked, and a generation that every
// create and revoke bumps, so that a server polls one row to learn that its
// in-memory view of the keys is stale. All of it is added to an existing
// database in place (migrateKeys); older rows keep working.
const keysSchema = `
CREATE TABLE IF NOT EXISTS key_generation (
	one INTEGER PRIMARY KEY CHECK (one = 1),
	n   INTEGER NOT NULL
);
INSERT OR IGNORE INTO key_generation(one, n) VALUES(1, 0);
`

// migrateKeys adds the columns and table of keysSchema to a database made
// before them, and gives an id to any key row without one.
func migrateKeys(db *sql.DB) error {
	names, err := column[string](db.Query(`SELECT name FROM pragma_table_info('api_keys')`))
	if err != nil {
		return err
	}
	cols := map[string]bool{}
	for _, n := range names {
		cols[n] = true
	}
	tx, err := db.Begin()
	if err != nil {
		return err
	}
	defer tx.Rollback()
	for _, c := range []string{"last_used_at", "revoked_at"} {
		if !cols[c] {
			if _, err := tx.Exec(`ALTER TABLE api_keys ADD COLUMN ` + c + ` TEXT`); err != nil {
				return fmt.Errorf("api_keys: add %s: %w", c, err)
			}
		}
	}
	if _, err := tx.Exec(keysSchema); err != nil {
		return err
	}
	// A TEXT PRIMARY KEY may hold NULL in SQLite: such rows get an id.
	missing, err := column[int64](tx.Query(`SELECT rowid FROM api_keys WHERE id IS NULL OR id = ''`))
	if err != nil {
		return err
	}
	for _, rowid := range missing {
		if _, err := tx.Exec(`UPDATE api_keys SET id = ? WHERE rowid = ?`, store.NewID("key_", 16), rowid); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// column reads the one column of a query's rows.
func column[T any](rows *sql.Rows, err error) ([]T, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		var v T
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

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
	created := time.Now().UTC()
	err = s.keyChange(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO api_keys(id, project_id, hash, prefix, created_at) VALUES(?,?,?,?,?)`,
			k.ID, projectID, k.Hash, k.Prefix, fmtTime(created))
		return err
	})
	if err != nil {
		if isUnique(err) {
			return store.Key{}, "", store.KeyExists()
		}
		return store.Key{}, "", err
	}
	return store.Key{ID: k.ID, ProjectID: projectID, Prefix: k.Prefix, CreatedAt: created}, k.Secret, nil
}

// RevokeKey revokes a key by id: servers refuse it once they next poll
// KeyGeneration. Revoking a revoked key is a no-op; an unknown id is
// ErrNotFound.
func (s *Store) RevokeKey(ctx context.Context, id string) error {
	return s.keyChange(ctx, func(tx *sql.Tx) error {
		var revoked sql.NullString
		err := tx.QueryRowContext(ctx, `SELECT revoked_at FROM api_keys WHERE id = ?`, id).Scan(&revoked)
		if errors.Is(err, sql.ErrNoRows) {
			return store.KeyNotFound(id)
		}
		if err != nil || revoked.Valid {
			return err
		}
		_, err = tx.ExecContext(ctx, `UPDATE api_keys SET revoked_at = ? WHERE id = ?`, now(), id)
		return err
	})
}

// keyChange runs f and bumps the key generation in one transaction.
func (s *Store) keyChange(ctx context.Context, f func(*sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := f(tx); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `UPDATE key_generation SET n = n + 1`); err != nil {
		return err
	}
	return tx.Commit()
}

// KeyGeneration is a number that changes whenever a key is created or
// revoked, by this process or another one on the same database. Reading
// it is one indexed row.
func (s *Store) KeyGeneration(ctx context.Context) (int64, error) {
	var n int64
	err := s.db.QueryRowContext(ctx, `SELECT n FROM key_generation WHERE one = 1`).Scan(&n)
	return n, err
}

// ActiveKeys lists every key that is not revoked, with its project.
func (s *Store) ActiveKeys(ctx context.Context) ([]store.ActiveKey, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT k.id, k.hash, p.id, p.slug, p.name FROM api_keys k JOIN projects p ON p.id = k.project_id WHERE k.revoked_at IS NULL`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []store.ActiveKey{}
	for rows.Next() {
		var k store.ActiveKey
		if err := rows.Scan(&k.ID, &k.Hash, &k.Project.ID, &k.Project.Slug, &k.Project.Name); err != nil {
			return nil, err
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

// Keys lists a project's keys, revoked ones included, oldest first.
func (s *Store) Keys(ctx context.Context, projectID string) ([]store.Key, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, project_id, prefix, created_at, last_used_at, revoked_at FROM api_keys WHERE project_id = ? ORDER BY created_at, id`, projectID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []store.Key{}
	for rows.Next() {
		var k store.Key
		var created string
		var used, revoked sql.NullString
		if err := rows.Scan(&k.ID, &k.ProjectID, &k.Prefix, &created, &used, &revoked); err != nil {
			return nil, err
		}
		k.CreatedAt, _ = time.Parse(time.RFC3339Nano, created)
		k.LastUsed, k.RevokedAt = parseTimePtr(used), parseTimePtr(revoked)
		out = append(out, k)
	}
	return out, rows.Err()
}

func parseTimePtr(s sql.NullString) *time.Time {
	if !s.Valid {
		return nil
	}
	t, err := time.Parse(time.RFC3339Nano, s.String)
	if err != nil {
		return nil
	}
	return &t
}

// TouchKeys records when keys were last used, in one transaction: the
// server calls it with what it gathered in memory since the last call.
func (s *Store) TouchKeys(ctx context.Context, used map[string]time.Time) error {
	if len(used) == 0 {
		return nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	for id, t := range used {
		if _, err := tx.ExecContext(ctx, `UPDATE api_keys SET last_used_at = ? WHERE id = ?`, fmtTime(t), id); err != nil {
			return err
		}
	}
	return tx.Commit()
}
