package e2e

import (
	"net/http"
	"testing"
)

// TestVolumeSurvives: a volume's data outlives kill -9 of the server, a
// pause and resume of its sandbox, and the sandbox itself; kill detaches it.
func TestVolumeSurvives(t *testing.T) {
	s := startServer(t, "")
	var vol struct {
		ID string `json:"id"`
	}
	if code, body := s.do("POST", "/api/projects/default/volumes", map[string]any{"name": "keep", "sizeGb": 1}, &vol); code != http.StatusCreated {
		t.Fatalf("create volume: %d %s", code, body)
	}
	var sb sandboxInfo
	if code, body := s.do("POST", "/api/sandboxes", map[string]any{"template": "base", "volumeName": "keep"}, &sb); code >= 300 {
		t.Fatalf("create: %d %s", code, body)
	}
	s.sh(t, sb.SandboxID, "echo precious > /workspace/data")
	s.crash()
	s.start()
	if got := s.sh(t, sb.SandboxID, "cat /workspace/data"); got != "precious\n" {
		t.Fatalf("after kill -9 of the server: %q", got)
	}
	s.do("POST", "/api/sandboxes/"+sb.SandboxID+"/pause", nil, nil)
	if code, body := s.do("POST", "/api/sandboxes/"+sb.SandboxID+"/resume", nil, nil); code != 200 {
		t.Fatalf("resume: %d %s", code, body)
	}
	if got := s.sh(t, sb.SandboxID, "echo more >> /workspace/data; cat /workspace/data"); got != "precious\nmore\n" {
		t.Fatalf("after pause/resume: %q", got)
	}
	s.do("DELETE", "/api/sandboxes/"+sb.SandboxID, nil, nil)
	var next sandboxInfo
	if code, body := s.do("POST", "/api/sandboxes", map[string]any{"template": "base", "volumeId": vol.ID}, &next); code >= 300 {
		t.Fatalf("second sandbox: %d %s", code, body)
	}
	if got := s.sh(t, next.SandboxID, "cat /workspace/data"); got != "precious\nmore\n" {
		t.Fatalf("in the next sandbox: %q", got)
	}
	s.do("DELETE", "/api/sandboxes/"+next.SandboxID, nil, nil)
	if code, body := s.do("DELETE", "/api/projects/default/volumes/keep", nil, nil); code != http.StatusNoContent {
		t.Fatalf("delete volume: %d %s", code, body)
	}
	s.waitNoLeaks(t)
}
