package e2e

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"
)

// templatePool is a pool as GET /api/template-pools lists it.
type templatePool struct {
	Template    string `json:"template"`
	SandboxSize string `json:"sandboxSize"`
	Size        int    `json:"size"`
	Ready       int    `json:"ready"`
	Source      string `json:"source"`
}

// waitPool waits until the project's only pool shows ready warm copies
// (none at all: no pool listed).
func (s *server) waitPool(t *testing.T, ready int) {
	t.Helper()
	deadline := time.Now().Add(budget(90 * time.Second))
	var last []templatePool
	for time.Now().Before(deadline) {
		var out struct {
			Pools []templatePool `json:"pools"`
		}
		if code, body := s.do(http.MethodGet, "/api/template-pools", nil, &out); code != http.StatusOK {
			t.Fatalf("GET /api/template-pools: %d %s", code, body)
		}
		last = out.Pools
		if (ready == 0 && len(last) == 0) || (len(last) == 1 && last[0].Ready == ready) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("the pool did not reach %d ready: %+v", ready, last)
}

// TestTemplatePool: a project's warm pool of base, set through the API,
// fills; the SDK's creates take its copies with their own settings
// (js/tplpool); it refills; bad settings are refused naming the problem;
// size 0 empties it and nothing is left.
func TestTemplatePool(t *testing.T) {
	s := startServer(t, "")
	for _, c := range []struct {
		path string
		body any
		code int
		says string
	}{
		{"/api/template-pools/base", map[string]any{"size": -1}, 400, "size -1"},
		{"/api/template-pools/base", map[string]any{"size": 101}, 400, "size 101"},
		{"/api/template-pools/base", map[string]any{}, 400, "size: required"},
		{"/api/template-pools/base", map[string]any{"size": 1, "sandboxSize": "huge"}, 400, "invalid_size"},
		{"/api/template-pools/base", map[string]any{"size": "two"}, 400, "size"},
		{"/api/template-pools/nope", map[string]any{"size": 1}, 404, "template_not_found"},
	} {
		if code, body := s.do(http.MethodPut, c.path, c.body, nil); code != c.code || !strings.Contains(string(body), c.says) {
			t.Errorf("PUT %s %v: %d %s, want %d saying %q", c.path, c.body, code, body, c.code, c.says)
		}
	}
	var pool templatePool
	if code, body := s.do(http.MethodPut, "/api/template-pools/base", map[string]any{"size": 2}, &pool); code != http.StatusOK ||
		pool.Template != "base" || pool.Size != 2 || pool.SandboxSize != "medium" || pool.Source != "project" {
		t.Fatalf("PUT /api/template-pools/base: %d %s", code, body)
	}
	s.waitPool(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), budget(5*time.Minute))
	defer cancel()
	if err := s.runNode(ctx, "js/tplpool/claim.test.mjs"); err != nil {
		t.Fatalf("SDK: %v", err)
	}
	s.waitPool(t, 2)
	if code, body := s.do(http.MethodPut, "/api/template-pools/base", map[string]any{"size": 0}, nil); code != http.StatusOK {
		t.Fatalf("PUT size 0: %d %s", code, body)
	}
	s.waitPool(t, 0)
	s.waitNoLeaks(t)
}
