// Package sqlite is the store backend on SQLite (pure Go,
// modernc.org/sqlite, WAL): one database file under the data directory, the
// single-node default. Only the wiring (cmd/lizard) and the backup package,
// which copies the file (CopyTo), import it; everything else uses
// store.Store.
package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/lizard-build/lizard/internal/store"

	"modernc.org/sqlite" // also registers the "sqlite" driver
	sqlite3 "modernc.org/sqlite/lib"
)

// Store is the SQLite-backed state. It is safe for concurrent use.
type Store struct {
	db   *sql.DB
	path string
	file os.FileInfo // the database file as opened, for Ping
}

var _ store.Store = (*Store)(nil)

// Open opens (creating if needed) the database at path and brings its
// schema up to date; a newer schema is store.ErrSchemaNewer.
func Open(path string) (*Store, error) {
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)&_pragma=foreign_keys(1)&_pragma=synchronous(NORMAL)&_txlock=immediate")
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	// BEGIN IMMEDIATE: a transaction that reads, then writes (cluster
	// admission) takes the write lock first, so that another process on the
	// file makes it wait (busy_timeout) instead of failing its upgrade.
	// One writer at a time is SQLite's rule; a single connection also keeps
	// the pragmas above in force for every statement.
	db.SetMaxOpenConns(1)
	if err := migrate(db); err != nil {
		db.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if err := migrateKeys(db); err != nil {
		db.Close()
		return nil, fmt.Errorf("migrate %s: %w", path, err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		db.Close()
		return nil, err
	}
	return &Store{db: db, path: path, file: fi}, nil
}

// Ping checks that the database answers a query and that its file is still
// the one opened: a file removed or replaced underneath would take every
// later write with it.
func (s *Store) Ping(ctx context.Context) error {
	var n int
	if err := s.db.QueryRowContext(ctx, "SELECT count(*) FROM projects").Scan(&n); err != nil {
		return fmt.Errorf("query: %w", err)
	}
	fi, err := os.Stat(s.path)
	if err != nil {
		return err
	}
	if !os.SameFile(fi, s.file) {
		return fmt.Errorf("%s was replaced since it was opened", s.path)
	}
	return nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

// CreateProject adds a project. An existing slug is ErrConflict.
func (s *Store) CreateProject(ctx context.Context, name, slug string) (store.Project, error) {
	p, err := store.NewProject(name, slug)
	if err != nil {
		return store.Project{}, err
	}
	_, err = s.db.ExecContext(ctx, `INSERT INTO projects(id, slug, name, created_at) VALUES(?,?,?,?)`,
		p.ID, p.Slug, p.Name, now())
	if err != nil {
		if isUnique(err) {
			return store.Project{}, store.ProjectExists(p.Slug)
		}
		return store.Project{}, err
	}
	return p, nil
}

// Projects lists all projects.
func (s *Store) Projects(ctx context.Context) ([]store.Project, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, slug, name FROM projects ORDER BY created_at, id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []store.Project{}
	for rows.Next() {
		var p store.Project
		if err := rows.Scan(&p.ID, &p.Slug, &p.Name); err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// ProjectByRef finds a project by id or slug.
func (s *Store) ProjectByRef(ctx context.Context, ref string) (store.Project, error) {
	var p store.Project
	err := s.db.QueryRowContext(ctx, `SELECT id, slug, name FROM projects WHERE id = ? OR slug = ?`, ref, ref).
		Scan(&p.ID, &p.Slug, &p.Name)
	if errors.Is(err, sql.ErrNoRows) {
		return store.Project{}, store.ProjectNotFound(ref)
	}
	return p, err
}

// isUnique reports whether err is SQLite refusing a duplicate key.
func isUnique(err error) bool {
	var se *sqlite.Error
	return errors.As(err, &se) && (se.Code() == sqlite3.SQLITE_CONSTRAINT_UNIQUE || se.Code() == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY)
}

// PutSandbox inserts or replaces a sandbox record.
func (s *Store) PutSandbox(ctx context.Context, sb store.Sandbox) error {
	_, err := s.db.ExecContext(ctx, upsertSandbox, sandboxArgs(sb)...)
	return err
}

// upsertSandbox inserts a sandbox row or updates what changes of it (its
// node never does).
const upsertSandbox = `INSERT INTO sandboxes(id, project_id, template, size, status, spec, started_at, end_at, pause_error, node, cpus, memory_mb)
		VALUES(?,?,?,?,?,?,?,?,?,?,?,?)
		ON CONFLICT(id) DO UPDATE SET status=excluded.status, spec=excluded.spec, end_at=excluded.end_at,
			pause_error=excluded.pause_error, cpus=excluded.cpus, memory_mb=excluded.memory_mb`

func sandboxArgs(sb store.Sandbox) []any {
	return []any{sb.ID, sb.ProjectID, sb.Template, sb.Size, sb.Status, string(sb.Spec), fmtTime(sb.StartedAt), fmtTimePtr(sb.EndAt),
		nullString(sb.PauseError), sb.Node, sb.CPUs, sb.MemoryMB}
}

// DeleteSandbox removes a record; a missing one is not an error.
func (s *Store) DeleteSandbox(ctx context.Context, id string) error {
	_, err := s.db.ExecContext(ctx, `DELETE FROM sandboxes WHERE id = ?`, id)
	return err
}

// Sandboxes lists every sandbox record.
func (s *Store) Sandboxes(ctx context.Context) ([]store.Sandbox, error) {
	return querySandboxes(ctx, s.db, `SELECT `+sandboxColumns+` FROM sandboxes`)
}

const sandboxColumns = `id, project_id, template, size, status, spec, started_at, end_at, pause_error, node, cpus, memory_mb`

// querySandboxes runs a query of sandboxColumns.
func querySandboxes(ctx context.Context, q interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, query string, args ...any) ([]store.Sandbox, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []store.Sandbox{}
	for rows.Next() {
		var sb store.Sandbox
		var spec, started string
		var end, perr sql.NullString
		if err := rows.Scan(&sb.ID, &sb.ProjectID, &sb.Template, &sb.Size, &sb.Status, &spec, &started, &end, &perr,
			&sb.Node, &sb.CPUs, &sb.MemoryMB); err != nil {
			return nil, err
		}
		sb.Spec = json.RawMessage(spec)
		sb.StartedAt, _ = time.Parse(time.RFC3339Nano, started)
		sb.EndAt = parseTimePtr(end)
		sb.PauseError = perr.String
		out = append(out, sb)
	}
	return out, rows.Err()
}

func now() string { return fmtTime(time.Now()) }

func fmtTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

func fmtTimePtr(t *time.Time) any {
	if t == nil {
		return nil
	}
	return fmtTime(*t)
}

func nullString(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// PutSnapshot inserts or replaces a snapshot record.
func (s *Store) PutSnapshot(ctx context.Context, sn store.Snapshot) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO snapshots(id, project_id, spec, created_at, node) VALUES(?,?,?,?,?)
		ON CONFLICT(id) DO UPDATE SET spec=excluded.spec`,
		sn.ID, sn.ProjectID, string(sn.Spec), fmtTime(sn.CreatedAt), sn.Node)
	return err
}

// DeleteSnapshot removes a snapshot record; a missing one is not an error.
func (s *Store) DeleteSnapshot(ctx context.Context, id string) error {
	_, err := s.db.ExecContext(ctx, `DELETE FROM snapshots WHERE id = ?`, id)
	return err
}

// Snapshots lists every snapshot record, oldest first.
func (s *Store) Snapshots(ctx context.Context) ([]store.Snapshot, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, project_id, spec, created_at, node, pool_node FROM snapshots ORDER BY created_at, id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []store.Snapshot{}
	for rows.Next() {
		var sn store.Snapshot
		var spec, created string
		if err := rows.Scan(&sn.ID, &sn.ProjectID, &spec, &created, &sn.Node, &sn.PoolNode); err != nil {
			return nil, err
		}
		sn.Spec = json.RawMessage(spec)
		sn.CreatedAt, _ = time.Parse(time.RFC3339Nano, created)
		out = append(out, sn)
	}
	return out, rows.Err()
}

// InsertVolume adds a volume; a name the project already has is
// ErrConflict.
func (s *Store) InsertVolume(ctx context.Context, v store.Volume) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO volumes(id, project_id, name, spec, created_at, node) VALUES(?,?,?,?,?,?)`,
		v.ID, v.ProjectID, v.Name, string(v.Spec), fmtTime(v.CreatedAt), v.Node)
	if isUnique(err) {
		return store.VolumeExists(v.Name)
	}
	return err
}

// UpdateVolume replaces a volume's spec and, when v.Node is set, its node.
func (s *Store) UpdateVolume(ctx context.Context, v store.Volume) error {
	_, err := s.db.ExecContext(ctx, `UPDATE volumes SET spec = ?, node = CASE WHEN ? = '' THEN node ELSE ? END WHERE id = ?`, string(v.Spec), v.Node, v.Node, v.ID)
	return err
}

// DeleteVolume removes a volume record; a missing one is not an error.
func (s *Store) DeleteVolume(ctx context.Context, id string) error {
	_, err := s.db.ExecContext(ctx, `DELETE FROM volumes WHERE id = ?`, id)
	return err
}

// Volumes lists every volume record, oldest first.
func (s *Store) Volumes(ctx context.Context) ([]store.Volume, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, project_id, name, spec, created_at, node FROM volumes ORDER BY created_at, id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []store.Volume{}
	for rows.Next() {
		var v store.Volume
		var spec, created string
		if err := rows.Scan(&v.ID, &v.ProjectID, &v.Name, &spec, &created, &v.Node); err != nil {
			return nil, err
		}
		v.Spec = json.RawMessage(spec)
		v.CreatedAt, _ = time.Parse(time.RFC3339Nano, created)
		out = append(out, v)
	}
	return out, rows.Err()
}
