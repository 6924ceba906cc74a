package store

import (
	"context"
	"fmt"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// Secret is a project's secret as stored: its value sealed (internal/seal),
// never in clear. Only the current version's value is kept.
type Secret struct {
	ID        string
	ProjectID string
	Name      string
	// Version is 1 for a new secret and grows by one with each update.
	Version int64
	// Value is the sealed value; the store does not look inside.
	Value     []byte
	Metadata  map[string]string // never nil from the store
	CreatedAt time.Time
	UpdatedAt time.Time
}

// Secrets is the part of the store that keeps projects' secrets
// (internal/secrets); both backends implement it. Every method but the
// rotation's two works inside one project: another project's secret is
// not found.
type Secrets interface {
	// InsertSecret adds s at version 1, its times the store's now, and
	// returns it as stored. A name the project has is ErrConflict; an
	// unknown project is ErrNotFound.
	InsertSecret(ctx context.Context, s Secret) (Secret, error)
	// SecretByID and SecretByName find a project's secret; none is
	// ErrNotFound.
	SecretByID(ctx context.Context, projectID, id string) (Secret, error)
	SecretByName(ctx context.Context, projectID, name string) (Secret, error)
	// SecretsAfter lists at most limit of a project's secrets whose names
	// sort after after ("" from the first), by name.
	SecretsAfter(ctx context.Context, projectID, after string, limit int) ([]Secret, error)
	// UpdateSecret gives a project's secret a new sealed value at the next
	// version, and metadata when it is not nil (an empty map clears it),
	// and returns it as stored. None is ErrNotFound.
	UpdateSecret(ctx context.Context, projectID, id string, value []byte, metadata map[string]string) (Secret, error)
	// DeleteSecret removes a project's secret; none is ErrNotFound.
	DeleteSecret(ctx context.Context, projectID, id string) error

	// AllSecrets lists every project's secrets (a key rotation).
	AllSecrets(ctx context.Context) ([]Secret, error)
	// ResealSecret replaces a secret's sealed value old by new, version
	// and times unchanged, only if it still holds old: false when an
	// update or a delete came first.
	ResealSecret(ctx context.Context, id string, old, new []byte) (bool, error)
}

// SecretNotFound is the error for a secret a project does not have.
func SecretNotFound(ref string) error {
	return errdefs.WithCode("secret_not_found", fmt.Errorf("secret %q: %w", ref, errdefs.ErrNotFound))
}

// SecretExists is the error for a name a project has already.
func SecretExists(name string) error {
	return errdefs.WithCode("secret_exists", fmt.Errorf("secret %q: the project has one of that name: %w", name, errdefs.ErrConflict))
}
