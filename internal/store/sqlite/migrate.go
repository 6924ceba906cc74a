package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"os"

	"github.com/lizard-build/lizard/internal/store"
)

// The migrations are the numbered SQL files in migrations/
// (store.ReadMigrations). The version is SQLite's PRAGMA user_version, set
// in the same transaction as the migration.
//
//go:embed migrations/*.sql
var migrationFiles embed.FS

func migrations() ([]string, error) { return store.ReadMigrations(migrationFiles, "migrations") }

// SchemaVersion is the schema version this binary writes.
func SchemaVersion() int { return store.SchemaVersionOf(migrationFiles, "migrations") }

func userVersion(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}) (int, error) {
	var v int
	err := q.QueryRowContext(ctx, `PRAGMA user_version`).Scan(&v)
	return v, err
}

// migrate brings db to SchemaVersion, or refuses a newer one.
func migrate(db *sql.DB) error {
	ctx := context.Background()
	migs, err := migrations()
	if err != nil {
		return err
	}
	v, err := userVersion(ctx, db)
	if err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	if v > len(migs) {
		return store.SchemaNewer(v, len(migs))
	}
	for ; v < len(migs); v++ {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, migs[v]); err != nil {
			tx.Rollback()
			return fmt.Errorf("migration %d: %w", v+1, err)
		}
		if _, err := tx.ExecContext(ctx, fmt.Sprintf(`PRAGMA user_version = %d`, v+1)); err != nil {
			tx.Rollback()
			return fmt.Errorf("migration %d: %w", v+1, err)
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("migration %d: %w", v+1, err)
		}
	}
	return nil
}

// SchemaVersion returns the schema version of the open database.
func (s *Store) SchemaVersion(ctx context.Context) (int, error) { return userVersion(ctx, s.db) }

// CopyTo writes a consistent copy of the database to path (which must not
// exist), while others go on reading and writing: VACUUM INTO reads one
// snapshot of the database in a single transaction. The copy keeps the
// schema version.
func (s *Store) CopyTo(ctx context.Context, path string) error {
	if _, err := os.Lstat(path); err == nil {
		return fmt.Errorf("copy database: %s exists", path)
	}
	if _, err := s.db.ExecContext(ctx, `VACUUM INTO ?`, path); err != nil {
		os.Remove(path)
		return fmt.Errorf("copy database to %s: %w", path, err)
	}
	return nil
}
