package postgres

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lizard-build/lizard/internal/store"
)

var _ store.Identity = (*Store)(nil)

// InsertSigningKey adds a signing key.
func (s *Store) InsertSigningKey(ctx context.Context, k store.SigningKey) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO oidc_keys(id, generation, algorithm, public_key, private_key, created_at, activate_at) VALUES($1,$2,$3,$4,$5,$6,$7)`,
		k.ID, k.Generation, k.Algorithm, k.Public, k.Private, k.CreatedAt, k.ActivateAt)
	if isUnique(err) {
		return store.SigningKeyExists(k.Generation)
	}
	return err
}

// SigningKeys lists every signing key, oldest generation first.
func (s *Store) SigningKeys(ctx context.Context) ([]store.SigningKey, error) {
	rows, _ := s.pool.Query(ctx, `SELECT id, generation, algorithm, public_key, private_key, created_at, activate_at FROM oidc_keys ORDER BY generation`)
	return collect(rows, func(r pgx.CollectableRow) (k store.SigningKey, err error) {
		err = r.Scan(&k.ID, &k.Generation, &k.Algorithm, &k.Public, &k.Private, &k.CreatedAt, &k.ActivateAt)
		k.CreatedAt, k.ActivateAt = k.CreatedAt.UTC(), k.ActivateAt.UTC()
		return k, err
	})
}

// DeleteSigningKey removes a signing key.
func (s *Store) DeleteSigningKey(ctx context.Context, id string) error {
	_, err := s.pool.Exec(ctx, `DELETE FROM oidc_keys WHERE id = $1`, id)
	return err
}

// ResealSigningKey replaces a sealed private key if it is still old.
func (s *Store) ResealSigningKey(ctx context.Context, id string, old, new []byte) (bool, error) {
	tag, err := s.pool.Exec(ctx, `UPDATE oidc_keys SET private_key = $1 WHERE id = $2 AND private_key = $3`, new, id, old)
	return tag.RowsAffected() == 1, err
}

// PutSandboxTokens replaces the tokens of a project's sandbox. The
// sandbox's row is locked (FOR KEY SHARE) so that a concurrent delete
// waits, and takes the new tokens with it.
func (s *Store) PutSandboxTokens(ctx context.Context, projectID, sandboxID string, tokens []store.SandboxToken) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var one int
		err := tx.QueryRow(ctx, `SELECT 1 FROM sandboxes WHERE id = $1 AND project_id = $2 FOR KEY SHARE`, sandboxID, projectID).Scan(&one)
		if errors.Is(err, pgx.ErrNoRows) {
			return store.SandboxGone(sandboxID)
		}
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM sandbox_tokens WHERE sandbox_id = $1`, sandboxID); err != nil {
			return err
		}
		for _, t := range tokens {
			if _, err := tx.Exec(ctx, `INSERT INTO sandbox_tokens(sandbox_id, project_id, name, audience, token_type, lifetime_s) VALUES($1,$2,$3,$4,$5,$6)`,
				sandboxID, projectID, t.Name, t.Audience, t.TokenType, int64(t.Lifetime/time.Second)); err != nil {
				return err
			}
		}
		return nil
	})
}

// SandboxTokens lists the tokens of a project's sandbox.
func (s *Store) SandboxTokens(ctx context.Context, projectID, sandboxID string) ([]store.SandboxToken, error) {
	rows, _ := s.pool.Query(ctx, `SELECT name, audience, token_type, lifetime_s FROM sandbox_tokens WHERE project_id = $1 AND sandbox_id = $2 ORDER BY name COLLATE "C"`,
		projectID, sandboxID)
	return collect(rows, func(r pgx.CollectableRow) (t store.SandboxToken, err error) {
		var secs int64
		err = r.Scan(&t.Name, &t.Audience, &t.TokenType, &secs)
		t.ProjectID, t.SandboxID, t.Lifetime = projectID, sandboxID, time.Duration(secs)*time.Second
		return t, err
	})
}
