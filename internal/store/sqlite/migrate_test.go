package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/lizard-build/lizard/internal/store"
)

func TestMigrations(t *testing.T) {
	if _, err := migrations(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "lizard.db")
	st, err := Open(path)
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

	// Reopening applies nothing and keeps the data.
	st, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if ps, err := st.Projects(ctx); err != nil || len(ps) != 1 {
		t.Fatalf("after reopen: %v %v", ps, err)
	}
	st.Close()

	// A database from a newer lizard is refused, and left as it was.
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	newer := SchemaVersion() + 1
	if _, err := db.Exec(fmt.Sprintf(`PRAGMA user_version = %d`, newer)); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if st, err := Open(path); !errors.Is(err, store.ErrSchemaNewer) {
		if err == nil {
			st.Close()
		}
		t.Fatalf("open a newer schema: %v, want store.ErrSchemaNewer", err)
	}
}

// A database made before schema versions (user_version 0, tables there)
// takes version 1 as it is.
func TestMigrateUnversioned(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lizard.db")
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	migs, _ := migrations()
	if _, err := db.Exec(migs[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO projects(id, slug, name, created_at) VALUES('prj_x','x','x','2026-01-01T00:00:00Z')`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	st, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if p, err := st.ProjectByRef(context.Background(), "x"); err != nil || p.ID != "prj_x" {
		t.Fatalf("project after versioning: %+v %v", p, err)
	}
	// The later migrations applied too: its projects take limits.
	three := 3
	if err := st.SetProjectLimit(context.Background(), "prj_x", store.LimitVCPUs, &three); err != nil {
		t.Fatal(err)
	}
	if got, err := store.ProjectLimits(context.Background(), st, "prj_x", store.Limits{}); err != nil || got.VCPUs != 3 {
		t.Fatalf("limits on an older database: %+v %v", got, err)
	}
}

func TestCopyTo(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := Open(filepath.Join(dir, "lizard.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	p, err := st.CreateProject(ctx, "p", "")
	if err != nil {
		t.Fatal(err)
	}
	key, err := st.CreateKey(ctx, p.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "copy.db")
	if err := st.CopyTo(ctx, dst); err != nil {
		t.Fatal(err)
	}
	if err := st.CopyTo(ctx, dst); err == nil {
		t.Error("copy over an existing file: no error")
	}
	cp, err := Open(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Close()
	keys, err := cp.ActiveKeys(ctx)
	if err != nil || len(keys) != 1 || keys[0].Hash != store.HashKey(key) || keys[0].Project.ID != p.ID {
		t.Errorf("keys in the copy: %+v %v", keys, err)
	}
	if v, _ := cp.SchemaVersion(ctx); v != SchemaVersion() {
		t.Errorf("copy at version %d, want %d", v, SchemaVersion())
	}
}
