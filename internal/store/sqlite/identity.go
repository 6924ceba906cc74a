package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/lizard-build/lizard/internal/store"
)

var _ store.Identity = (*Store)(nil)

// InsertSigningKey adds a signing key.
func (s *Store) InsertSigningKey(ctx context.Context, k store.SigningKey) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO oidc_keys(id, generation, algorithm, public_key, private_key, created_at, activate_at) VALUES(?,?,?,?,?,?,?)`,
		k.ID, k.Generation, k.Algorithm, k.Public, k.Private, fmtTime(k.CreatedAt), fmtTime(k.ActivateAt))
	if isUnique(err) {
		return store.SigningKeyExists(k.Generation)
	}
	return err
}

// SigningKeys lists every signing key, oldest generation first.
func (s *Store) SigningKeys(ctx context.Context) ([]store.SigningKey, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, generation, algorithm, public_key, private_key, created_at, activate_at FROM oidc_keys ORDER BY generation`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []store.SigningKey{}
	for rows.Next() {
		var k store.SigningKey
		var created, activate string
		if err := rows.Scan(&k.ID, &k.Generation, &k.Algorithm, &k.Public, &k.Private, &created, &activate); err != nil {
			return nil, err
		}
		k.CreatedAt, _ = time.Parse(time.RFC3339Nano, created)
		k.ActivateAt, _ = time.Parse(time.RFC3339Nano, activate)
		out = append(out, k)
	}
	return out, rows.Err()
}

// DeleteSigningKey removes a signing key.
func (s *Store) DeleteSigningKey(ctx context.Context, id string) error {
	_, err := s.db.ExecContext(ctx, `DELETE FROM oidc_keys WHERE id = ?`, id)
	return err
}

// ResealSigningKey replaces a sealed private key if it is still old.
func (s *Store) ResealSigningKey(ctx context.Context, id string, old, new []byte) (bool, error) {
	return s.swap(ctx, `UPDATE oidc_keys SET private_key = ? WHERE id = ? AND private_key = ?`, new, id, old)
}

// PutSandboxTokens replaces the tokens of a project's sandbox.
func (s *Store) PutSandboxTokens(ctx context.Context, projectID, sandboxID string, tokens []store.SandboxToken) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var one int
	err = tx.QueryRowContext(ctx, `SELECT 1 FROM sandboxes WHERE id = ? AND project_id = ?`, sandboxID, projectID).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return store.SandboxGone(sandboxID)
	}
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM sandbox_tokens WHERE sandbox_id = ?`, sandboxID); err != nil {
		return err
	}
	for _, t := range tokens {
		if _, err := tx.ExecContext(ctx, `INSERT INTO sandbox_tokens(sandbox_id, project_id, name, audience, token_type, lifetime_s) VALUES(?,?,?,?,?,?)`,
			sandboxID, projectID, t.Name, t.Audience, t.TokenType, int64(t.Lifetime/time.Second)); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// SandboxTokens lists the tokens of a project's sandbox.
func (s *Store) SandboxTokens(ctx context.Context, projectID, sandboxID string) ([]store.SandboxToken, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT name, audience, token_type, lifetime_s FROM sandbox_tokens WHERE project_id = ? AND sandbox_id = ? ORDER BY name`,
		projectID, sandboxID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []store.SandboxToken{}
	for rows.Next() {
		t := store.SandboxToken{ProjectID: projectID, SandboxID: sandboxID}
		var secs int64
		if err := rows.Scan(&t.Name, &t.Audience, &t.TokenType, &secs); err != nil {
			return nil, err
		}
		t.Lifetime = time.Duration(secs) * time.Second
		out = append(out, t)
	}
	return out, rows.Err()
}
