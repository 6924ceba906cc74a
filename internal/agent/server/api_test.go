package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/agent/server"
	"github.com/lizard-build/lizard/internal/errdefs"
)

func TestNewRejectsEmptyToken(t *testing.T) {
	if _, err := server.New(server.Config{}); err == nil {
		t.Fatal("server.New accepted an empty token")
	}
}

func TestHealth(t *testing.T) {
	c := newClient(t)
	h, err := c.Health(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	if !h.OK || h.Pid != os.Getpid() {
		t.Fatalf("health = %+v, want ok and pid %d", h, os.Getpid())
	}
}

func TestTokenRequired(t *testing.T) {
	ts := newTestServer(t)
	for _, token := range []string{"", "wrong", testToken + "x"} {
		c := agent.NewClient(ts.URL, token, ts.Client())
		_, err := c.Health(testContext(t))
		wantClass(t, err, errdefs.ErrUnauthenticated)
		_, err = c.List(testContext(t), "/", "")
		wantClass(t, err, errdefs.ErrUnauthenticated)
	}
	status, e := rawRequest(t, ts.URL, http.MethodGet, "/health", "", false)
	if status != http.StatusUnauthorized || e.Code != "unauthenticated" {
		t.Fatalf("without token: %d %+v", status, e)
	}
}

// rawRequest sends body and decodes an agent.Error answer.
func rawRequest(t *testing.T, base, method, path, body string, withToken bool) (int, agent.Error) {
	t.Helper()
	req, err := http.NewRequest(method, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if withToken {
		req.Header.Set(agent.TokenHeader, testToken)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var e agent.Error
	if resp.StatusCode >= 300 {
		if err := json.Unmarshal(b, &e); err != nil {
			t.Fatalf("%s %s: %d answer %q is not JSON: %v", method, path, resp.StatusCode, b, err)
		}
	}
	return resp.StatusCode, e
}

func TestBadRequests(t *testing.T) {
	ts := newTestServer(t)
	tests := []struct {
		name       string
		method     string
		path       string
		body       string
		wantStatus int
		wantMsg    string
	}{
		{"truncated JSON", "POST", "/exec", `{"cmd":`, 400, "truncated"},
		{"malformed JSON", "POST", "/exec", `{cmd}`, 400, "malformed"},
		{"empty body", "POST", "/exec", ``, 400, "empty"},
		{"wrong type", "POST", "/exec", `{"cmd":"ls"}`, 400, "cmd"},
		{"trailing data", "POST", "/exec", `{"cmd":["ls"]} {}`, 400, "after"},
		{"signal pid type", "POST", "/processes/signal", `{"pid":"1","signal":"SIGTERM"}`, 400, "pid"},
		{"move without from", "POST", "/files/move", `{"to":"/tmp/x"}`, 400, "from"},
		{"file path missing", "GET", "/files", ``, 400, "path"},
		{"file path relative", "GET", "/files/stat?path=etc/passwd", ``, 400, "etc/passwd"},
		{"unknown user", "GET", "/files/stat?path=/&user=no-such-user-lizard", ``, 400, "no-such-user-lizard"},
		{"unknown route", "GET", "/nope", ``, 404, "/nope"},
		{"wrong method", "DELETE", "/health", ``, 404, "DELETE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, e := rawRequest(t, ts.URL, tt.method, tt.path, tt.body, true)
			if status != tt.wantStatus || !strings.Contains(e.Message, tt.wantMsg) {
				t.Fatalf("got %d %+v, want %d with %q in the message", status, e, tt.wantStatus, tt.wantMsg)
			}
			if tt.wantStatus == 400 && e.Code != "invalid" {
				t.Errorf("code %q, want invalid", e.Code)
			}
		})
	}
}

func TestSetToken(t *testing.T) {
	srv := newTestServer(t)
	old := agent.NewClient(srv.URL, testToken, nil)
	if err := old.SetToken(context.Background(), "short"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("short token: %v, want ErrInvalid", err)
	}
	c := agent.NewClient(srv.URL, testToken, nil)
	if err := c.SetToken(context.Background(), "a-brand-new-token-0123"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Health(context.Background()); err != nil {
		t.Fatalf("new token refused: %v", err)
	}
	if _, err := agent.NewClient(srv.URL, testToken, nil).Health(context.Background()); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Fatalf("old token still accepted: %v", err)
	}
}
