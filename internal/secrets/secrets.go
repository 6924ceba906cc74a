// Package secrets keeps projects' secrets: named values that sandboxes never
// see, which the egress proxy puts into outbound requests in their place
// (${e2b.secrets.NAME} in a header transform). Values are write-only: the
// service takes them at create and update, keeps them sealed in the store
// (internal/seal, under the operator's key) and gives them back only to
// SecretValue, which the egress proxy calls; no answer, log line or error
// of this package holds one. Both APIs serve it (E2B's /secrets in
// internal/e2b, /api/projects/{pid}/secrets in internal/api), and
// `lizard secrets rotate-key` reseals every value under a new key. Only
// cmd/lizard wires it.
package secrets

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/seal"
	"github.com/lizard-build/lizard/internal/store"
)

// Limits of a secret, as E2B's API has them (metadata) or chosen here
// (a value is sent as an HTTP header value, so it stays well below what
// servers accept as a header).
const (
	MaxNameBytes      = 128
	MaxValueBytes     = 32 << 10
	MaxMetadata       = 32
	MaxMetaKeyBytes   = 128
	MaxMetaValueBytes = 1024
	MaxMetadataBytes  = 8192
	DefaultPageSize   = 100
	MaxPageSize       = 100
)

// IDPrefix starts every secret's id; no name may start with it, so that a
// reference is an id or a name, never both.
const IDPrefix = "sec_"

// Info is a secret as the APIs show it: never its value.
type Info struct {
	ID        string
	Name      string
	Version   int64
	Metadata  map[string]string
	CreatedAt time.Time
	UpdatedAt time.Time
}

func infoOf(s store.Secret) Info {
	return Info{ID: s.ID, Name: s.Name, Version: s.Version, Metadata: s.Metadata, CreatedAt: s.CreatedAt, UpdatedAt: s.UpdatedAt}
}

// Service keeps the secrets of every project.
type Service struct {
	store store.Secrets
	keys  *seal.Keyring
}

// New returns the service over st. keys seals values; nil when the operator
// configured no key: then creating and updating a secret are refused
// (403 secrets_disabled) and no value resolves, while listing, reading a
// secret's metadata and deleting it still work.
func New(st store.Secrets, keys *seal.Keyring) *Service {
	return &Service{store: st, keys: keys}
}

// ErrDisabled is the error of what needs a key when none is configured.
func errDisabled() error {
	return errdefs.WithCode("secrets_disabled", fmt.Errorf("secrets are disabled on this server: its operator has configured no key (--secrets-key-file or LIZARD_SECRETS_KEY): %w", errdefs.ErrPermission))
}

// ad is what a secret's sealed value is bound to: its project and id, so
// that a value copied onto another secret's row does not open.
func ad(projectID, id string) []byte { return []byte("lizard secret\x00" + projectID + "\x00" + id) }

// Create makes a project's secret at version 1. A name the project has is
// 409 secret_exists.
func (s *Service) Create(ctx context.Context, projectID string, req NewSecret) (Info, error) {
	if s.keys == nil {
		return Info{}, errDisabled()
	}
	id := store.NewID(IDPrefix, 26)
	value := []byte(req.Value)
	defer clear(value)
	sec, err := s.store.InsertSecret(ctx, store.Secret{ID: id, ProjectID: projectID, Name: req.Name, Value: s.keys.Seal(value, ad(projectID, id)), Metadata: req.Metadata})
	if err != nil {
		return Info{}, err
	}
	return infoOf(sec), nil
}

// Get returns a project's secret by id or name (Ref's rules).
func (s *Service) Get(ctx context.Context, projectID, ref string) (Info, error) {
	sec, err := s.lookup(ctx, projectID, ref)
	if err != nil {
		return Info{}, err
	}
	return infoOf(sec), nil
}

// Update gives a project's secret (by id or name) a new value at the next
// version, and new metadata when req has some.
func (s *Service) Update(ctx context.Context, projectID, ref string, req SecretUpdate) (Info, error) {
	if s.keys == nil {
		return Info{}, errDisabled()
	}
	sec, err := s.lookup(ctx, projectID, ref)
	if err != nil {
		return Info{}, err
	}
	value := []byte(req.Value)
	defer clear(value)
	up, err := s.store.UpdateSecret(ctx, projectID, sec.ID, s.keys.Seal(value, ad(projectID, sec.ID)), req.Metadata)
	if err != nil {
		return Info{}, err
	}
	return infoOf(up), nil
}

// Delete removes a project's secret (by id or name): from the next request
// on, a placeholder naming it resolves to nothing.
func (s *Service) Delete(ctx context.Context, projectID, ref string) error {
	sec, err := s.lookup(ctx, projectID, ref)
	if err != nil {
		return err
	}
	return s.store.DeleteSecret(ctx, projectID, sec.ID)
}

// List returns a page of a project's secrets by name, and the token of the
// next page ("" after the last).
func (s *Service) List(ctx context.Context, projectID string, page Page) ([]Info, string, error) {
	secs, err := s.store.SecretsAfter(ctx, projectID, page.after, page.limit+1)
	if err != nil {
		return nil, "", err
	}
	next := ""
	if len(secs) > page.limit {
		secs = secs[:page.limit]
		next = base64.RawURLEncoding.EncodeToString([]byte(secs[len(secs)-1].Name))
	}
	out := make([]Info, 0, len(secs))
	for _, sec := range secs {
		out = append(out, infoOf(sec))
	}
	return out, next, nil
}

// SecretValue is the current value of a project's secret named name (as a
// ${e2b.secrets.NAME} placeholder names it: case does not matter), for the
// egress proxy. A name the project has no secret of is an error wrapping
// errdefs.ErrNotFound; a value that does not open (the server lacks the key
// that sealed it) errdefs.ErrUnavailable. Neither holds the value.
func (s *Service) SecretValue(ctx context.Context, projectID, name string) (string, error) {
	sec, err := s.byName(ctx, projectID, name)
	if err != nil {
		return "", err
	}
	if s.keys == nil {
		return "", fmt.Errorf("secret %q: %w", sec.Name, errDisabled())
	}
	v, err := s.keys.Open(sec.Value, ad(projectID, sec.ID))
	if err != nil {
		return "", fmt.Errorf("secret %q: %w", sec.Name, err)
	}
	return string(v), nil
}

// SecretExists reports whether the project has a secret named name (case
// does not matter): what a network configuration's placeholders are checked
// against when it is set. Its error is the store's, never "not found".
func (s *Service) SecretExists(ctx context.Context, projectID, name string) (bool, error) {
	_, err := s.byName(ctx, projectID, name)
	if errors.Is(err, errdefs.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

func (s *Service) byName(ctx context.Context, projectID, name string) (store.Secret, error) {
	n, err := NormalizeName(name)
	if err != nil {
		return store.Secret{}, store.SecretNotFound(name)
	}
	return s.store.SecretByName(ctx, projectID, n)
}

// lookup finds a project's secret by a reference as the routes take it: an
// id (starting sec_, any case) or a name. A reference that is neither is
// 400 naming field.
func (s *Service) lookup(ctx context.Context, projectID, ref string) (store.Secret, error) {
	r := strings.ToLower(strings.TrimSpace(ref))
	if strings.HasPrefix(r, IDPrefix) {
		return s.store.SecretByID(ctx, projectID, r)
	}
	name, err := NormalizeName(ref)
	if err != nil {
		return store.Secret{}, fmt.Errorf("secret reference: not a secret id (%s…) or name: %w", IDPrefix, err)
	}
	return s.store.SecretByName(ctx, projectID, name)
}

// Reseal seals every secret that the current key did not seal again under
// it (a key rotation: the keyring holds the new key as current and the old
// ones as previous). A secret updated or deleted meanwhile is left as the
// update made it. It returns how many it resealed; a value no key of the
// keyring opens stops it with an error naming the secret and the key.
func (s *Service) Reseal(ctx context.Context) (int, error) {
	if s.keys == nil {
		return 0, errDisabled()
	}
	all, err := s.store.AllSecrets(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, sec := range all {
		if s.keys.IsCurrent(sec.Value) {
			continue
		}
		resealed, err := s.keys.Reseal(sec.Value, ad(sec.ProjectID, sec.ID))
		if err != nil {
			return n, fmt.Errorf("secret %s (%q of project %s): %w", sec.ID, sec.Name, sec.ProjectID, err)
		}
		ok, err := s.store.ResealSecret(ctx, sec.ID, sec.Value, resealed)
		if err != nil {
			return n, err
		}
		if ok {
			n++
		}
	}
	return n, nil
}

// Sealed counts every project's secrets by the fingerprint of the key that
// sealed them: what `lizard secrets rotate-key` shows, so that the operator
// sees that no value needs a previous key before dropping it.
func (s *Service) Sealed(ctx context.Context) (map[string]int, error) {
	all, err := s.store.AllSecrets(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, sec := range all {
		out[seal.SealedWith(sec.Value)]++
	}
	return out, nil
}

// errInvalid is a 400 naming a field.
func errInvalid(field, format string, args ...any) error {
	return fmt.Errorf("%s: %s: %w", field, fmt.Sprintf(format, args...), errdefs.ErrInvalid)
}
