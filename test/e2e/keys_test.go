package e2e

import (
	"encoding/json"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// cli runs the lizard CLI against the server's state, as an operator
// would while it serves.
func (s *server) cli(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(filepath.Join(s.bin, "lizard"), append(args, s.stateArgs()...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("lizard %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// createKey creates a key of a project with the CLI and returns it.
func (s *server) createKey(t *testing.T, project string) string {
	t.Helper()
	out := strings.TrimSpace(s.cli(t, "keys", "create", "--project", project))
	return out[strings.LastIndexByte(out, '\n')+1:]
}

// newKey creates a key of a project with the CLI and waits until the
// server admits it: it looks for a key it does not know in the database
// (a few times a second at most), and polls the key generation.
func (s *server) newKey(t *testing.T, project string) string {
	t.Helper()
	key := s.createKey(t, project)
	deadline := time.Now().Add(budget(10 * time.Second))
	for {
		code, body := s.doKey(key, "GET", "/api/projects", nil, nil)
		if code == 200 {
			return key
		}
		if time.Now().After(deadline) {
			t.Fatalf("a new key is still refused: %d %s", code, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// keyLine is the line of `keys ls` for the key with this secret.
func (s *server) keyLine(t *testing.T, secret string) []string {
	t.Helper()
	for _, line := range strings.Split(s.cli(t, "keys", "ls", "--project", "default"), "\n") {
		// ID, PREFIX…, CREATED (2 fields), LAST USED (1 or 2), REVOKED (1 or 2)
		f := strings.Fields(line)
		if len(f) >= 2 && strings.HasSuffix(f[1], "…") && strings.HasPrefix(secret, strings.TrimSuffix(f[1], "…")) {
			return f
		}
	}
	t.Fatalf("no line for %s… in keys ls", secret[:10])
	return nil
}

// TestAPIKeys: keys made, listed and revoked with the CLI while the server
// runs.
func TestAPIKeys(t *testing.T) {
	s := startServer(t, "")
	// A key the CLI just made works at its first use, whether or not the
	// server polled since: it looks for a key it does not know in the
	// database before refusing it (internal/apikey TestSetUnknownKey
	// proves the check itself).
	first := s.createKey(t, "default")
	if code, body := s.doKey(first, "GET", "/api/projects", nil, nil); code != 200 {
		t.Fatalf("a key made by the CLI, at its first use: %d %s", code, body)
	}
	key := s.newKey(t, "default")
	f := s.keyLine(t, key)
	id := f[0]
	if f[1] != key[:10]+"…" || !strings.HasPrefix(id, "key_") {
		t.Fatalf("keys ls line %q for %s", f, key)
	}
	// Last used is written in batches: it shows within a few seconds.
	deadline := time.Now().Add(budget(15 * time.Second))
	for f[4] == "-" {
		if time.Now().After(deadline) {
			t.Fatalf("keys ls shows no last use after the key was used: %q", f)
		}
		time.Sleep(200 * time.Millisecond)
		f = s.keyLine(t, key)
	}
	if used, err := time.Parse("2006-01-02 15:04:05Z", f[4]+" "+f[5]); err != nil || time.Since(used) > budget(time.Minute) {
		t.Fatalf("last used %q: %v", f[4:6], err)
	}

	if code, body := s.doKey("lz_not_a_key_0123456789abcdef", "GET", "/api/projects", nil, nil); code != 401 || !strings.Contains(string(body), "invalid_api_key") {
		t.Fatalf("unknown key: %d %s", code, body)
	}
	s.cli(t, "keys", "revoke", id)
	deadline = time.Now().Add(budget(time.Second))
	for {
		code, _ := s.doKey(key, "GET", "/api/projects", nil, nil)
		if code == 401 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the revoked key is still admitted %v after revoke: %d", budget(time.Second), code)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code, body := s.do("GET", "/api/projects", nil, nil); code != 200 {
		t.Fatalf("the other key after a revoke: %d %s", code, body)
	}
	if f := s.keyLine(t, key); f[len(f)-1] == "-" {
		t.Fatalf("keys ls does not show the revocation: %q", f)
	}
}

// TestRateLimit: a burst over a key's limit is answered 429 with
// Retry-After, other keys are not affected, and the key recovers.
func TestRateLimit(t *testing.T) {
	s := startServer(t, "", "--rate-limit", "2", "--rate-burst", "5")
	other := s.newKey(t, "default")
	var (
		resp *http.Response
		body []byte
	)
	for i := 0; ; i++ {
		if i == 1000 {
			t.Fatal("1000 requests in a row and none was limited")
		}
		req, _ := http.NewRequest("GET", s.url+"/api/projects", nil)
		req.Header.Set("X-API-Key", s.key)
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body = []byte(readAll(t, r))
		if r.StatusCode == http.StatusTooManyRequests {
			resp = r
			break
		}
		if r.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, r.StatusCode, body)
		}
	}
	var e struct{ Code, Message string }
	json.Unmarshal(body, &e)
	retry, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	if err != nil || retry < 1 || e.Code != "rate_limited" || !strings.Contains(e.Message, "2 requests/s") {
		t.Fatalf("over the limit: Retry-After %q, %s", resp.Header.Get("Retry-After"), body)
	}
	if code, body := s.doKey(other, "GET", "/api/projects", nil, nil); code != 200 {
		t.Fatalf("another key while the first is limited: %d %s", code, body)
	}
	time.Sleep(time.Duration(retry) * time.Second)
	if code, body := s.do("GET", "/api/projects", nil, nil); code != 200 {
		t.Fatalf("after Retry-After: %d %s", code, body)
	}
}
