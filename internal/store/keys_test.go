package store

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
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
		`INSERT INTO api_keys VALUES('key_old', 'prj_1', '` + HashKey("lz_old_key_0123456789") + `', 'lz_old', '2026-01-01T00:00:00Z')`,
		`INSERT INTO api_keys VALUES(NULL, 'prj_1', '` + HashKey("lz_nullid_0123456789") + `', 'lz_nul', '2026-01-02T00:00:00Z')`,
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

func TestKeysLifecycle(t *testing.T) {
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
	g0, err := st.KeyGeneration(ctx)
	if err != nil {
		t.Fatal(err)
	}
	secret, err := st.CreateKey(ctx, p.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	g1, _ := st.KeyGeneration(ctx)
	if g1 == g0 {
		t.Fatalf("create did not change the generation (%d)", g0)
	}
	ks, err := st.Keys(ctx, p.ID)
	if err != nil || len(ks) != 1 {
		t.Fatalf("keys: %+v %v", ks, err)
	}
	k := ks[0]
	if k.Prefix != secret[:10] || k.LastUsed != nil || k.CreatedAt.IsZero() {
		t.Fatalf("key %+v of %q", k, secret)
	}
	// Only the hash and a 10-character prefix are stored: no column holds
	// the secret.
	var hash string
	var leaks int
	if err := st.db.QueryRowContext(ctx, `SELECT hash FROM api_keys WHERE id = ?`, k.ID).Scan(&hash); err != nil || hash != HashKey(secret) {
		t.Fatalf("stored hash %q (%v), want HashKey of the secret", hash, err)
	}
	if err := st.db.QueryRowContext(ctx, `SELECT count(*) FROM api_keys WHERE instr(id || hash || prefix || project_id, ?) > 0`, secret).Scan(&leaks); err != nil || leaks != 0 {
		t.Fatalf("rows holding the secret: %d (%v)", leaks, err)
	}
	if short, err := st.CreateKey(ctx, p.ID, "0123456789abcdef"); err != nil {
		t.Fatal(err)
	} else if ks, _ := st.Keys(ctx, p.ID); ks[1].Prefix != short[:5] {
		t.Fatalf("prefix of a 16-character key: %q", ks[1].Prefix)
	}

	used := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	if err := st.TouchKeys(ctx, map[string]time.Time{k.ID: used, "key_gone": used}); err != nil {
		t.Fatal(err)
	}
	ks, _ = st.Keys(ctx, p.ID)
	if ks[0].LastUsed == nil || !ks[0].LastUsed.Equal(used) {
		t.Fatalf("last used %v, want %v", ks[0].LastUsed, used)
	}

	gBefore, _ := st.KeyGeneration(ctx)
	if err := st.RevokeKey(ctx, k.ID); err != nil {
		t.Fatal(err)
	}
	if g, _ := st.KeyGeneration(ctx); g == gBefore {
		t.Fatal("revoke did not change the generation")
	}
	if err := st.RevokeKey(ctx, k.ID); err != nil {
		t.Fatalf("revoke twice: %v", err)
	}
	if err := st.RevokeKey(ctx, "key_nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("unknown id: %v", err)
	}
	ks, _ = st.Keys(ctx, p.ID)
	if ks[0].RevokedAt == nil || ks[1].RevokedAt != nil {
		t.Fatalf("revoked: %+v", ks)
	}
	active, err := st.ActiveKeys(ctx)
	if err != nil || len(active) != 1 || active[0].ID == k.ID {
		t.Fatalf("active after revoke: %+v %v", active, err)
	}
}
