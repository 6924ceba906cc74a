package e2e

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestTemplatesBuildInBackground: a server given --build-templates python
// with python not built serves at once: base sandboxes run while python
// builds in the background (the real recipe, on the server's build
// network), GET /api/templates and `lizard template ls` show it building
// with the build's progress, and a create of it answers 503
// template_building with Retry-After. A server stopped mid-build, while
// a step runs in a container, leaves nothing of it behind.
func TestTemplatesBuildInBackground(t *testing.T) {
	dataDir := t.TempDir()
	tplDir := serverTemplateDir(t, dataDir)
	if err := os.Remove(filepath.Join(tplDir, "python")); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	s := startServer(t, dataDir, "--build-templates", "python")

	type tplInfo struct {
		Name, Status, Progress string
	}
	var python tplInfo
	deadline := time.Now().Add(budget(2 * time.Minute))
	for {
		var list []tplInfo
		if code, body := s.do(http.MethodGet, "/api/templates", nil, &list); code != http.StatusOK {
			t.Fatalf("GET /api/templates: %d %s", code, body)
		}
		for _, tp := range list {
			if tp.Name == "python" {
				python = tp
			}
		}
		if python.Status == "building" && python.Progress != "" && python.Progress != "starting" {
			break
		}
		if python.Status == "build_failed" || time.Now().After(deadline) {
			t.Fatalf("python in GET /api/templates: %+v, want building with a progress line", python)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("python: %s: %s", python.Status, python.Progress)

	// A create of it is refused for now, saying when to come back.
	req, _ := http.NewRequest(http.MethodPost, s.url+"/api/sandboxes", bytes.NewReader([]byte(`{"template":"python"}`)))
	req.Header.Set("X-API-Key", s.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var refusal struct{ Code, Message string }
	json.NewDecoder(resp.Body).Decode(&refusal)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || refusal.Code != "template_building" || resp.Header.Get("Retry-After") != "30" ||
		!strings.Contains(refusal.Message, `template "python" is being built`) {
		t.Fatalf("create of python while it builds: %d %+v Retry-After %q", resp.StatusCode, refusal, resp.Header.Get("Retry-After"))
	}

	// base serves meanwhile.
	var sb sandboxInfo
	if code, body := s.do(http.MethodPost, "/api/sandboxes", map[string]any{"template": "base"}, &sb); code != http.StatusCreated {
		t.Fatalf("create base while python builds: %d %s", code, body)
	}
	var out struct {
		Stdout   string `json:"stdout"`
		ExitCode int    `json:"exitCode"`
	}
	if code, body := s.do(http.MethodPost, "/api/sandboxes/"+sb.SandboxID+"/exec", map[string]any{"cmd": "echo served"}, &out); code != http.StatusOK || out.Stdout != "served\n" {
		t.Fatalf("exec in base: %d %s", code, body)
	}
	if code, body := s.do(http.MethodDelete, "/api/sandboxes/"+sb.SandboxID, nil, nil); code != http.StatusNoContent {
		t.Fatalf("kill: %d %s", code, body)
	}

	// The CLI on the host says the same.
	if ls := s.cli(t, "template", "ls", "--template-dir", tplDir); !strings.Contains(ls, "python: building since") {
		t.Fatalf("lizard template ls while python builds:\n%s", ls)
	}

	// Stopped mid-build, while a step runs in a container of the
	// server's runtime (step 3 once it unpacked a package): nothing of
	// the build stays, and the template is not built.
	inContainer := regexp.MustCompile(`step 3/\d+ unpacking packages: [1-9]|step 4/`)
	deadline = time.Now().Add(budget(3 * time.Minute))
	for !inContainer.MatchString(python.Progress) {
		if time.Now().After(deadline) {
			t.Fatalf("python's build did not reach its container steps: %+v", python)
		}
		time.Sleep(200 * time.Millisecond)
		var list []tplInfo
		s.do(http.MethodGet, "/api/templates", nil, &list)
		for _, tp := range list {
			if tp.Name == "python" {
				python = tp
			}
		}
	}
	t.Logf("stopping the server at %q", python.Progress)
	s.stop()
	if _, err := os.Stat(filepath.Join(tplDir, "python")); !os.IsNotExist(err) {
		t.Fatalf("python after a build cut short: %v", err)
	}
	if partial, _ := filepath.Glob(filepath.Join(tplDir, ".v", "python@*")); len(partial) > 0 {
		t.Fatalf("a build cut short left %v", partial)
	}
	s.waitNoLeaks(t)
}
