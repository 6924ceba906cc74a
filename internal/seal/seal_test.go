package seal

import (
	"bytes"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// TestSealOpen: a value opens with its key and its associated data only;
// the sealed bytes hold neither the value nor the key.
func TestSealOpen(t *testing.T) {
	k := NewKey()
	kr := NewKeyring(k)
	value := []byte("sk-live-0123456789abcdef")
	ad := []byte("prj_a/sec_1")
	sealed := kr.Seal(value, ad)
	if bytes.Contains(sealed, value) || bytes.Contains(sealed, k.raw[:]) {
		t.Fatal("the sealed value holds the plaintext or the key")
	}
	if again := kr.Seal(value, ad); bytes.Equal(again, sealed) {
		t.Fatal("two seals of one value are equal: the nonce is not random")
	}
	if SealedWith(sealed) != k.Fingerprint() || !kr.IsCurrent(sealed) {
		t.Fatalf("SealedWith %q, want %q", SealedWith(sealed), k.Fingerprint())
	}
	got, err := kr.Open(sealed, ad)
	if err != nil || !bytes.Equal(got, value) {
		t.Fatalf("Open: %q %v", got, err)
	}
	// Another record's associated data: the value was moved.
	if _, err := kr.Open(sealed, []byte("prj_b/sec_1")); !errors.Is(err, ErrCorrupt) || !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("Open with other associated data: %v, want ErrCorrupt", err)
	}
	for _, i := range []int{0, 5, headerSize - 1, headerSize, len(sealed) - 1} {
		bad := bytes.Clone(sealed)
		bad[i] ^= 1
		if _, err := kr.Open(bad, ad); err == nil {
			t.Fatalf("a value with byte %d changed opens", i)
		}
	}
	if _, err := kr.Open([]byte("short"), ad); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Open of garbage: %v", err)
	}
}

// TestWrongKey: a value sealed with a key the keyring lacks fails with an
// error naming both fingerprints and holding neither the value nor a key.
func TestWrongKey(t *testing.T) {
	old, cur := NewKey(), NewKey()
	value := []byte("the-secret-value")
	sealed := NewKeyring(old).Seal(value, nil)
	_, err := NewKeyring(cur).Open(sealed, nil)
	if !errors.Is(err, ErrWrongKey) || !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("Open with the wrong key: %v, want ErrWrongKey", err)
	}
	msg := err.Error()
	if !strings.Contains(msg, old.Fingerprint()) || !strings.Contains(msg, cur.Fingerprint()) {
		t.Fatalf("error %q does not name the key that sealed (%s) and the one configured (%s)", msg, old.Fingerprint(), cur.Fingerprint())
	}
	for _, leak := range []string{string(value), old.Encode(), cur.Encode(), hex.EncodeToString(old.raw[:])} {
		if strings.Contains(msg, leak) {
			t.Fatalf("error %q holds a value or a key", msg)
		}
	}
	if fmt := old.String(); strings.Contains(fmt, old.Encode()) {
		t.Fatalf("Key.String shows the key: %s", fmt)
	}
}

// TestRotation: a keyring with a previous key opens what it sealed; Reseal
// moves a value to the current key, after which the previous key can go.
func TestRotation(t *testing.T) {
	old, cur := NewKey(), NewKey()
	ad := []byte("x")
	sealed := NewKeyring(old).Seal([]byte("v1"), ad)
	both := NewKeyring(cur, old, cur)
	if got := both.Fingerprints(); len(got) != 2 || got[0] != cur.Fingerprint() || got[1] != old.Fingerprint() {
		t.Fatalf("Fingerprints %v: want the current key, then the previous one once", got)
	}
	if both.IsCurrent(sealed) {
		t.Fatal("a value of the previous key counts as current")
	}
	if got, err := both.Open(sealed, ad); err != nil || string(got) != "v1" {
		t.Fatalf("Open with the previous key: %q %v", got, err)
	}
	resealed, err := both.Reseal(sealed, ad)
	if err != nil || !both.IsCurrent(resealed) {
		t.Fatalf("Reseal: %v (current: %v)", err, both.IsCurrent(resealed))
	}
	if got, err := NewKeyring(cur).Open(resealed, ad); err != nil || string(got) != "v1" {
		t.Fatalf("the resealed value with the new key alone: %q %v", got, err)
	}
	if _, err := NewKeyring(old).Open(resealed, ad); !errors.Is(err, ErrWrongKey) {
		t.Fatalf("the resealed value with the old key: %v, want ErrWrongKey", err)
	}
}

// TestParseKey: base64 (both alphabets, padded or not) and hex of 32 bytes;
// anything else is refused without echoing it.
func TestParseKey(t *testing.T) {
	k := NewKey()
	raw := k.raw[:]
	for _, text := range []string{k.Encode(), " " + k.Encode() + "\n", strings.TrimRight(k.Encode(), "="), hex.EncodeToString(raw),
		strings.NewReplacer("+", "-", "/", "_").Replace(k.Encode())} {
		got, err := ParseKey(text)
		if err != nil || got.Fingerprint() != k.Fingerprint() {
			t.Fatalf("ParseKey(%q): %v %v", text, got, err)
		}
	}
	for _, text := range []string{"", "short-key-material", k.Encode() + "AAAA", hex.EncodeToString(raw)[:62] + "zz"} {
		_, err := ParseKey(text)
		if !errors.Is(err, errdefs.ErrInvalid) {
			t.Fatalf("ParseKey(%q): %v, want ErrInvalid", text, err)
		}
		if text != "" && strings.Contains(err.Error(), text) {
			t.Fatalf("the error echoes the key text: %v", err)
		}
	}
}

// TestReadKeyFile: a key file readable by every user is refused.
func TestReadKeyFile(t *testing.T) {
	k := NewKey()
	path := filepath.Join(t.TempDir(), "secrets.key")
	if err := os.WriteFile(path, []byte(k.Encode()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := ReadKeyFile(path)
	if err != nil || got.Fingerprint() != k.Fingerprint() {
		t.Fatalf("ReadKeyFile: %v %v", got, err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadKeyFile(path); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("a world-readable key file: %v", err)
	}
}
