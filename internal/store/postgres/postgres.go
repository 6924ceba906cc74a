// Package postgres is the store backend on PostgreSQL (pgx): one database
// that every server of a cluster and the operator CLI share. Only the
// wiring (cmd/lizard) imports it; everything else uses store.Store.
//
// Times that the database decides (a project's or key's creation, a
// revocation) are its clock's now(), so that they do not depend on which
// node wrote them.
package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/tcpdial"
)

// Store is the PostgreSQL-backed state. It is safe for concurrent use.
type Store struct {
	pool *pgxpool.Pool
}

var _ store.Store = (*Store)(nil)

// Open connects to the database at url (postgres://… or a key=value
// connection string) and brings its schema up to date; a newer schema is
// store.ErrSchemaNewer. A malformed url is ErrInvalid.
func Open(ctx context.Context, url string) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		// pgx's message may quote the url, password included.
		return nil, fmt.Errorf("database url: not a PostgreSQL connection string: %w", errdefs.ErrInvalid)
	}
	// A database that vanishes (a partition, its host gone) fails queries
	// in seconds instead of hanging them: creates and lifecycle changes
	// answer 503 while running sandboxes keep serving.
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = tcpdial.DialTimeout
	}
	cfg.ConnConfig.DialFunc = tcpdial.New().DialContext
	// A node cut off from the database in the middle of a transaction
	// leaves its session idle in that transaction, holding its row locks
	// (its node row, under every fenced write) until TCP gives up, hours
	// later: no other node could declare it dead meanwhile. Every
	// transaction here is statements only, so a session idle in one for
	// longer than this is gone, and the server ends it.
	for name, value := range sessionLimits {
		if _, set := cfg.ConnConfig.RuntimeParams[name]; !set {
			cfg.ConnConfig.RuntimeParams[name] = value
		}
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", describe(cfg), err)
	}
	if err := migrate(ctx, pool); err != nil {
		pool.Close()
		return nil, fmt.Errorf("%s: %w", describe(cfg), err)
	}
	return &Store{pool: pool}, nil
}

// sessionLimits are the session settings Open gives every connection,
// unless the url sets them: a session idle in a transaction for 10 s is
// ended (idle_in_transaction_session_timeout), and so is one whose client
// does not acknowledge what the server sends for 10 s (tcp_user_timeout).
var sessionLimits = map[string]string{
	"idle_in_transaction_session_timeout": "10s",
	"tcp_user_timeout":                    "10000",
}

// describe names a database for messages, without its password.
func describe(cfg *pgxpool.Config) string {
	c := cfg.ConnConfig
	return fmt.Sprintf("postgres database %q on %s:%d", c.Database, c.Host, c.Port)
}

// Ping checks that the database answers a query on the schema.
func (s *Store) Ping(ctx context.Context) error {
	var n int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM key_generation`).Scan(&n); err != nil {
		return fmt.Errorf("query: %w", err)
	}
	return nil
}

// Close closes every connection.
func (s *Store) Close() error {
	s.pool.Close()
	return nil
}

// isUnique reports whether err is PostgreSQL refusing a duplicate key.
func isUnique(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505" // unique_violation
}

// CreateProject adds a project. An existing slug is ErrConflict.
func (s *Store) CreateProject(ctx context.Context, name, slug string) (store.Project, error) {
	p, err := store.NewProject(name, slug)
	if err != nil {
		return store.Project{}, err
	}
	_, err = s.pool.Exec(ctx, `INSERT INTO projects(id, slug, name) VALUES($1, $2, $3)`, p.ID, p.Slug, p.Name)
	if isUnique(err) {
		return store.Project{}, store.ProjectExists(p.Slug)
	}
	if err != nil {
		return store.Project{}, err
	}
	return p, nil
}

// Projects lists all projects, oldest first.
func (s *Store) Projects(ctx context.Context) ([]store.Project, error) {
	rows, _ := s.pool.Query(ctx, `SELECT id, slug, name FROM projects ORDER BY created_at, id`)
	return collect(rows, func(r pgx.CollectableRow) (p store.Project, err error) {
		err = r.Scan(&p.ID, &p.Slug, &p.Name)
		return p, err
	})
}

// ProjectByRef finds a project by id or slug.
func (s *Store) ProjectByRef(ctx context.Context, ref string) (store.Project, error) {
	var p store.Project
	err := s.pool.QueryRow(ctx, `SELECT id, slug, name FROM projects WHERE id = $1 OR slug = $1`, ref).
		Scan(&p.ID, &p.Slug, &p.Name)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Project{}, store.ProjectNotFound(ref)
	}
	return p, err
}

// collect reads every row with scan; an empty result is an empty slice. A
// query that failed reports its error through rows (pgx's idiom), so
// callers pass Query's rows without checking its error.
func collect[T any](rows pgx.Rows, scan pgx.RowToFunc[T]) ([]T, error) {
	out, err := pgx.CollectRows(rows, scan)
	if err != nil {
		return nil, err
	}
	if out == nil {
		out = []T{}
	}
	return out, nil
}

// PutSandbox inserts a sandbox record or updates the one with its id.
func (s *Store) PutSandbox(ctx context.Context, sb store.Sandbox) error {
	_, err := s.pool.Exec(ctx, upsertSandbox, sandboxArgs(sb)...)
	return err
}

// upsertSandbox inserts a sandbox row or updates what changes of it (its
// node never does).
const upsertSandbox = `INSERT INTO sandboxes(id, project_id, template, size, status, spec, started_at, end_at, pause_error, node, cpus, memory_mb)
		VALUES($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
		ON CONFLICT(id) DO UPDATE SET status = excluded.status, spec = excluded.spec, end_at = excluded.end_at,
			pause_error = excluded.pause_error, cpus = excluded.cpus, memory_mb = excluded.memory_mb`

func sandboxArgs(sb store.Sandbox) []any {
	return []any{sb.ID, sb.ProjectID, sb.Template, sb.Size, sb.Status, string(sb.Spec), sb.StartedAt, sb.EndAt,
		nullString(sb.PauseError), sb.Node, sb.CPUs, sb.MemoryMB}
}

func nullString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// DeleteSandbox removes a record; a missing one is not an error.
func (s *Store) DeleteSandbox(ctx context.Context, id string) error {
	_, err := s.pool.Exec(ctx, `DELETE FROM sandboxes WHERE id = $1`, id)
	return err
}

// Sandboxes lists every sandbox record.
func (s *Store) Sandboxes(ctx context.Context) ([]store.Sandbox, error) {
	rows, _ := s.pool.Query(ctx, `SELECT `+sandboxColumns+` FROM sandboxes`)
	return collect(rows, scanSandbox)
}

const sandboxColumns = `id, project_id, template, size, status, spec::text, started_at, end_at, coalesce(pause_error, ''), node, cpus, memory_mb`

func scanSandbox(r pgx.CollectableRow) (sb store.Sandbox, err error) {
	var spec string
	err = r.Scan(&sb.ID, &sb.ProjectID, &sb.Template, &sb.Size, &sb.Status, &spec, &sb.StartedAt, &sb.EndAt, &sb.PauseError,
		&sb.Node, &sb.CPUs, &sb.MemoryMB)
	sb.Spec = json.RawMessage(spec)
	sb.StartedAt, sb.EndAt = sb.StartedAt.UTC(), utcPtr(sb.EndAt)
	return sb, err
}

// PutSnapshot inserts a snapshot record or updates its spec.
func (s *Store) PutSnapshot(ctx context.Context, sn store.Snapshot) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO snapshots(id, project_id, spec, created_at, node) VALUES($1, $2, $3, $4, $5)
		ON CONFLICT(id) DO UPDATE SET spec = excluded.spec`,
		sn.ID, sn.ProjectID, string(sn.Spec), sn.CreatedAt, sn.Node)
	return err
}

// DeleteSnapshot removes a snapshot record; a missing one is not an error.
func (s *Store) DeleteSnapshot(ctx context.Context, id string) error {
	_, err := s.pool.Exec(ctx, `DELETE FROM snapshots WHERE id = $1`, id)
	return err
}

// Snapshots lists every snapshot record, oldest first.
func (s *Store) Snapshots(ctx context.Context) ([]store.Snapshot, error) {
	rows, _ := s.pool.Query(ctx, `SELECT id, project_id, spec::text, created_at, node, pool_node FROM snapshots ORDER BY created_at, id`)
	return collect(rows, func(r pgx.CollectableRow) (sn store.Snapshot, err error) {
		var spec string
		err = r.Scan(&sn.ID, &sn.ProjectID, &spec, &sn.CreatedAt, &sn.Node, &sn.PoolNode)
		sn.Spec, sn.CreatedAt = json.RawMessage(spec), sn.CreatedAt.UTC()
		return sn, err
	})
}

// InsertVolume adds a volume; a name the project already has is
// ErrConflict.
func (s *Store) InsertVolume(ctx context.Context, v store.Volume) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO volumes(id, project_id, name, spec, created_at, node) VALUES($1, $2, $3, $4, $5, $6)`,
		v.ID, v.ProjectID, v.Name, string(v.Spec), v.CreatedAt, v.Node)
	if isUnique(err) {
		return store.VolumeExists(v.Name)
	}
	return err
}

// UpdateVolume replaces a volume's spec and, when v.Node is set, its node
// (a volume moves to the node that attaches it).
func (s *Store) UpdateVolume(ctx context.Context, v store.Volume) error {
	_, err := s.pool.Exec(ctx, `UPDATE volumes SET spec = $1, node = CASE WHEN $3 = '' THEN node ELSE $3 END WHERE id = $2`, string(v.Spec), v.ID, v.Node)
	return err
}

// DeleteVolume removes a volume record; a missing one is not an error.
func (s *Store) DeleteVolume(ctx context.Context, id string) error {
	_, err := s.pool.Exec(ctx, `DELETE FROM volumes WHERE id = $1`, id)
	return err
}

// Volumes lists every volume record, oldest first.
func (s *Store) Volumes(ctx context.Context) ([]store.Volume, error) {
	rows, _ := s.pool.Query(ctx, `SELECT id, project_id, name, spec::text, created_at, node FROM volumes ORDER BY created_at, id`)
	return collect(rows, func(r pgx.CollectableRow) (v store.Volume, err error) {
		var spec string
		err = r.Scan(&v.ID, &v.ProjectID, &v.Name, &spec, &v.CreatedAt, &v.Node)
		v.Spec, v.CreatedAt = json.RawMessage(spec), v.CreatedAt.UTC()
		return v, err
	})
}

// utcPtr is t in UTC, nil for nil.
func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}
