package sqlite

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/lizard-build/lizard/internal/store"
)

// TestKeysMigrateOldDatabase: a database made before last-used, revocation
// and the key generation opens with its keys valid, listed and revocable.
func TestKeysMigrateOldDatabase(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "lizard.db")
	old, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`CREATE TABLE projects (id TEXT PRIMARY KEY, slug TEXT NOT NULL UNIQUE, name TEXT NOT NULL, created_at TEXT NOT NULL)`,
		`CREATE TABLE api_keys (id TEXT PRIMARY KEY, project_id TEXT NOT NULL REFERENCES projects(id), hash TEXT NOT NULL UNIQUE, prefix TEXT NOT NULL, created_at TEXT NOT NULL)`,
		`INSERT INTO projects VALUES('prj_1', 'default', 'default', '2026-01-01T00:00:00Z')`,
		`INSERT INTO api_keys VALUES('key_old', 'prj_1', '` + store.HashKey("lz_old_key_0123456789") + `', 'lz_old', '2026-01-01T00:00:00Z')`,
		`INSERT INTO api_keys VALUES(NULL, 'prj_1', '` + store.HashKey("lz_nullid_0123456789") + `', 'lz_nul', '2026-01-02T00:00:00Z')`,
	} {
		if _, err := old.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	old.Close()

	for range 2 { // the migration runs again on an up-to-date database
		st, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		st.Close()
	}
	st, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ks, err := st.Keys(ctx, "prj_1")
	if err != nil || len(ks) != 2 {
		t.Fatalf("keys: %+v %v", ks, err)
	}
	if ks[0].ID != "key_old" || ks[0].Prefix != "lz_old" || ks[0].LastUsed != nil || ks[0].RevokedAt != nil {
		t.Fatalf("old key: %+v", ks[0])
	}
	if len(ks[1].ID) != len("key_")+16 {
		t.Fatalf("a key without id got %q", ks[1].ID)
	}
	active, err := st.ActiveKeys(ctx)
	if err != nil || len(active) != 2 || active[0].Project.Slug != "default" {
		t.Fatalf("active: %+v %v", active, err)
	}
	if err := st.RevokeKey(ctx, ks[1].ID); err != nil {
		t.Fatal(err)
	}
	if active, _ := st.ActiveKeys(ctx); len(active) != 1 || active[0].ID != "key_old" {
		t.Fatalf("after revoke: %+v", active)
	}
}

// TestKeySecretNotStored: only the hash and a 10-character prefix are
// stored: no column holds the secret.
func TestKeySecretNotStored(t *testing.T) {
	ctx := context.Background()
	st, err := Open(filepath.Join(t.TempDir(), "lizard.db"))
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
	if err := st.db.QueryRowContext(ctx, `SELECT hash FROM api_keys`).Scan(&hash); err != nil || hash != store.HashKey(secret) {
		t.Fatalf("stored hash %q (%v), want HashKey of the secret", hash, err)
	}
	if err := st.db.QueryRowContext(ctx, `SELECT count(*) FROM api_keys WHERE instr(id || hash || prefix || project_id, ?) > 0`, secret).Scan(&leaks); err != nil || leaks != 0 {
		t.Fatalf("rows holding the secret: %d (%v)", leaks, err)
	}
}
