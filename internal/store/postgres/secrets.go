package postgres

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lizard-build/lizard/internal/store"
)

var _ store.Secrets = (*Store)(nil)

const secretColumns = `id, project_id, name, version, value, metadata, created_at, updated_at`

// InsertSecret adds a secret at version 1, created now by the database's
// clock.
func (s *Store) InsertSecret(ctx context.Context, sec store.Secret) (store.Secret, error) {
	sec.Metadata = metadataOrEmpty(sec.Metadata)
	rows, _ := s.pool.Query(ctx, `INSERT INTO secrets(`+secretColumns+`) VALUES($1,$2,$3,1,$4,$5,now(),now()) RETURNING `+secretColumns,
		sec.ID, sec.ProjectID, sec.Name, sec.Value, sec.Metadata)
	out, err := collect(rows, scanSecret)
	switch {
	case isUnique(err):
		return store.Secret{}, store.SecretExists(sec.Name)
	case isForeignKey(err):
		return store.Secret{}, store.ProjectNotFound(sec.ProjectID)
	case err != nil:
		return store.Secret{}, err
	}
	return out[0], nil
}

// SecretByID finds a project's secret by id.
func (s *Store) SecretByID(ctx context.Context, projectID, id string) (store.Secret, error) {
	return s.oneSecret(ctx, id, `WHERE project_id = $1 AND id = $2`, projectID, id)
}

// SecretByName finds a project's secret by name.
func (s *Store) SecretByName(ctx context.Context, projectID, name string) (store.Secret, error) {
	return s.oneSecret(ctx, name, `WHERE project_id = $1 AND name = $2`, projectID, name)
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

// SecretsAfter lists a page of a project's secrets by name (byte order,
// as SQLite's, whatever the database's collation).
func (s *Store) SecretsAfter(ctx context.Context, projectID, after string, limit int) ([]store.Secret, error) {
	return s.secrets(ctx, `WHERE project_id = $1 AND name COLLATE "C" > $2 ORDER BY name COLLATE "C" LIMIT $3`, projectID, after, limit)
}

// AllSecrets lists every secret.
func (s *Store) AllSecrets(ctx context.Context) ([]store.Secret, error) {
	return s.secrets(ctx, `ORDER BY project_id, name`)
}

func (s *Store) secrets(ctx context.Context, where string, args ...any) ([]store.Secret, error) {
	rows, _ := s.pool.Query(ctx, `SELECT `+secretColumns+` FROM secrets `+where, args...)
	return collect(rows, scanSecret)
}

func scanSecret(r pgx.CollectableRow) (sec store.Secret, err error) {
	err = r.Scan(&sec.ID, &sec.ProjectID, &sec.Name, &sec.Version, &sec.Value, &sec.Metadata, &sec.CreatedAt, &sec.UpdatedAt)
	sec.Metadata = metadataOrEmpty(sec.Metadata)
	sec.CreatedAt, sec.UpdatedAt = sec.CreatedAt.UTC(), sec.UpdatedAt.UTC()
	return sec, err
}

// UpdateSecret gives a secret a new value at the next version.
func (s *Store) UpdateSecret(ctx context.Context, projectID, id string, value []byte, metadata map[string]string) (store.Secret, error) {
	rows, _ := s.pool.Query(ctx, `UPDATE secrets SET value = $1, version = version + 1, updated_at = now(),
		metadata = COALESCE($2, metadata) WHERE project_id = $3 AND id = $4 RETURNING `+secretColumns, value, metadataArg(metadata), projectID, id)
	out, err := collect(rows, scanSecret)
	if err != nil {
		return store.Secret{}, err
	}
	if len(out) == 0 {
		return store.Secret{}, store.SecretNotFound(id)
	}
	return out[0], nil
}

// metadataArg is metadata as an update's argument: nil (SQL NULL) keeps
// what the row has.
func metadataArg(m map[string]string) any {
	if m == nil {
		return nil
	}
	return m
}

// DeleteSecret removes a project's secret.
func (s *Store) DeleteSecret(ctx context.Context, projectID, id string) error {
	tag, err := s.pool.Exec(ctx, `DELETE FROM secrets WHERE project_id = $1 AND id = $2`, projectID, id)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return store.SecretNotFound(id)
	}
	return nil
}

// ResealSecret replaces a sealed value if it is still old.
func (s *Store) ResealSecret(ctx context.Context, id string, old, new []byte) (bool, error) {
	tag, err := s.pool.Exec(ctx, `UPDATE secrets SET value = $1 WHERE id = $2 AND value = $3`, new, id, old)
	return tag.RowsAffected() == 1, err
}

func metadataOrEmpty(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// isForeignKey reports whether err is PostgreSQL refusing a row whose
// parent is missing.
func isForeignKey(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23503" // foreign_key_violation
}
