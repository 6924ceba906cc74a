package api

import (
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// TestWriteContextRefusesEscapes: a build context file whose path would
// leave the context is a 400-class error and nothing is written outside;
// paths inside it are written.
func TestWriteContextRefusesEscapes(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "ctx")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	x := base64.StdEncoding.EncodeToString([]byte("x"))
	for _, p := range []string{"../escaped", "a/../../escaped", "/tmp/escaped", "..", ""} {
		if err := writeContext(dir, map[string]string{p: x}); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("files[%q]: %v, want ErrInvalid", p, err)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "escaped")); err == nil {
		t.Errorf("a file was written outside the context")
	}
	if err := writeContext(dir, map[string]string{"d/./f": x, "a/../g": x}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"d/f", "g"} {
		if b, err := os.ReadFile(filepath.Join(dir, p)); err != nil || string(b) != "x" {
			t.Errorf("%s: %q %v", p, b, err)
		}
	}
}
