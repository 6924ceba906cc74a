// Package seal encrypts values at rest under the operator's keys: AES-256-GCM
// with a random nonce, each sealed value naming the key that sealed it (a
// fingerprint), and bound to what it belongs to (associated data, so that a
// value copied onto another row of the database does not open). A Keyring
// holds the current key, which seals, and previous keys, which only open:
// that is how a key is rotated (docs/OPERATIONS.md). The secrets store
// (internal/secrets) and the workload-identity issuer's signing keys
// (internal/identity) use it; cmd/lizard loads the keys (--secrets-key-file,
// LIZARD_SECRETS_KEY). It never logs, and its errors never hold a value.
package seal

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// KeySize is the size of a key: AES-256.
const KeySize = 32

// magic starts every sealed value: the format's name and version.
var magic = []byte("lzs1")

const (
	fingerprintSize = 8
	nonceSize       = 12
	headerSize      = 4 + fingerprintSize + nonceSize
)

// Key is one AES-256 key with its fingerprint.
type Key struct {
	raw [KeySize]byte
	fp  [fingerprintSize]byte
}

// Fingerprint names the key (16 hex digits) without telling anything of it:
// what errors, logs and `lizard secrets rotate-key` show.
func (k Key) Fingerprint() string { return hex.EncodeToString(k.fp[:]) }

// String is the fingerprint, so that a key printed by mistake shows nothing
// of itself.
func (k Key) String() string { return "key " + k.Fingerprint() }

// NewKey returns a fresh random key.
func NewKey() Key {
	var raw [KeySize]byte
	if _, err := rand.Read(raw[:]); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return keyOf(raw)
}

func keyOf(raw [KeySize]byte) Key {
	sum := sha256.Sum256(append([]byte("lizard seal key\x00"), raw[:]...))
	k := Key{raw: raw}
	copy(k.fp[:], sum[:fingerprintSize])
	return k
}

// Encode is the key as ParseKey reads it: standard base64 of its 32 bytes.
func (k Key) Encode() string { return base64.StdEncoding.EncodeToString(k.raw[:]) }

// ParseKey reads a key as an operator writes it (in a file or a variable):
// the base64 (standard or URL alphabet, padded or not) or the hex of 32
// bytes, surrounding white space ignored. The error never holds the text.
func ParseKey(text string) (Key, error) {
	s := strings.TrimSpace(text)
	var raw []byte
	var err error
	switch {
	case len(s) == 2*KeySize:
		raw, err = hex.DecodeString(s)
	default:
		s = strings.TrimRight(s, "=")
		if strings.ContainsAny(s, "-_") {
			raw, err = base64.RawURLEncoding.DecodeString(s)
		} else {
			raw, err = base64.RawStdEncoding.DecodeString(s)
		}
	}
	if err != nil || len(raw) != KeySize {
		return Key{}, fmt.Errorf("a key is 32 bytes written as base64 (44 characters) or hex (64 characters), as `lizard secrets gen-key` prints; this is not one: %w", errdefs.ErrInvalid)
	}
	return keyOf([KeySize]byte(raw)), nil
}

// Keyring seals with its current key and opens with any of its keys.
type Keyring struct {
	current  Key
	previous []Key
}

// NewKeyring makes a keyring sealing with current that also opens what the
// previous keys sealed. A previous key equal to current is ignored.
func NewKeyring(current Key, previous ...Key) *Keyring {
	kr := &Keyring{current: current}
	for _, k := range previous {
		if k.fp != current.fp {
			kr.previous = append(kr.previous, k)
		}
	}
	return kr
}

// Current is the fingerprint of the key that seals.
func (kr *Keyring) Current() string { return kr.current.Fingerprint() }

// Fingerprints are those of every key: the current one first.
func (kr *Keyring) Fingerprints() []string {
	out := []string{kr.current.Fingerprint()}
	for _, k := range kr.previous {
		out = append(out, k.Fingerprint())
	}
	return out
}

// Seal encrypts plaintext under the current key, bound to ad (what the value
// belongs to: Open needs the same).
func (kr *Keyring) Seal(plaintext, ad []byte) []byte {
	aead := newAEAD(kr.current)
	out := make([]byte, headerSize, headerSize+len(plaintext)+aead.Overhead())
	copy(out, magic)
	copy(out[4:], kr.current.fp[:])
	nonce := out[4+fingerprintSize : headerSize]
	if _, err := rand.Read(nonce); err != nil {
		panic(err)
	}
	return aead.Seal(out, nonce, plaintext, ad)
}

// ErrWrongKey is in the error of Open for a value sealed with a key the
// keyring does not hold (the error names that key's fingerprint).
var ErrWrongKey = errors.New("sealed with a key that is not configured")

// ErrCorrupt is in the error of Open for a value that is not a sealed value,
// was changed, or belongs to something else than ad.
var ErrCorrupt = errors.New("sealed value does not open (corrupt, or not sealed for this record)")

// Open decrypts what Seal sealed with any key of the keyring for the same
// ad. A value of another key is ErrWrongKey, a damaged or misplaced one
// ErrCorrupt; both are errdefs.ErrUnavailable (the server's configuration
// or data, not the request, is wrong).
func (kr *Keyring) Open(sealed, ad []byte) ([]byte, error) {
	k, err := kr.keyOf(sealed)
	if err != nil {
		return nil, err
	}
	aead := newAEAD(k)
	pt, err := aead.Open(nil, sealed[4+fingerprintSize:headerSize], sealed[headerSize:], ad)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, errdefs.ErrUnavailable)
	}
	return pt, nil
}

// SealedWith is the fingerprint of the key a sealed value names ("" for
// something that is not a sealed value).
func SealedWith(sealed []byte) string {
	if len(sealed) < headerSize || !bytes.Equal(sealed[:4], magic) {
		return ""
	}
	return hex.EncodeToString(sealed[4 : 4+fingerprintSize])
}

// IsCurrent reports whether sealed was sealed with the current key: what a
// rotation leaves alone.
func (kr *Keyring) IsCurrent(sealed []byte) bool {
	return SealedWith(sealed) == kr.current.Fingerprint()
}

// Reseal opens sealed and seals it again under the current key, for the same
// ad.
func (kr *Keyring) Reseal(sealed, ad []byte) ([]byte, error) {
	pt, err := kr.Open(sealed, ad)
	if err != nil {
		return nil, err
	}
	defer clear(pt)
	return kr.Seal(pt, ad), nil
}

func (kr *Keyring) keyOf(sealed []byte) (Key, error) {
	fp := SealedWith(sealed)
	if fp == "" {
		return Key{}, fmt.Errorf("%w: %w", ErrCorrupt, errdefs.ErrUnavailable)
	}
	if fp == kr.current.Fingerprint() {
		return kr.current, nil
	}
	for _, k := range kr.previous {
		if fp == k.Fingerprint() {
			return k, nil
		}
	}
	return Key{}, fmt.Errorf("%w: key %s (the keys configured are %s: give the server the key that sealed it, as the current or a previous key): %w",
		ErrWrongKey, fp, strings.Join(kr.Fingerprints(), ", "), errdefs.ErrUnavailable)
}

func newAEAD(k Key) cipher.AEAD {
	block, err := aes.NewCipher(k.raw[:])
	if err != nil {
		panic(err) // a 32-byte key is always valid
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		panic(err)
	}
	return aead
}

// ReadKeyFile reads a key from a file (ParseKey's formats). A file that
// every user may read or write is refused: the key is what keeps the
// database's secrets secret.
func ReadKeyFile(path string) (Key, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return Key{}, err
	}
	if fi.Mode().Perm()&0o006 != 0 {
		return Key{}, fmt.Errorf("%s: every user of the host may read or write it (mode %v): chmod 600 it", path, fi.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return Key{}, err
	}
	defer clear(b)
	k, err := ParseKey(string(b))
	if err != nil {
		return Key{}, fmt.Errorf("%s: %w", path, err)
	}
	return k, nil
}
