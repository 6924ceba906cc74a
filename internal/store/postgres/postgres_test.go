package postgres

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/store/postgres/pgtest"
	"github.com/lizard-build/lizard/internal/store/storetest"
)

func TestConformance(t *testing.T) {
	srv := pgtest.ForTest(t)
	storetest.Run(t, func(t *testing.T) func() (store.Store, error) {
		url, err := srv.NewDatabase(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return func() (store.Store, error) { return Open(context.Background(), url) }
	})
}

func TestClusterConformance(t *testing.T) {
	srv := pgtest.ForTest(t)
	storetest.RunCluster(t, func(t *testing.T) func() (store.Store, error) {
		url, err := srv.NewDatabase(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return func() (store.Store, error) { return Open(context.Background(), url) }
	})
}

// TestMigrations: a new database is at SchemaVersion with one row per
// version; servers opening it at once all succeed; a database a newer
// lizard migrated is refused and left as it was.
func TestMigrations(t *testing.T) {
	if _, err := migrations(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	srv := pgtest.ForTest(t)
	url, err := srv.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			st, err := Open(ctx, url)
			if err == nil {
				st.Close()
			}
			errs <- err
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatalf("concurrent open: %v", err)
		}
	}
	st, err := Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := st.SchemaVersion(ctx); err != nil || v != SchemaVersion() || v < 1 {
		t.Fatalf("new database at version %d (%v), want %d", v, err, SchemaVersion())
	}
	if _, err := st.CreateProject(ctx, "p", ""); err != nil {
		t.Fatal(err)
	}
	st.Close()

	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var rows int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM schema_migrations`).Scan(&rows); err != nil || rows != SchemaVersion() {
		t.Fatalf("%d rows in schema_migrations (%v), want one per version (%d)", rows, err, SchemaVersion())
	}
	newer := SchemaVersion() + 1
	if _, err := conn.Exec(ctx, `INSERT INTO schema_migrations(version) VALUES($1)`, newer); err != nil {
		t.Fatal(err)
	}
	if st, err := Open(ctx, url); !errors.Is(err, store.ErrSchemaNewer) {
		if err == nil {
			st.Close()
		}
		t.Fatalf("open a newer schema: %v, want ErrSchemaNewer", err)
	}
	var projects int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM projects`).Scan(&projects); err != nil || projects != 1 {
		t.Fatalf("projects after the refused open: %d %v", projects, err)
	}
}

// A failing migration leaves no trace: neither its changes nor its version.
func TestMigrationAtomic(t *testing.T) {
	ctx := context.Background()
	srv := pgtest.ForTest(t)
	url, err := srv.NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	// A table in the way of migration 1's second statement.
	if _, err := conn.Exec(ctx, `CREATE TABLE api_keys (x int)`); err != nil {
		t.Fatal(err)
	}
	if st, err := Open(ctx, url); err == nil {
		st.Close()
		t.Fatal("migration over a conflicting table: no error")
	}
	var v int
	if err := conn.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM schema_migrations`).Scan(&v); err != nil || v != 0 {
		t.Fatalf("version after a failed migration: %d %v", v, err)
	}
	var projects bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass('projects') IS NOT NULL`).Scan(&projects); err != nil || projects {
		t.Fatalf("the failed migration's first table is there: %v %v", projects, err)
	}
}

func TestOpenBadURL(t *testing.T) {
	_, err := Open(context.Background(), "postgres://user:secret@host:notaport/db")
	if !errors.Is(err, errdefs.ErrInvalid) || strings.Contains(err.Error(), "secret") {
		t.Fatalf("bad url: %v, want ErrInvalid without the password", err)
	}
}

// TestKeySecretNotStored: only the hash and a 10-character prefix are
// stored: no column holds the secret.
func TestKeySecretNotStored(t *testing.T) {
	ctx := context.Background()
	url, err := pgtest.ForTest(t).NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st, err := Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	p, err := st.CreateProject(ctx, "p", "")
	if err != nil {
		t.Fatal(err)
	}
	secret, err := st.CreateKey(ctx, p.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	var hash string
	var leaks int
	if err := st.pool.QueryRow(ctx, `SELECT hash FROM api_keys`).Scan(&hash); err != nil || hash != store.HashKey(secret) {
		t.Fatalf("stored hash %q (%v), want HashKey of the secret", hash, err)
	}
	if err := st.pool.QueryRow(ctx, `SELECT count(*) FROM api_keys WHERE strpos(id || hash || prefix || project_id, $1) > 0`, secret).Scan(&leaks); err != nil || leaks != 0 {
		t.Fatalf("rows holding the secret: %d (%v)", leaks, err)
	}
}

// TestDeclareDeadPastAStuckTransaction: a node cut off from the database in
// the middle of a transaction leaves its session idle in it, holding its
// node row's lock; the server ends that session (sessionLimits), so
// another node can still declare it dead once its lease has lapsed.
func TestDeclareDeadPastAStuckTransaction(t *testing.T) {
	ctx := context.Background()
	url, err := pgtest.ForTest(t).NewDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stuck, err := Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer stuck.Close()
	other, err := Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	var setting string
	if err := other.pool.QueryRow(ctx, `SHOW idle_in_transaction_session_timeout`).Scan(&setting); err != nil || setting != "10s" {
		t.Fatalf("idle_in_transaction_session_timeout = %q (%v), want 10s", setting, err)
	}
	if _, err := stuck.RegisterNode(ctx, store.NodeInfo{Name: "c", Address: "10.0.0.3:7070"}, time.Second); err != nil {
		t.Fatal(err)
	}
	// c's fenced write, cut off before its commit: the row stays locked.
	tx, err := stuck.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM nodes WHERE name = 'c' FOR NO KEY UPDATE`); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	time.Sleep(2 * time.Second) // c's lease lapses
	for {
		dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		done, err := other.DeclareDead(dctx, "c", 0)
		cancel()
		if err == nil && done {
			break
		}
		if time.Since(start) > time.Minute {
			t.Fatalf("node c not declared dead a minute after its session stalled: %v %v", done, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if took := time.Since(start); took < 9*time.Second {
		t.Fatalf("declared dead after %v, while the stalled session held its lock (want about 10 s)", took)
	}
}
