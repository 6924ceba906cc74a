package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lizard-build/lizard/internal/seal"
	"github.com/lizard-build/lizard/internal/secrets"
	"github.com/lizard-build/lizard/internal/store/sqlite"
)

func writeKey(t *testing.T, k seal.Key) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), k.Fingerprint()+".key")
	if err := os.WriteFile(path, []byte(k.Encode()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestSecretsKeyring: the key comes from one place, a file or a variable;
// both at once, or a previous key without a current one, are refused.
func TestSecretsKeyring(t *testing.T) {
	a, b := seal.NewKey(), seal.NewKey()
	t.Setenv(secretsKeyEnv, "")
	os.Unsetenv(secretsKeyEnv)
	if kr, err := (&secretsFlags{}).keyring(); kr != nil || err != nil {
		t.Fatalf("no key: %v %v", kr, err)
	}
	kr, err := (&secretsFlags{keyFile: writeKey(t, a), previousKeyFile: writeKey(t, b)}).keyring()
	if err != nil || kr.Current() != a.Fingerprint() || len(kr.Fingerprints()) != 2 {
		t.Fatalf("from files: %v %v", kr, err)
	}
	if _, err := (&secretsFlags{previousKeyFile: writeKey(t, b)}).keyring(); err == nil {
		t.Fatal("a previous key without a current one")
	}
	t.Setenv(secretsKeyEnv, b.Encode())
	if kr, err := (&secretsFlags{}).keyring(); err != nil || kr.Current() != b.Fingerprint() {
		t.Fatalf("from the variable: %v %v", kr, err)
	}
	if _, err := (&secretsFlags{keyFile: writeKey(t, a)}).keyring(); err == nil || !strings.Contains(err.Error(), "one way") {
		t.Fatalf("a file and the variable: %v", err)
	}
	t.Setenv(secretsKeyEnv, "not a key")
	if _, err := (&secretsFlags{}).keyring(); err == nil || !strings.Contains(err.Error(), secretsKeyEnv) || strings.Contains(err.Error(), "not a key") {
		t.Fatalf("a bad variable: %v", err)
	}
}

// TestSecretsRotateKey: `lizard secrets rotate-key` reseals every value
// under the new key, after which the old key opens none.
func TestSecretsRotateKey(t *testing.T) {
	ctx := context.Background()
	conf := filepath.Join(t.TempDir(), "lizard.toml")
	if err := os.WriteFile(conf, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("LIZARD_CONFIG", conf)
	os.Unsetenv(secretsKeyEnv)
	dir := t.TempDir()
	st, err := sqlite.Open(filepath.Join(dir, "lizard.db"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := st.CreateProject(ctx, "p", "")
	if err != nil {
		t.Fatal(err)
	}
	old, cur := seal.NewKey(), seal.NewKey()
	req, _ := secrets.ParseNew([]byte(`{"name":"tok","value":"the-value"}`))
	if _, err := secrets.New(st, seal.NewKeyring(old)).Create(ctx, p.ID, req); err != nil {
		t.Fatal(err)
	}
	st.Close()
	if err := Run(ctx, []string{"secrets", "rotate-key", "--data-dir", dir, "--secrets-key-file", writeKey(t, cur)}); !errors.Is(err, seal.ErrWrongKey) || !strings.Contains(err.Error(), old.Fingerprint()) {
		t.Fatalf("a rotation without the old key: %v, want the old key's fingerprint", err)
	}
	if err := Run(ctx, []string{"secrets", "rotate-key", "--data-dir", dir, "--secrets-key-file", writeKey(t, cur), "--secrets-previous-key-file", writeKey(t, old)}); err != nil {
		t.Fatal(err)
	}
	st, err = sqlite.Open(filepath.Join(dir, "lizard.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if v, err := secrets.New(st, seal.NewKeyring(cur)).SecretValue(ctx, p.ID, "tok"); err != nil || v != "the-value" {
		t.Fatalf("with the new key after the rotation: %q %v", v, err)
	}
	if _, err := secrets.New(st, seal.NewKeyring(old)).SecretValue(ctx, p.ID, "tok"); !errors.Is(err, seal.ErrWrongKey) {
		t.Fatalf("with the old key after the rotation: %v", err)
	}
}
