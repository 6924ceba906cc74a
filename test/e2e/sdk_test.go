package e2e

import (
	"context"
	"path/filepath"
	"testing"
	"time"
)

// TestSDK runs the official TypeScript SDK's calls (js/*.test.mjs) against
// the server: quickstart, sandbox lifecycle, exec plain and streamed,
// processes and files.
func TestSDK(t *testing.T) {
	s := startServer(t, "")
	files, _ := filepath.Glob("js/*.test.mjs")
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
