// Package store keeps lizard's durable state — projects, API keys and
// sandbox records — in one SQLite database under the data directory. It knows
// nothing of runtimes or HTTP; the sandbox service and the CLI use it.
package store

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"

	"modernc.org/sqlite" // also registers the "sqlite" driver
	sqlite3 "modernc.org/sqlite/lib"
)

// Store is the SQLite-backed state. It is safe for concurrent use.
type Store struct {
	db   *sql.DB
	path string
	file os.FileInfo // the database file as opened, for Ping
}

// Open opens (creating if needed) the database at path.
func Open(path string) (*Store, error) {
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)&_pragma=foreign_keys(1)&_pragma=synchronous(NORMAL)")
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
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

// Project is a tenant: sandboxes and keys belong to one.
type Project struct {
	ID   string `json:"id"`
	Slug string `json:"slug"`
	Name string `json:"name"`
}

// NewID returns prefix followed by n random lowercase alphanumerics, the
// first of which is a letter (sandbox ids double as hostnames).
func NewID(prefix string, n int) string {
	const letters = "abcdefghijklmnopqrstuvwxyz"
	const alnum = letters + "0123456789"
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	out := make([]byte, n)
	for i := range b {
		set := alnum
		if i == 0 {
			set = letters
		}
		out[i] = set[int(b[i])%len(set)]
	}
	return prefix + string(out)
}

// Slugify turns a project name into a slug: lowercase letters, digits and dashes.
func Slugify(name string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(name) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
			dash = false
		case !dash && b.Len() > 0:
			b.WriteByte('-')
			dash = true
		}
	}
	return strings.TrimRight(b.String(), "-")
}

// CreateProject adds a project. An existing slug is ErrConflict.
func (s *Store) CreateProject(ctx context.Context, name, slug string) (Project, error) {
	if slug == "" {
		slug = Slugify(name)
	}
	if slug == "" || name == "" {
		return Project{}, fmt.Errorf("project name %q: needs at least one letter or digit: %w", name, errdefs.ErrInvalid)
	}
	p := Project{ID: NewID("prj_", 16), Slug: slug, Name: name}
	_, err := s.db.ExecContext(ctx, `INSERT INTO projects(id, slug, name, created_at) VALUES(?,?,?,?)`,
		p.ID, p.Slug, p.Name, now())
	if err != nil {
		if isUnique(err) {
			return Project{}, fmt.Errorf("project %q: %w", slug, errdefs.ErrConflict)
		}
		return Project{}, err
	}
	return p, nil
}

// Projects lists all projects.
func (s *Store) Projects(ctx context.Context) ([]Project, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, slug, name FROM projects ORDER BY created_at`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []Project{}
	for rows.Next() {
		var p Project
		if err := rows.Scan(&p.ID, &p.Slug, &p.Name); err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// ProjectByRef finds a project by id or slug.
func (s *Store) ProjectByRef(ctx context.Context, ref string) (Project, error) {
	var p Project
	err := s.db.QueryRowContext(ctx, `SELECT id, slug, name FROM projects WHERE id = ? OR slug = ?`, ref, ref).
		Scan(&p.ID, &p.Slug, &p.Name)
	if errors.Is(err, sql.ErrNoRows) {
		return Project{}, fmt.Errorf("project %q: %w", ref, errdefs.ErrNotFound)
	}
	return p, err
}

// isUnique reports whether err is SQLite refusing a duplicate key.
func isUnique(err error) bool {
	var se *sqlite.Error
	return errors.As(err, &se) && (se.Code() == sqlite3.SQLITE_CONSTRAINT_UNIQUE || se.Code() == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY)
}

// Sandbox is the durable record of one sandbox. Spec holds what the sandbox
// service needs to reattach after a restart; the store does not look inside.
type Sandbox struct {
	ID         string
	ProjectID  string
	Template   string
	Size       string
	Status     string
	Spec       json.RawMessage
	StartedAt  time.Time
	EndAt      *time.Time // nil: no deadline
	PauseError string
}

// PutSandbox inserts or replaces a sandbox record.
func (s *Store) PutSandbox(ctx context.Context, sb Sandbox) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO sandboxes(id, project_id, template, size, status, spec, started_at, end_at, pause_error)
		VALUES(?,?,?,?,?,?,?,?,?)
		ON CONFLICT(id) DO UPDATE SET status=excluded.status, spec=excluded.spec, end_at=excluded.end_at, pause_error=excluded.pause_error`,
		sb.ID, sb.ProjectID, sb.Template, sb.Size, sb.Status, string(sb.Spec), fmtTime(sb.StartedAt), fmtTimePtr(sb.EndAt), nullString(sb.PauseError))
	return err
}

// DeleteSandbox removes a record; a missing one is not an error.
func (s *Store) DeleteSandbox(ctx context.Context, id string) error {
	_, err := s.db.ExecContext(ctx, `DELETE FROM sandboxes WHERE id = ?`, id)
	return err
}

// Sandboxes lists every sandbox record.
func (s *Store) Sandboxes(ctx context.Context) ([]Sandbox, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, project_id, template, size, status, spec, started_at, end_at, pause_error FROM sandboxes`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Sandbox
	for rows.Next() {
		var sb Sandbox
		var spec, started string
		var end, perr sql.NullString
		if err := rows.Scan(&sb.ID, &sb.ProjectID, &sb.Template, &sb.Size, &sb.Status, &spec, &started, &end, &perr); err != nil {
			return nil, err
		}
		sb.Spec = json.RawMessage(spec)
		sb.StartedAt, _ = time.Parse(time.RFC3339Nano, started)
		if end.Valid {
			t, _ := time.Parse(time.RFC3339Nano, end.String)
			sb.EndAt = &t
		}
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

// Snapshot is the durable record of a sandbox snapshot; Spec is the
// sandbox service's own description of it.
type Snapshot struct {
	ID        string
	ProjectID string
	Spec      json.RawMessage
	CreatedAt time.Time
}

// PutSnapshot inserts or replaces a snapshot record.
func (s *Store) PutSnapshot(ctx context.Context, sn Snapshot) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO snapshots(id, project_id, spec, created_at) VALUES(?,?,?,?)
		ON CONFLICT(id) DO UPDATE SET spec=excluded.spec`,
		sn.ID, sn.ProjectID, string(sn.Spec), fmtTime(sn.CreatedAt))
	return err
}

// DeleteSnapshot removes a snapshot record; a missing one is not an error.
func (s *Store) DeleteSnapshot(ctx context.Context, id string) error {
	_, err := s.db.ExecContext(ctx, `DELETE FROM snapshots WHERE id = ?`, id)
	return err
}

// Snapshots lists every snapshot record, oldest first.
func (s *Store) Snapshots(ctx context.Context) ([]Snapshot, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, project_id, spec, created_at FROM snapshots ORDER BY created_at`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Snapshot
	for rows.Next() {
		var sn Snapshot
		var spec, created string
		if err := rows.Scan(&sn.ID, &sn.ProjectID, &spec, &created); err != nil {
			return nil, err
		}
		sn.Spec = json.RawMessage(spec)
		sn.CreatedAt, _ = time.Parse(time.RFC3339Nano, created)
		out = append(out, sn)
	}
	return out, rows.Err()
}

// Volume is the durable record of a volume; Spec is the volume manager's own
// description of it.
type Volume struct {
	ID        string
	ProjectID string
	Name      string
	Spec      json.RawMessage
	CreatedAt time.Time
}

// InsertVolume adds a volume; a name the project already has is
// ErrConflict.
func (s *Store) InsertVolume(ctx context.Context, v Volume) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO volumes(id, project_id, name, spec, created_at) VALUES(?,?,?,?,?)`,
		v.ID, v.ProjectID, v.Name, string(v.Spec), fmtTime(v.CreatedAt))
	if isUnique(err) {
		return fmt.Errorf("volume %q: %w", v.Name, errdefs.ErrConflict)
	}
	return err
}

// UpdateVolume replaces a volume's spec.
func (s *Store) UpdateVolume(ctx context.Context, v Volume) error {
	_, err := s.db.ExecContext(ctx, `UPDATE volumes SET spec = ? WHERE id = ?`, string(v.Spec), v.ID)
	return err
}

// DeleteVolume removes a volume record; a missing one is not an error.
func (s *Store) DeleteVolume(ctx context.Context, id string) error {
	_, err := s.db.ExecContext(ctx, `DELETE FROM volumes WHERE id = ?`, id)
	return err
}

// Volumes lists every volume record, oldest first.
func (s *Store) Volumes(ctx context.Context) ([]Volume, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, project_id, name, spec, created_at FROM volumes ORDER BY created_at`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Volume
	for rows.Next() {
		var v Volume
		var spec, created string
		if err := rows.Scan(&v.ID, &v.ProjectID, &v.Name, &spec, &created); err != nil {
			return nil, err
		}
		v.Spec = json.RawMessage(spec)
		v.CreatedAt, _ = time.Parse(time.RFC3339Nano, created)
		out = append(out, v)
	}
	return out, rows.Err()
}
