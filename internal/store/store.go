// Package store is the contract for lizard's durable state — projects, API
// keys, and sandbox, snapshot and volume records — and the types that cross
// it. It knows nothing of runtimes or HTTP; the sandbox service, the volume
// manager, the API's key view and the CLI use it.
//
// Each database is a backend in a subpackage: store/sqlite (the embedded
// default, one file under the data directory) and store/postgres (one
// database shared by every server of a cluster). Both pass the one
// conformance suite in store/storetest. Each keeps its schema in numbered
// migrations embedded in the binary, applies them at open (each in a
// transaction with its version) and refuses a schema newer than it knows
// (ErrSchemaNewer).
package store

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// Store is lizard's durable state. Implementations are safe for concurrent
// use, by several goroutines and by several processes on the same database
// (the server and the CLI). Every change of more than one row is one
// transaction. Lists are never nil on success.
type Store interface {
	// Ping checks that the database answers and is still the one opened.
	Ping(ctx context.Context) error
	// Close releases the database; later calls fail.
	Close() error
	// SchemaVersion is the schema version of the open database.
	SchemaVersion(ctx context.Context) (int, error)

	// CreateProject adds a project named name with slug (the slug of name
	// when empty). An existing slug is ErrConflict; a name without a
	// letter or digit is ErrInvalid.
	CreateProject(ctx context.Context, name, slug string) (Project, error)
	// Projects lists every project, oldest first.
	Projects(ctx context.Context) ([]Project, error)
	// ProjectByRef finds a project by id or slug; none is ErrNotFound.
	ProjectByRef(ctx context.Context, ref string) (Project, error)

	// CreateKey makes an API key for a project and returns its secret,
	// which is stored only as its hash (HashKey). A non-empty secret is
	// used as given (ErrInvalid below 16 characters, ErrConflict if
	// another key has it). It bumps the key generation.
	CreateKey(ctx context.Context, projectID, secret string) (string, error)
	// NewKey is CreateKey that also returns the key as Keys lists it.
	NewKey(ctx context.Context, projectID, secret string) (Key, string, error)
	// RevokeKey revokes a key by id and bumps the key generation. Revoking
	// a revoked key changes nothing; an unknown id is ErrNotFound.
	RevokeKey(ctx context.Context, id string) error
	// KeyGeneration is a number that changes whenever a key is created or
	// revoked, by this process or another one on the same database.
	KeyGeneration(ctx context.Context) (int64, error)
	// ActiveKeys lists every key that is not revoked, with its project.
	ActiveKeys(ctx context.Context) ([]ActiveKey, error)
	// Keys lists a project's keys, revoked ones included, oldest first.
	Keys(ctx context.Context, projectID string) ([]Key, error)
	// TouchKeys records when keys were last used, in one transaction;
	// ids of keys that no longer exist are ignored.
	TouchKeys(ctx context.Context, used map[string]time.Time) error

	// PutSandbox inserts a sandbox record, or updates its status, spec,
	// deadline and pause error if the id exists.
	PutSandbox(ctx context.Context, sb Sandbox) error
	// DeleteSandbox removes a record; a missing one is not an error.
	DeleteSandbox(ctx context.Context, id string) error
	// Sandboxes lists every sandbox record.
	Sandboxes(ctx context.Context) ([]Sandbox, error)

	// PutSnapshot inserts a snapshot record, or updates its spec.
	PutSnapshot(ctx context.Context, sn Snapshot) error
	// DeleteSnapshot removes a record; a missing one is not an error.
	DeleteSnapshot(ctx context.Context, id string) error
	// Snapshots lists every snapshot record, oldest first.
	Snapshots(ctx context.Context) ([]Snapshot, error)

	// InsertVolume adds a volume; a name the project already has is
	// ErrConflict.
	InsertVolume(ctx context.Context, v Volume) error
	// UpdateVolume replaces a volume's spec and, when v.Node is set, the
	// node that holds it.
	UpdateVolume(ctx context.Context, v Volume) error
	// DeleteVolume removes a record; a missing one is not an error.
	DeleteVolume(ctx context.Context, id string) error
	// Volumes lists every volume record, oldest first.
	Volumes(ctx context.Context) ([]Volume, error)

	// SetProjectLimit sets one of a project's limits (value >= 0, 0 = no
	// limit); nil goes back to the server's default. An unknown limit or
	// a negative value is ErrInvalid.
	SetProjectLimit(ctx context.Context, projectID string, l Limit, value *int) error
	// ProjectOverrides returns the limits a project has of its own (none:
	// an empty map).
	ProjectOverrides(ctx context.Context, projectID string) (Overrides, error)
	// SetDefaultLimits records the server's default limits, so that the
	// CLI shows the limits in force.
	SetDefaultLimits(ctx context.Context, ls Limits) error
	// DefaultLimits returns what SetDefaultLimits recorded; ok is false
	// when no server has recorded them on this database.
	DefaultLimits(ctx context.Context) (ls Limits, ok bool, err error)
}

// ErrSchemaNewer is returned at open for a database whose schema version is
// newer than this binary knows: it was written by a newer lizard.
var ErrSchemaNewer = errors.New("database schema is newer than this lizard")

// SchemaNewer is the error for a database at version have when this binary
// knows up to want.
func SchemaNewer(have, want int) error {
	return fmt.Errorf("schema version %d, this lizard knows up to %d (upgrade lizard, or restore a backup this version made): %w",
		have, want, ErrSchemaNewer)
}

// Project is a tenant: sandboxes and keys belong to one.
type Project struct {
	ID   string `json:"id"`
	Slug string `json:"slug"`
	Name string `json:"name"`
}

// NewProject validates a new project's name and slug (the slug of name when
// empty) and gives it an id.
func NewProject(name, slug string) (Project, error) {
	if slug == "" {
		slug = Slugify(name)
	}
	if slug == "" || name == "" {
		return Project{}, fmt.Errorf("project name %q: needs at least one letter or digit: %w", name, errdefs.ErrInvalid)
	}
	return Project{ID: NewID("prj_", 16), Slug: slug, Name: name}, nil
}

// ProjectExists is the error for a slug that is taken.
func ProjectExists(slug string) error { return fmt.Errorf("project %q: %w", slug, errdefs.ErrConflict) }

// ProjectNotFound is the error for a ref that names no project.
func ProjectNotFound(ref string) error { return fmt.Errorf("project %q: %w", ref, errdefs.ErrNotFound) }

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

// Key is an API key as listed: never its secret, which is stored only as a
// hash.
type Key struct {
	ID        string
	ProjectID string
	Prefix    string // the first characters of the secret, to recognize it
	CreatedAt time.Time
	LastUsed  *time.Time // nil: never used (or not yet recorded)
	RevokedAt *time.Time // nil: valid
}

// ActiveKey is a valid key as the server authenticates it: the SHA-256 of
// its secret (hex) and its project.
type ActiveKey struct {
	ID      string
	Hash    string
	Project Project
}

// HashKey is the SHA-256 of a secret as the store keeps it (hex).
func HashKey(secret string) string {
	h := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(h[:])
}

// NewKey is a key about to be stored: what a backend inserts.
type NewKey struct {
	ID, Secret, Hash, Prefix string
}

// MakeKey validates a secret (a new random one when empty) and derives what
// is stored of it: its hash and a prefix that is enough to tell keys apart,
// never more than a third of the secret.
func MakeKey(secret string) (NewKey, error) {
	if secret == "" {
		secret = NewID("lz_", 40)
	}
	if len(secret) < 16 {
		return NewKey{}, fmt.Errorf("API key: must be at least 16 characters: %w", errdefs.ErrInvalid)
	}
	return NewKey{ID: NewID("key_", 16), Secret: secret, Hash: HashKey(secret), Prefix: secret[:min(10, len(secret)/3)]}, nil
}

// KeyExists is the error for a secret another key has.
func KeyExists() error { return fmt.Errorf("API key: %w", errdefs.ErrConflict) }

// KeyNotFound is the error for an unknown key id.
func KeyNotFound(id string) error { return fmt.Errorf("API key %q: %w", id, errdefs.ErrNotFound) }

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
	// Node holds the sandbox in cluster mode ("" on a single server).
	Node string
	// CPUs and MemoryMB are what it reserves while it holds resources:
	// what cluster admission sums (Cluster.PutSandboxFenced).
	CPUs     float64
	MemoryMB int64
}

// Snapshot is the durable record of a sandbox snapshot; Spec is the
// sandbox service's own description of it.
type Snapshot struct {
	ID        string
	ProjectID string
	Node      string // the node whose disk holds it in cluster mode; "" on a single server
	// PoolNode keeps its warm copies in cluster mode ("": Node). Only
	// Cluster.AdoptPool changes it; PutSnapshot leaves it.
	PoolNode  string
	Spec      json.RawMessage
	CreatedAt time.Time
}

// KeepsPool is the node that keeps sn's warm copies.
func (sn Snapshot) KeepsPool() string {
	if sn.PoolNode != "" {
		return sn.PoolNode
	}
	return sn.Node
}

// Volume is the durable record of a volume; Spec is the volume manager's own
// description of it.
type Volume struct {
	ID        string
	ProjectID string
	Node      string // the node whose disk holds it in cluster mode; "" on a single server
	Name      string
	Spec      json.RawMessage
	CreatedAt time.Time
}

// VolumeExists is the error for a volume name the project already has.
func VolumeExists(name string) error { return fmt.Errorf("volume %q: %w", name, errdefs.ErrConflict) }
