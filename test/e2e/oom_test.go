package e2e

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestOOMInLogs: a sandbox that outgrows its memory is killed by the
// kernel; the server notices, says so in the sandbox's log, and frees
// everything it held.
func TestOOMInLogs(t *testing.T) {
	s := startServer(t, "")
	var sb sandboxInfo
	if code, body := s.do("POST", "/api/sandboxes", map[string]any{"template": "base", "size": "nano"}, &sb); code >= 300 {
		t.Fatalf("create: %d %s", code, body)
	}
	req, _ := http.NewRequest("GET", s.url+"/api/sandboxes/"+sb.SandboxID+"/logs?tail=10", nil)
	req.Header.Set("X-API-Key", s.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("logs: %v %v", resp, err)
	}
	defer resp.Body.Close()
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	// 1 GiB sandbox, 1.5 GiB of memory touched.
	// Its answer does not matter (the sandbox dies under it); request, not
	// do, because do may call t.Fatal, which a goroutine must not.
	go s.request(context.Background(), s.key, "POST", "/api/sandboxes/"+sb.SandboxID+"/exec", map[string]any{"cmd": `python3 -c "b = bytearray(1500 << 20)"`}, nil)
	deadline := time.After(budget(60 * time.Second))
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("the log stream ended without saying why")
			}
			if strings.Contains(l, "out of memory") {
				if code, _ := s.do("GET", "/api/sandboxes/"+sb.SandboxID, nil, nil); code != 404 {
					t.Fatalf("the OOM-killed sandbox is still listed: %d", code)
				}
				s.waitNoLeaks(t)
				return
			}
		case <-deadline:
			t.Fatalf("no out-of-memory event within %v", budget(60*time.Second))
		}
	}
}
