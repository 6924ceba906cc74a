package e2e

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestSDK runs the official TypeScript SDK's calls (js/*.test.mjs) against
// the server: quickstart, sandbox lifecycle, exec plain and streamed,
// processes and files.
func TestSDK(t *testing.T) {
	s := startServer(t, "")
	files := jsFiles("js/*.test.mjs")
	if len(files) == 0 {
		t.Fatal("no SDK test files")
	}
	ctx, cancel := context.WithTimeout(context.Background(), budget(10*time.Minute))
	defer cancel()
	if err := s.runNode(ctx, files...); err != nil {
		t.Fatalf("SDK tests failed: %v", err)
	}
	s.waitNoLeaks(t)
}

// jsFiles are the test files of pattern, or of LIZARD_E2E_JS when set (a
// glob, e.g. js/create.test.mjs, to run a few while working on them).
func jsFiles(pattern string) []string {
	if p := os.Getenv("LIZARD_E2E_JS"); p != "" {
		pattern = p
	}
	files, _ := filepath.Glob(pattern)
	return files
}
