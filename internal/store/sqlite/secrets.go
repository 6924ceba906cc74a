package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/lizard-build/lizard/internal/store"
)

var _ store.Secrets = (*Store)(nil)

const secretColumns = `id, project_id, name, version, value, metadata, created_at, updated_at`

// InsertSecret adds a secret at version 1.
func (s *Store) InsertSecret(ctx context.Context, sec store.Secret) (store.Secret, error) {
	at := time.Now().UTC()
	sec.Version, sec.CreatedAt, sec.UpdatedAt = 1, at, at
	sec.Metadata = metadataOrEmpty(sec.Metadata)
	meta, _ := json.Marshal(sec.Metadata)
	_, err := s.db.ExecContext(ctx, `INSERT INTO secrets(`+secretColumns+`) VALUES(?,?,?,?,?,?,?,?)`,
		sec.ID, sec.ProjectID, sec.Name, sec.Version, sec.Value, string(meta), fmtTime(at), fmtTime(at))
	switch {
	case isUnique(err):
		return store.Secret{}, store.SecretExists(sec.Name)
	case isForeignKey(err):
		return store.Secret{}, store.ProjectNotFound(sec.ProjectID)
	case err != nil:
		return store.Secret{}, err
	}
	return sec, nil
}

// SecretByID finds a project's secret by id.
func (s *Store) SecretByID(ctx context.Context, projectID, id string) (store.Secret, error) {
	return s.oneSecret(ctx, id, `WHERE project_id = ? AND id = ?`, projectID, id)
}

// SecretByName finds a project's secret by name.
func (s *Store) SecretByName(ctx context.Context, projectID, name string) (store.Secret, error) {
	return s.oneSecret(ctx, name, `WHERE project_id = ? AND name = ?`, projectID, name)
}

func (s *Store) oneSecret(ctx context.Context, ref, where string, args ...any) (store.Secret, error) {
	out, err := s.secrets(ctx, where, args...)
	if err != nil {
		return store.Secret{}, err
	}
	if len(out) == 0 {
		return store.Secret{}, store.SecretNotFound(ref)
	}
	return out[0], nil
}

// SecretsAfter lists a page of a project's secrets by name.
func (s *Store) SecretsAfter(ctx context.Context, projectID, after string, limit int) ([]store.Secret, error) {
	return s.secrets(ctx, `WHERE project_id = ? AND name > ? ORDER BY name LIMIT ?`, projectID, after, limit)
}

// AllSecrets lists every secret.
func (s *Store) AllSecrets(ctx context.Context) ([]store.Secret, error) {
	return s.secrets(ctx, `ORDER BY project_id, name`)
}

func (s *Store) secrets(ctx context.Context, where string, args ...any) ([]store.Secret, error) {
	return querySecrets(ctx, s.db, where, args...)
}

// querySecrets reads secrets through q: the database, or a transaction
// (the one connection is the transaction's while it is open).
func querySecrets(ctx context.Context, q interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, where string, args ...any) ([]store.Secret, error) {
	rows, err := q.QueryContext(ctx, `SELECT `+secretColumns+` FROM secrets `+where, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []store.Secret{}
	for rows.Next() {
		var sec store.Secret
		var meta, created, updated string
		if err := rows.Scan(&sec.ID, &sec.ProjectID, &sec.Name, &sec.Version, &sec.Value, &meta, &created, &updated); err != nil {
			return nil, err
		}
		if err := json.Unmarshal([]byte(meta), &sec.Metadata); err != nil {
			return nil, err
		}
		sec.Metadata = metadataOrEmpty(sec.Metadata)
		sec.CreatedAt, _ = time.Parse(time.RFC3339Nano, created)
		sec.UpdatedAt, _ = time.Parse(time.RFC3339Nano, updated)
		out = append(out, sec)
	}
	return out, rows.Err()
}

// UpdateSecret gives a secret a new value at the next version.
func (s *Store) UpdateSecret(ctx context.Context, projectID, id string, value []byte, metadata map[string]string) (store.Secret, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return store.Secret{}, err
	}
	defer tx.Rollback()
	q := `UPDATE secrets SET value = ?, version = version + 1, updated_at = ? WHERE project_id = ? AND id = ?`
	args := []any{value, now(), projectID, id}
	if metadata != nil {
		meta, _ := json.Marshal(metadata)
		q = `UPDATE secrets SET value = ?, version = version + 1, updated_at = ?, metadata = ? WHERE project_id = ? AND id = ?`
		args = []any{value, now(), string(meta), projectID, id}
	}
	res, err := tx.ExecContext(ctx, q, args...)
	if err != nil {
		return store.Secret{}, err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return store.Secret{}, store.SecretNotFound(id)
	}
	out, err := querySecrets(ctx, tx, `WHERE id = ?`, id)
	if err != nil {
		return store.Secret{}, err
	}
	if len(out) != 1 {
		return store.Secret{}, store.SecretNotFound(id)
	}
	return out[0], tx.Commit()
}

// DeleteSecret removes a project's secret.
func (s *Store) DeleteSecret(ctx context.Context, projectID, id string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM secrets WHERE project_id = ? AND id = ?`, projectID, id)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return store.SecretNotFound(id)
	}
	return nil
}

// ResealSecret replaces a sealed value if it is still old.
func (s *Store) ResealSecret(ctx context.Context, id string, old, new []byte) (bool, error) {
	return s.swap(ctx, `UPDATE secrets SET value = ? WHERE id = ? AND value = ?`, new, id, old)
}

// swap runs a compare-and-swap update and says whether it changed a row.
func (s *Store) swap(ctx context.Context, q string, args ...any) (bool, error) {
	res, err := s.db.ExecContext(ctx, q, args...)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

func metadataOrEmpty(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// isForeignKey reports whether err is SQLite refusing a row whose parent
// is missing.
func isForeignKey(err error) bool {
	var se *sqlite.Error
	return errors.As(err, &se) && se.Code() == sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY
}
