package store

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strconv"
	"strings"
)

// Migrations are the numbered SQL files in migrations/, NNNN_what.sql from
// 0001 without gaps; file N brings the schema from version N-1 to N. The
// version is SQLite's PRAGMA user_version, set in the same transaction as
// the migration, so a migration is applied whole or not at all. A change of
// the schema is a new file, never an edit of an applied one.
//
//go:embed migrations/*.sql
var migrationFiles embed.FS

// ErrSchemaNewer is returned by Open for a database whose schema version is
// newer than this binary knows: it was written by a newer lizard.
var ErrSchemaNewer = errors.New("database schema is newer than this lizard")

// migrations returns the migrations in order.
func migrations() ([]string, error) {
	ents, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents { // sorted by name
		num, _, _ := strings.Cut(e.Name(), "_")
		n, err := strconv.Atoi(num)
		if err != nil || n != len(out)+1 {
			return nil, fmt.Errorf("migration %s: want number %04d", e.Name(), len(out)+1)
		}
		b, err := migrationFiles.ReadFile(path.Join("migrations", e.Name()))
		if err != nil {
			return nil, err
		}
		out = append(out, string(b))
	}
	return out, nil
}

// SchemaVersion is the schema version this binary writes.
func SchemaVersion() int {
	m, err := migrations()
	if err != nil {
		panic(err) // embedded at build time; TestMigrations checks them
	}
	return len(m)
}

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
		return fmt.Errorf("schema version %d, this lizard knows up to %d (upgrade lizard, or restore a backup this version made): %w",
			v, len(migs), ErrSchemaNewer)
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
