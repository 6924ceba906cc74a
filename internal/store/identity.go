package store

import (
	"context"
	"fmt"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// SigningKey is one generation of the cluster's workload-token signing key
// (internal/identity): every node signs with the same keys.
type SigningKey struct {
	// ID is the key's id in tokens and the key set (kid).
	ID         string
	Generation int64
	Algorithm  string // the JWS alg, e.g. RS256
	// Public is the PKIX DER of the public key; Private the sealed
	// (internal/seal) PKCS #8 DER of the private key.
	Public     []byte
	Private    []byte
	CreatedAt  time.Time
	ActivateAt time.Time // it signs from then until the next generation does
}

// SandboxToken is a workload token a sandbox registered at its create: a
// name its egress transforms mint a token for, with the token's audience,
// type and lifetime.
type SandboxToken struct {
	ProjectID string
	SandboxID string
	Name      string
	Audience  string
	TokenType string
	Lifetime  time.Duration // whole seconds
}

// Identity is the part of the store that keeps the workload-identity
// issuer's signing keys and the sandboxes' registered tokens; both backends
// implement it.
type Identity interface {
	// InsertSigningKey adds a key; a generation or id that exists is
	// ErrConflict (another node made that generation first).
	InsertSigningKey(ctx context.Context, k SigningKey) error
	// SigningKeys lists every key, oldest generation first.
	SigningKeys(ctx context.Context) ([]SigningKey, error)
	// DeleteSigningKey removes a key; a missing one is not an error.
	DeleteSigningKey(ctx context.Context, id string) error
	// ResealSigningKey replaces a key's sealed private key old by new only
	// if it still holds old (a key rotation of the seal): false otherwise.
	ResealSigningKey(ctx context.Context, id string, old, new []byte) (bool, error)

	// PutSandboxTokens records the tokens of a project's sandbox, replacing
	// those it had. A sandbox without a record is ErrNotFound. The tokens
	// go with the sandbox's record (DeleteSandbox).
	PutSandboxTokens(ctx context.Context, projectID, sandboxID string, tokens []SandboxToken) error
	// SandboxTokens lists the tokens of a project's sandbox, by name (none:
	// empty, also for a sandbox that is gone or another project's).
	SandboxTokens(ctx context.Context, projectID, sandboxID string) ([]SandboxToken, error)
}

// SigningKeyExists is the error for a generation another node made first.
func SigningKeyExists(generation int64) error {
	return fmt.Errorf("signing key generation %d: %w", generation, errdefs.ErrConflict)
}

// SandboxGone is the error for tokens of a sandbox that has no record.
func SandboxGone(id string) error {
	return errdefs.WithCode("sandbox_not_found", fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound))
}
