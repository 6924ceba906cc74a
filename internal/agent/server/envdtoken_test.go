package server

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEnvdTokenFile: a secure envd's token is kept in the token file for
// the sandbox's other servers (the code interpreter), replaced by the next
// token, and removed when envd is no longer secure.
func TestEnvdTokenFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "run", "envd-token")
	for _, step := range []struct {
		secure bool
		token  string
	}{{true, strings.Repeat("a", 64)}, {true, strings.Repeat("b", 64)}, {false, ""}, {false, ""}} {
		if err := writeEnvdToken(p, step.secure, step.token); err != nil {
			t.Fatalf("secure %v: %v", step.secure, err)
		}
		b, err := os.ReadFile(p)
		switch {
		case step.secure && (err != nil || string(b) != step.token):
			t.Fatalf("token file %q, %v; want %q", b, err, step.token)
		case !step.secure && !errors.Is(err, fs.ErrNotExist):
			t.Fatalf("not secure: token file %q, %v; want none", b, err)
		}
		if step.secure {
			if st, _ := os.Stat(p); st.Mode().Perm() != 0o600 {
				t.Errorf("mode %v, want 0600", st.Mode().Perm())
			}
		}
	}
}
