// Package dbtest is for tests of the packages above the store that must
// hold on every backend (several nodes on one database): Each runs a test
// once on SQLite and once on PostgreSQL (pgtest), with a function that
// opens another handle on the same fresh database. Only tests import it.
package dbtest

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/store/postgres"
	"github.com/lizard-build/lizard/internal/store/postgres/pgtest"
	"github.com/lizard-build/lizard/internal/store/sqlite"
)

// Database is a handle on a store as a node of a cluster has it.
type Database interface {
	store.Store
	store.Events
	store.Cluster
}

// Each runs fn as subtests "sqlite" and "postgres"; open returns a new
// handle on the subtest's database, closed when it ends. The postgres
// subtest skips when PostgreSQL is not installed.
func Each(t *testing.T, fn func(t *testing.T, open func() Database)) {
	t.Run("sqlite", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "lizard.db")
		fn(t, func() Database {
			st, err := sqlite.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			return st
		})
	})
	t.Run("postgres", func(t *testing.T) {
		url, err := pgtest.ForTest(t).NewDatabase(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		fn(t, func() Database {
			st, err := postgres.Open(context.Background(), url)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			return st
		})
	})
}
