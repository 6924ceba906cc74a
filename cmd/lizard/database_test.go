package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/store/postgres"
	"github.com/lizard-build/lizard/internal/store/postgres/pgtest"
)

// TestOperatorCLIOnPostgres: migrate, projects and keys work on --database;
// what they write is what a server on the same database reads.
func TestOperatorCLIOnPostgres(t *testing.T) {
	noConfig(t)
	ctx := context.Background()
	srv := pgtest.ForTest(t)
	url, err := srv.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dataDir := t.TempDir() // must stay unused
	for _, args := range [][]string{
		{"migrate", "--database", url},
		{"migrate", "--database", url}, // again: nothing to do
		{"projects", "create", "Team A", "--database", url, "--data-dir", dataDir},
		{"keys", "create", "--project", "team-a", "--database", url},
	} {
		if err := Run(ctx, args); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
	}
	if ents, err := os.ReadDir(dataDir); err != nil || len(ents) != 0 {
		t.Fatalf("the data dir was used with --database: %v %v", ents, err)
	}
	st, err := postgres.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	p, err := st.ProjectByRef(ctx, "team-a")
	if err != nil {
		t.Fatal(err)
	}
	if ks, err := st.ActiveKeys(ctx); err != nil || len(ks) != 1 || ks[0].Project != p {
		t.Fatalf("keys the CLI made: %+v %v", ks, err)
	}
	if v, err := st.SchemaVersion(ctx); err != nil || v != postgres.SchemaVersion() {
		t.Fatalf("schema version %d %v", v, err)
	}
	if err := Run(ctx, []string{"keys", "create", "--project", "nope", "--database", url}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("unknown project: %v", err)
	}

	// A database a newer lizard migrated: migrate (and so serve) refuses it.
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `INSERT INTO schema_migrations(version) VALUES($1)`, postgres.SchemaVersion()+1); err != nil {
		t.Fatal(err)
	}
	if err := Run(ctx, []string{"migrate", "--database", url}); !errors.Is(err, store.ErrSchemaNewer) {
		t.Fatalf("migrate of a newer schema: %v, want ErrSchemaNewer", err)
	}
}

func TestDatabaseFlag(t *testing.T) {
	noConfig(t)
	ctx := context.Background()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"projects", "ls", "--database", "mysql://x"}, "--database: want a postgres://"},
		{[]string{"backup", "out.tar.zst", "--database", "postgres://h/db"}, "pg_dump"},
		{[]string{"restore", "in.tar.zst", "--database", "postgres://h/db"}, "pg_restore"},
	} {
		err := Run(ctx, tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error with %q", tc.args, err, tc.want)
		}
	}
}

// noConfig makes the commands read an empty config file, not the host's.
func noConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lizard.toml")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("LIZARD_CONFIG", path)
}

// TestFirstStartTogether: nodes starting at once on an empty database make
// one default project with one key, and every one of them starts.
func TestFirstStartTogether(t *testing.T) {
	ctx := context.Background()
	_, st := emptyDB(t)
	errs := make(chan error, 6)
	for range cap(errs) {
		go func() {
			_, err := firstStart(ctx, st)
			errs <- err
		}()
	}
	for range cap(errs) {
		if err := <-errs; err != nil {
			t.Errorf("firstStart: %v", err)
		}
	}
	ps, err := st.Projects(ctx)
	if err != nil || len(ps) != 1 {
		t.Fatalf("projects after six first starts: %v, %v", ps, err)
	}
	keys, err := st.Keys(ctx, ps[0].ID)
	if err != nil || len(keys) != 1 {
		t.Fatalf("keys of the default project: %d, %v", len(keys), err)
	}
}
