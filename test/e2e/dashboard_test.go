package e2e

import (
	"context"
	"testing"
	"time"
)

// TestDashboard drives the dashboard in headless Chromium
// (js/dashboard.e2e.mjs): sign in, create, terminal, files, preview, pause
// and resume, the events page, keys, and a sandbox of another project that never shows.
// LIZARD_SCREENSHOTS=DIR saves the main pages there (docs/img).
func TestDashboard(t *testing.T) {
	// Usage every 500 ms: the charts have a few points within seconds.
	s := startServer(t, "", "--usage-interval", "500ms")
	s.cli(t, "projects", "create", "Dashboard Other")
	other := s.newKey(t, "dashboard-other")
	var sb sandboxInfo
	if code, body := s.doKey(other, "POST", "/api/sandboxes", map[string]any{"template": "base", "timeoutMs": 600000}, &sb); code != 200 && code != 201 {
		t.Fatalf("other project's sandbox: %d %s", code, body)
	}
	defer s.doKey(other, "DELETE", "/api/sandboxes/"+sb.SandboxID, nil, nil)
	t.Setenv("LIZARD_OTHER_SANDBOX", sb.SandboxID)
	ctx, cancel := context.WithTimeout(context.Background(), budget(10*time.Minute))
	defer cancel()
	if err := s.runNode(ctx, "js/dashboard.e2e.mjs"); err != nil {
		t.Fatalf("dashboard test failed: %v", err)
	}
	if code, body := s.doKey(other, "DELETE", "/api/sandboxes/"+sb.SandboxID, nil, nil); code >= 300 {
		t.Fatalf("kill the other project's sandbox: %d %s", code, body)
	}
	s.waitNoLeaks(t)
}

// TestDashboardSessionExpiry: a session past --dashboard-session-ttl is
// refused (js/dashboard-expiry.e2e.mjs).
func TestDashboardSessionExpiry(t *testing.T) {
	s := startServer(t, "", "--dashboard-session-ttl", "4s")
	ctx, cancel := context.WithTimeout(context.Background(), budget(2*time.Minute))
	defer cancel()
	if err := s.runNode(ctx, "js/dashboard-expiry.e2e.mjs"); err != nil {
		t.Fatalf("dashboard expiry test failed: %v", err)
	}
}
