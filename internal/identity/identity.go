// Package identity is lizard's workload-identity issuer: an OpenID Connect
// issuer (its discovery document and key set at --oidc-issuer) whose
// short-lived JWTs name a project's sandbox, so that a cloud provider that
// trusts the issuer trusts sandboxes without any long-lived key. A sandbox
// registers named tokens at its create (E2B's iam.tokens: an audience and a
// type, here also a lifetime); the egress proxy mints one per outbound
// request whose transform says ${e2b.identity.tokens.NAME} (MintToken), and
// the Lizard API mints one on request. The signing keys are the cluster's
// (kept in the store, their private halves sealed with internal/seal, so
// every node signs with the same keys), rotated with overlap: a new key is
// published before it signs, and an old one stays published until every
// token it signed has expired. Only cmd/lizard wires it.
package identity

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/seal"
	"github.com/lizard-build/lizard/internal/store"
)

// Algorithm signs every token: RS256, which every cloud's OIDC federation
// accepts.
const Algorithm = "RS256"

// TokenType is the one type of token there is, as E2B's API has it.
const TokenType = "JWT-SVID"

// Bounds of a token's lifetime, and the default.
const (
	MinLifetime     = time.Minute
	MaxLifetime     = time.Hour
	DefaultLifetime = 5 * time.Minute
)

// MaxTokens is how many tokens a sandbox may register (E2B's cap).
const MaxTokens = 5

// Key life: a rotation's key is published PublishAhead before it signs, so
// that relying parties that cache the key set have it; a key stays published
// for MaxLifetime (its last tokens) plus Grace (nodes notice a new key within
// reloadEvery; clocks differ) after its successor starts signing.
const (
	PublishAhead    = time.Hour
	Grace           = 5 * time.Minute
	DefaultRotation = 30 * 24 * time.Hour
	reloadEvery     = 10 * time.Second
	rsaBits         = 2048
)

// Config wires the issuer.
type Config struct {
	Store store.Identity
	// Keys seals the signing keys' private halves: the issuer needs the
	// operator's secrets key.
	Keys *seal.Keyring
	// Issuer is the issuer's public URL (--oidc-issuer): the tokens' iss,
	// where relying parties fetch <Issuer>/.well-known/openid-configuration.
	Issuer string
	// Lifetime is a token's lifetime when its registration says none
	// (DefaultLifetime when 0).
	Lifetime time.Duration
	// Rotation is the age at which a new signing key is made
	// (DefaultRotation when 0).
	Rotation time.Duration
	Logger   *slog.Logger
	// Now is the clock (time.Now when nil), for tests.
	Now func() time.Time
}

// Issuer mints and publishes workload tokens. The zero Issuer is off (as
// New makes it without Config.Issuer).
type Issuer struct {
	cfg         Config
	issuer      string
	path        string // the issuer URL's path ("" for the root)
	trustDomain string

	mu   sync.Mutex
	keys []signingKey // by generation
}

// signingKey is a stored key, opened.
type signingKey struct {
	store.SigningKey
	public  *rsa.PublicKey
	private *rsa.PrivateKey
}

// CheckIssuer validates an issuer URL: absolute http(s), a host, no query
// or fragment; the trailing slash is dropped.
func CheckIssuer(raw string) (string, error) {
	u, err := url.Parse(strings.TrimRight(raw, "/"))
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return "", fmt.Errorf("--oidc-issuer %q: want an http(s) URL without query, fragment or user, e.g. https://lizard.example.com", raw)
	}
	return u.String(), nil
}

// New returns the issuer, having loaded the cluster's signing keys (and made
// the first one if there is none). Without Config.Issuer it returns an
// issuer that is off: a create that registers tokens is refused (400 naming
// --oidc-issuer), nothing mints, and no discovery document is served.
func New(ctx context.Context, cfg Config) (*Issuer, error) {
	if cfg.Issuer == "" {
		return &Issuer{}, nil
	}
	iss, err := CheckIssuer(cfg.Issuer)
	if err != nil {
		return nil, err
	}
	if cfg.Keys == nil {
		return nil, errors.New("--oidc-issuer needs a secrets key (--secrets-key-file or LIZARD_SECRETS_KEY): the issuer's signing keys are kept sealed with it")
	}
	if cfg.Lifetime == 0 {
		cfg.Lifetime = DefaultLifetime
	}
	if cfg.Lifetime < MinLifetime || cfg.Lifetime > MaxLifetime {
		return nil, fmt.Errorf("--oidc-token-lifetime %s: want %s to %s", cfg.Lifetime, MinLifetime, MaxLifetime)
	}
	if cfg.Rotation == 0 {
		cfg.Rotation = DefaultRotation
	}
	if cfg.Rotation < 2*PublishAhead {
		return nil, fmt.Errorf("--oidc-key-rotation %s: want at least %s (a new key is published %s before it signs)", cfg.Rotation, 2*PublishAhead, PublishAhead)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	u, _ := url.Parse(iss)
	host := strings.ToLower(u.Host)
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	i := &Issuer{cfg: cfg, issuer: iss, path: u.EscapedPath(), trustDomain: strings.Trim(host, "[]")}
	if err := i.reload(ctx); err != nil {
		return nil, err
	}
	if len(i.keys) == 0 {
		if _, err := i.addKey(ctx, 0); err != nil && !errors.Is(err, errdefs.ErrConflict) {
			return nil, err
		}
		if err := i.reload(ctx); err != nil {
			return nil, err
		}
	}
	return i, nil
}

// Enabled reports whether the issuer is on (--oidc-issuer).
func (i *Issuer) Enabled() bool { return i.issuer != "" }

// URL is the issuer's URL (iss).
func (i *Issuer) URL() string { return i.issuer }

// Path is the issuer URL's path, under which the API serves
// /.well-known/openid-configuration and /.well-known/jwks.json.
func (i *Issuer) Path() string { return i.path }

// Run keeps the issuer's keys current until ctx is done: it reloads them
// every 10 s (another node's rotation), makes the next key when the newest
// is older than Config.Rotation, and deletes keys no token signed by them
// can still need.
func (i *Issuer) Run(ctx context.Context) {
	if !i.Enabled() {
		return
	}
	t := time.NewTicker(reloadEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := i.maintain(ctx); err != nil && ctx.Err() == nil {
			i.cfg.Logger.Warn("workload identity: keys", "err", err)
		}
	}
}

func (i *Issuer) maintain(ctx context.Context) error {
	if err := i.reload(ctx); err != nil {
		return err
	}
	now := i.cfg.Now()
	i.mu.Lock()
	keys := slices.Clone(i.keys)
	i.mu.Unlock()
	if newest := keys[len(keys)-1]; now.Sub(newest.CreatedAt) >= i.cfg.Rotation {
		k, err := i.addKey(ctx, PublishAhead)
		switch {
		case errors.Is(err, errdefs.ErrConflict): // another node rotated
		case err != nil:
			return err
		default:
			i.cfg.Logger.Info("workload identity: new signing key", "kid", k.ID, "generation", k.Generation, "signsFrom", k.ActivateAt)
		}
	}
	for n, k := range keys {
		if n+1 < len(keys) && !now.Before(retireAt(keys[n+1].SigningKey)) {
			if err := i.cfg.Store.DeleteSigningKey(ctx, k.ID); err != nil {
				return err
			}
			i.cfg.Logger.Info("workload identity: signing key retired", "kid", k.ID, "generation", k.Generation)
		}
	}
	return i.reload(ctx)
}

// retireAt is when the key before next can go: next has signed for
// MaxLifetime and Grace, so no token of the key before is still valid.
func retireAt(next store.SigningKey) time.Time { return next.ActivateAt.Add(MaxLifetime + Grace) }

// Rotate makes the next signing key, which signs from activateIn on (until
// then the current key signs; both are published). With activateIn 0 it
// signs at once, and relying parties that cached the key set without it
// refuse its tokens until they fetch it again.
func (i *Issuer) Rotate(ctx context.Context, activateIn time.Duration) (store.SigningKey, error) {
	if !i.Enabled() {
		return store.SigningKey{}, errOff()
	}
	if err := i.reload(ctx); err != nil {
		return store.SigningKey{}, err
	}
	k, err := i.addKey(ctx, activateIn)
	if err != nil {
		return store.SigningKey{}, err
	}
	return k, i.reload(ctx)
}

// DropOld deletes every signing key older than the one that signs now (a
// key that leaked: Rotate with activateIn 0 first): tokens they signed stop
// verifying as soon as relying parties fetch the key set again.
func (i *Issuer) DropOld(ctx context.Context) (int, error) {
	if !i.Enabled() {
		return 0, errOff()
	}
	if err := i.reload(ctx); err != nil {
		return 0, err
	}
	cur, err := i.current(i.cfg.Now())
	if err != nil {
		return 0, err
	}
	n := 0
	for _, k := range i.Keys() {
		if k.Generation < cur.Generation {
			if err := i.cfg.Store.DeleteSigningKey(ctx, k.ID); err != nil {
				return n, err
			}
			n++
		}
	}
	return n, i.reload(ctx)
}

// Keys lists the signing keys, oldest generation first (the CLI's view).
func (i *Issuer) Keys() []store.SigningKey {
	i.mu.Lock()
	defer i.mu.Unlock()
	out := make([]store.SigningKey, 0, len(i.keys))
	for _, k := range i.keys {
		sk := k.SigningKey
		sk.Private = nil
		out = append(out, sk)
	}
	return out
}

// addKey makes the next generation's key, signing from activateIn on. Another
// node making the same generation first is ErrConflict.
func (i *Issuer) addKey(ctx context.Context, activateIn time.Duration) (store.SigningKey, error) {
	priv, err := rsa.GenerateKey(rand.Reader, rsaBits)
	if err != nil {
		return store.SigningKey{}, err
	}
	pub, err := x509.MarshalPKIXPublicKey(&priv.PublicKey)
	if err != nil {
		return store.SigningKey{}, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return store.SigningKey{}, err
	}
	defer clear(der)
	gen := int64(1)
	i.mu.Lock()
	if len(i.keys) > 0 {
		gen = i.keys[len(i.keys)-1].Generation + 1
	}
	i.mu.Unlock()
	now := i.cfg.Now().UTC()
	kid := thumbprint(&priv.PublicKey)
	k := store.SigningKey{ID: kid, Generation: gen, Algorithm: Algorithm, Public: pub, Private: i.cfg.Keys.Seal(der, keyAD(kid)),
		CreatedAt: now, ActivateAt: now.Add(activateIn)}
	return k, i.cfg.Store.InsertSigningKey(ctx, k)
}

// errOff is the error of what needs the issuer when it is off: a request
// that asks for it is invalid (class ErrInvalid), a token looked up is not
// found (ErrNotFound).
func errOff(class ...error) error {
	c := errdefs.ErrInvalid
	if len(class) > 0 {
		c = class[0]
	}
	return errdefs.WithCode("identity_disabled", fmt.Errorf("workload identity is not configured on this server (its operator sets --oidc-issuer): %w", c))
}

// keyAD binds a sealed private key to its kid.
func keyAD(kid string) []byte { return []byte("lizard oidc key\x00" + kid) }

// reload reads the keys from the store, opening those it has not yet.
func (i *Issuer) reload(ctx context.Context) error {
	stored, err := i.cfg.Store.SigningKeys(ctx)
	if err != nil {
		return err
	}
	i.mu.Lock()
	known := map[string]signingKey{}
	for _, k := range i.keys {
		known[k.ID] = k
	}
	i.mu.Unlock()
	keys := make([]signingKey, 0, len(stored))
	for _, sk := range stored {
		if k, ok := known[sk.ID]; ok && k.ActivateAt.Equal(sk.ActivateAt) {
			k.SigningKey.Private = sk.Private
			keys = append(keys, k)
			continue
		}
		k, err := i.open(sk)
		if err != nil {
			return err
		}
		keys = append(keys, k)
	}
	i.mu.Lock()
	i.keys = keys
	i.mu.Unlock()
	return nil
}

func (i *Issuer) open(sk store.SigningKey) (signingKey, error) {
	if sk.Algorithm != Algorithm {
		return signingKey{}, fmt.Errorf("signing key %s: algorithm %s, this lizard knows %s", sk.ID, sk.Algorithm, Algorithm)
	}
	der, err := i.cfg.Keys.Open(sk.Private, keyAD(sk.ID))
	if err != nil {
		return signingKey{}, fmt.Errorf("signing key %s: %w", sk.ID, err)
	}
	defer clear(der)
	p, err := x509.ParsePKCS8PrivateKey(der)
	priv, ok := p.(*rsa.PrivateKey)
	if err != nil || !ok {
		return signingKey{}, fmt.Errorf("signing key %s: not an RSA key: %v", sk.ID, err)
	}
	return signingKey{SigningKey: sk, public: &priv.PublicKey, private: priv}, nil
}

// current is the key that signs at now: the newest whose time has come.
func (i *Issuer) current(now time.Time) (signingKey, error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	for n := len(i.keys) - 1; n >= 0; n-- {
		if !i.keys[n].ActivateAt.After(now) {
			return i.keys[n], nil
		}
	}
	return signingKey{}, fmt.Errorf("workload identity: no signing key is active yet: %w", errdefs.ErrUnavailable)
}

// published are the keys of the key set at now: all but those past their
// retirement.
func (i *Issuer) published(now time.Time) []signingKey {
	i.mu.Lock()
	defer i.mu.Unlock()
	var out []signingKey
	for n, k := range i.keys {
		if n+1 < len(i.keys) && !now.Before(retireAt(i.keys[n+1].SigningKey)) {
			continue
		}
		out = append(out, k)
	}
	return out
}

// Reseal seals every signing key's private half that the current seal key
// did not seal again under it (`lizard secrets rotate-key`), and returns
// how many it resealed.
func Reseal(ctx context.Context, st store.Identity, keys *seal.Keyring) (int, error) {
	all, err := st.SigningKeys(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, k := range all {
		if keys.IsCurrent(k.Private) {
			continue
		}
		resealed, err := keys.Reseal(k.Private, keyAD(k.ID))
		if err != nil {
			return n, fmt.Errorf("signing key %s: %w", k.ID, err)
		}
		ok, err := st.ResealSigningKey(ctx, k.ID, k.Private, resealed)
		if err != nil {
			return n, err
		}
		if ok {
			n++
		}
	}
	return n, nil
}

// thumbprint is a key's RFC 7638 JWK thumbprint: its kid.
func thumbprint(pub *rsa.PublicKey) string {
	j := fmt.Sprintf(`{"e":%q,"kty":"RSA","n":%q}`, b64(big.NewInt(int64(pub.E)).Bytes()), b64(pub.N.Bytes()))
	sum := sha256.Sum256([]byte(j))
	return b64(sum[:])
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

// sign makes a JWS compact serialization of claims with k.
func sign(k signingKey, claims any) (string, error) {
	header, err := json.Marshal(map[string]string{"alg": Algorithm, "kid": k.ID, "typ": "JWT"})
	if err != nil {
		return "", err
	}
	payload, err := json.Marshal(claims)
	if err != nil {
		return "", err
	}
	input := b64(header) + "." + b64(payload)
	sum := sha256.Sum256([]byte(input))
	sig, err := rsa.SignPKCS1v15(nil, k.private, crypto.SHA256, sum[:])
	if err != nil {
		return "", err
	}
	return input + "." + b64(sig), nil
}
