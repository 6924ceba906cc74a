package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// e2bSDKs are the versions of E2B's JS SDK the E2B tests run with: npm
// aliases in package.json (2.50 creates and connects at /sandboxes, 2.51
// at /v2/sandboxes, and sends fewer defaults).
var e2bSDKs = []string{"e2b-250", "e2b-251"}

// TestE2B runs the E2B SDK test files (js/e2b/*.test.mjs) against one
// server, once per SDK version, set up as the README tells E2B users:
// E2B_API_URL is lizard's API, E2B_API_KEY a lizard key, E2B_SANDBOX_URL
// the preview proxy (no wildcard DNS here), E2B_VOLUME_API_URL lizard's
// API too (the volume content API's). The server has a secrets key and is
// a workload-identity issuer at its API's URL.
func TestE2B(t *testing.T) {
	files := jsFiles("js/e2b/*.test.mjs")
	if len(files) == 0 {
		t.Fatal("no E2B test files")
	}
	addr := freeAddr(t)
	s := startServer(t, "", "--usage-interval", "250ms", "--listen", addr, "--secrets-key-file", secretsKeyFile(t), "--oidc-issuer", "http://"+addr)
	s.runE2BSDKs(t, nil, files...)
	// js/e2b/secrets.test.mjs's secret values all end so: no log line, of
	// any level, holds one.
	if strings.Contains(s.logs(), "-7f3a9c") {
		t.Error("the server log holds a secret value")
	}
	s.waitNoLeaks(t)
}

// runE2BSDKs runs the files once per E2B SDK version, each a subtest, set
// up as the README tells E2B users (and with env).
func (s *server) runE2BSDKs(t *testing.T, env []string, files ...string) {
	for _, sdk := range e2bSDKs {
		t.Run(sdk, func(t *testing.T) {
			if _, err := os.Stat(filepath.Join("node_modules", sdk)); err != nil {
				t.Fatalf("%s is not installed: run `npm install` in test/e2e (make test does)", sdk)
			}
			ctx, cancel := context.WithTimeout(context.Background(), budget(10*time.Minute))
			defer cancel()
			all := append([]string{"E2B_SDK=" + sdk, "E2B_API_URL=" + s.url, "E2B_API_KEY=" + s.key, "E2B_SANDBOX_URL=http://" + s.proxy, "E2B_VOLUME_API_URL=" + s.url}, env...)
			if err := s.runNodeEnv(ctx, all, files...); err != nil {
				t.Fatalf("%v with %s failed: %v", files, sdk, err)
			}
		})
	}
}
