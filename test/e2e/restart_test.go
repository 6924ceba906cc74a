package e2e

import (
	"net/http"
	"os/exec"
	"testing"

	"github.com/lizard-build/lizard/internal/runtime/gvisor"
)

// TestRestart: a server restarted gracefully or with kill -9 reattaches to
// the sandboxes still running, keeps their processes, and cleans up the ones
// that are gone; afterwards nothing is left.
func TestRestart(t *testing.T) {
	s := startServer(t, "")
	var a, b sandboxInfo
	for _, sb := range []*sandboxInfo{&a, &b} {
		if code, body := s.do("POST", "/api/sandboxes", map[string]any{"template": "base", "timeoutMs": 600000}, sb); code >= 300 {
			t.Fatalf("create: %d %s", code, body)
		}
	}
	var out execReply
	s.do("POST", "/api/sandboxes/"+a.SandboxID+"/exec", map[string]any{"cmd": "sleep 1000 > /dev/null 2>&1 & echo $! > /tmp/pid; echo kept > /tmp/file"}, &out)

	s.stop()
	s.start()
	if code, body := s.do("POST", "/api/sandboxes/"+a.SandboxID+"/exec", map[string]any{"cmd": "cat /tmp/file; kill -0 $(cat /tmp/pid) && echo alive"}, &out); code != 200 || out.Stdout != "kept\nalive\n" {
		t.Fatalf("after graceful restart: %d %s", code, body)
	}

	s.crash()
	s.start()
	if code, body := s.do("POST", "/api/sandboxes/"+a.SandboxID+"/exec", map[string]any{"cmd": "cat /tmp/file; kill -0 $(cat /tmp/pid) && echo alive"}, &out); code != 200 || out.Stdout != "kept\nalive\n" {
		t.Fatalf("after kill -9: %d %s", code, body)
	}
	var info sandboxInfo
	if code, _ := s.do("GET", "/api/sandboxes/"+b.SandboxID, nil, &info); code != http.StatusOK || info.Status != "running" {
		t.Fatalf("second sandbox after kill -9: %d %+v", code, info)
	}

	// A sandbox that dies while the server is down is cleaned up at start.
	s.crash()
	if out, err := exec.Command(runscBin(), "--root", gvisor.RunscRootFor(s.dataDir), "kill", b.SandboxID, "KILL").CombinedOutput(); err != nil {
		t.Fatalf("kill sandbox behind the server's back: %v %s", err, out)
	}
	s.start()
	if code, _ := s.do("GET", "/api/sandboxes/"+b.SandboxID, nil, nil); code != http.StatusNotFound {
		t.Fatalf("a sandbox that died while the server was down: %d, want 404", code)
	}
	for _, id := range []string{a.SandboxID} {
		if code, body := s.do("DELETE", "/api/sandboxes/"+id, nil, nil); code >= 300 {
			t.Fatalf("kill %s: %d %s", id, code, body)
		}
	}
	s.waitNoLeaks(t)
}
