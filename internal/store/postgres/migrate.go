package postgres

import (
	"context"
	"embed"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lizard-build/lizard/internal/store"
)

// The migrations are the numbered SQL files in migrations/
// (store.ReadMigrations). schema_migrations has one row per applied
// version, inserted in the migration's own transaction.
//
//go:embed migrations/*.sql
var migrationFiles embed.FS

func migrations() ([]string, error) { return store.ReadMigrations(migrationFiles, "migrations") }

// SchemaVersion is the schema version this binary writes.
func SchemaVersion() int { return store.SchemaVersionOf(migrationFiles, "migrations") }

// migrationLock is the key of the advisory lock that servers starting at
// once on one database take, so that one of them migrates and the others
// then find the schema up to date.
const migrationLock = 0x6c697a6172640001 // "lizard" 1

// migrate brings the database to SchemaVersion, or refuses a newer one.
func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	migs, err := migrations()
	if err != nil {
		return err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, int64(migrationLock)); err != nil {
		return fmt.Errorf("lock for migration: %w", err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, int64(migrationLock))
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    INTEGER PRIMARY KEY,
		applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
	)`); err != nil {
		return fmt.Errorf("schema_migrations: %w", err)
	}
	v, err := version(ctx, conn)
	if err != nil {
		return err
	}
	if v > len(migs) {
		return store.SchemaNewer(v, len(migs))
	}
	for ; v < len(migs); v++ {
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			// No arguments: the simple protocol, which runs a file of
			// several statements.
			if _, err := tx.Exec(ctx, migs[v]); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO schema_migrations(version) VALUES($1)`, v+1)
			return err
		})
		if err != nil {
			return fmt.Errorf("migration %d: %w", v+1, err)
		}
	}
	return nil
}

func version(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (int, error) {
	var v int
	if err := q.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM schema_migrations`).Scan(&v); err != nil {
		return 0, fmt.Errorf("read schema version: %w", err)
	}
	return v, nil
}

// SchemaVersion returns the schema version of the open database.
func (s *Store) SchemaVersion(ctx context.Context) (int, error) { return version(ctx, s.pool) }
