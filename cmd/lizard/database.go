package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/store/postgres"
	"github.com/lizard-build/lizard/internal/store/sqlite"
)

const databaseUsage = "PostgreSQL URL (postgres://USER:PASSWORD@HOST/DB) of the database the servers of a cluster share; empty: SQLite in --data-dir"

// isPostgres reports whether database names PostgreSQL; anything else
// that is not empty is an error naming the flag.
func isPostgres(database string) (bool, error) {
	switch {
	case database == "":
		return false, nil
	case strings.HasPrefix(database, "postgres://"), strings.HasPrefix(database, "postgresql://"):
		return true, nil
	}
	return false, errors.New("--database: want a postgres:// or postgresql:// URL, or nothing for SQLite in --data-dir")
}

// databaseKind names the database for the log, never its URL (which may
// hold a password).
func databaseKind(database string) string {
	if database == "" {
		return "sqlite"
	}
	return "postgres"
}

// openStore opens the state database, migrated to this binary's schema:
// PostgreSQL when database is a URL, else SQLite's lizard.db in dataDir.
func openStore(ctx context.Context, dataDir, database string) (store.Store, error) {
	pg, err := isPostgres(database)
	if err != nil {
		return nil, err
	}
	if pg {
		return postgres.Open(ctx, database)
	}
	return openSQLite(dataDir)
}

func openSQLite(dataDir string) (*sqlite.Store, error) {
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, err
	}
	return sqlite.Open(filepath.Join(dataDir, "lizard.db"))
}

// sqliteOnly refuses commands that work on the data directory's SQLite file
// (backup, restore) when the state is in PostgreSQL.
func sqliteOnly(cmd, database string) error {
	pg, err := isPostgres(database)
	if err != nil || !pg {
		return err
	}
	return fmt.Errorf("lizard %s copies the SQLite database of --data-dir; with --database on PostgreSQL, back the database up with pg_dump and restore it with pg_restore (docs/OPERATIONS.md)", cmd)
}

// migrateCmd runs `lizard migrate`: it brings the database to this
// binary's schema (serve does too, at start) and says at which version it
// is; a database of a newer lizard is refused, unchanged.
func migrateCmd(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	dataDir := fs.String("data-dir", defaultDataDir, "state directory (SQLite)")
	database := fs.String("database", "", databaseUsage)
	pos, err := configure(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return errors.New("usage: lizard migrate [--database URL] [--data-dir DIR]")
	}
	st, err := openStore(ctx, *dataDir, *database)
	if err != nil {
		return err
	}
	defer st.Close()
	v, err := st.SchemaVersion(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("database at schema version %d\n", v)
	return nil
}
