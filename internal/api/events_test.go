package api

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/apikey"
	"github.com/lizard-build/lizard/internal/events"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/store/sqlite"
	"github.com/lizard-build/lizard/internal/webhook"
)

// newEventsAPI is the API's event and webhook routes over a real store,
// event log and webhooks, for two projects (fuzzKey's and otherKey's).
func newEventsAPI(t *testing.T) (*httptest.Server, *events.Log, map[string]store.Project) {
	t.Helper()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "lizard.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctx := context.Background()
	projects := map[string]store.Project{}
	for _, pk := range []struct{ slug, key string }{{"default", fuzzKey}, {"other", otherKey}} {
		p, err := st.CreateProject(ctx, pk.slug, pk.slug)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.CreateKey(ctx, p.ID, pk.key); err != nil {
			t.Fatal(err)
		}
		projects[pk.key] = p
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	keys, err := apikey.Open(ctx, apikey.Config{Store: st, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { keys.Close() })
	evlog, err := events.New(events.Config{Store: st, Logger: log, PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(evlog.Close)
	hooks := webhook.New(webhook.Config{Store: st, Logger: log})
	t.Cleanup(hooks.Close)
	srv := httptest.NewServer(Handler(Config{Keys: keys, Logger: log, Events: evlog, Webhooks: hooks}))
	t.Cleanup(srv.Close)
	return srv, evlog, projects
}

func call(t *testing.T, srv *httptest.Server, key, method, path, body string, header ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-Key", key)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestEventRoutesRefuse: bad parameters of GET /api/events and bad
// webhooks are 400s naming the field; another project's webhook is not
// found.
func TestEventRoutesRefuse(t *testing.T) {
	srv, _, _ := newEventsAPI(t)
	for _, tc := range []struct {
		method, path, body string
		header             []string
		status             int
		mention            []string
	}{
		{"GET", "/api/events?type=sandbox.paused,sandbox.exploded", "", nil, 400, []string{`type[1] \"sandbox.exploded\"`}},
		{"GET", "/api/events?since=yesterday", "", nil, 400, []string{"since"}},
		{"GET", "/api/events", "", []string{"Last-Event-ID", "evt_nope"}, 400, []string{"Last-Event-ID", `"code":"event_not_found"`}},
		{"GET", "/api/events?lastEventId=evt_nope", "", nil, 400, []string{"Last-Event-ID", "event_not_found"}},
		{"POST", "/api/webhooks", `{"url":"http://127.0.0.1:9/x"}`, nil, 400, []string{`url \"http://127.0.0.1:9/x\"`, `"code":"webhook_url_refused"`, "--webhook-allow"}},
		{"POST", "/api/webhooks", `{"url":"http://169.254.169.254/"}`, nil, 400, []string{"url", "webhook_url_refused"}},
		{"POST", "/api/webhooks", `{}`, nil, 400, []string{"url: required"}},
		{"POST", "/api/webhooks", `{"url":"https://93.184.215.14/x","events":["nope"]}`, nil, 400, []string{"events[0]"}},
		{"POST", "/api/webhooks", `{"url":"https://93.184.215.14/x","secret":"short"}`, nil, 400, []string{"secret"}},
		{"POST", "/api/webhooks", `{"url":7}`, nil, 400, []string{`field \"url\"`}},
		{"POST", "/api/webhooks", `{`, nil, 400, []string{"malformed JSON"}},
		{"GET", "/api/webhooks/whk_nope", "", nil, 404, []string{"webhook_not_found"}},
		{"DELETE", "/api/webhooks/whk_nope", "", nil, 404, []string{"webhook_not_found"}},
		{"GET", "/api/webhooks/whk_nope/deliveries?limit=x", "", nil, 400, []string{"limit"}},
		{"GET", "/api/webhooks/whk_nope/deliveries?limit=0", "", nil, 400, []string{"limit"}},
		{"GET", "/api/webhooks/whk_nope/deliveries", "", nil, 404, []string{"webhook_not_found"}},
	} {
		status, body := call(t, srv, fuzzKey, tc.method, tc.path, tc.body, tc.header...)
		ok := status == tc.status
		for _, m := range tc.mention {
			ok = ok && strings.Contains(body, m)
		}
		if !ok {
			t.Errorf("%s %s %s: %d %s, want %d mentioning %q", tc.method, tc.path, tc.body, status, body, tc.status, tc.mention)
		}
	}
	// A webhook of one project is no other's.
	status, body := call(t, srv, fuzzKey, "POST", "/api/webhooks", `{"url":"https://93.184.215.14/hook","events":["sandbox.killed"]}`)
	var w webhookInfo
	if status != 201 || json.Unmarshal([]byte(body), &w) != nil || w.Secret == "" || w.ID == "" || len(w.Events) != 1 {
		t.Fatalf("create: %d %s", status, body)
	}
	for _, path := range []string{"/api/webhooks/" + w.ID, "/api/webhooks/" + w.ID + "/deliveries"} {
		if status, body := call(t, srv, otherKey, "GET", path, ""); status != 404 {
			t.Errorf("GET %s with another project's key: %d %s", path, status, body)
		}
	}
	if status, body := call(t, srv, otherKey, "GET", "/api/webhooks", ""); status != 200 || body != "[]\n" {
		t.Errorf("another project's list: %d %s", status, body)
	}
	if status, _ := call(t, srv, otherKey, "DELETE", "/api/webhooks/"+w.ID, ""); status != 404 {
		t.Errorf("DELETE by another project: %d", status)
	}
	if status, body := call(t, srv, fuzzKey, "GET", "/api/webhooks/"+w.ID, ""); status != 200 || strings.Contains(body, "secret") {
		t.Errorf("GET: %d %s (no secret)", status, body)
	}
	if status, _ := call(t, srv, fuzzKey, "DELETE", "/api/webhooks/"+w.ID, ""); status != 204 {
		t.Errorf("DELETE: %d", status)
	}
}

// TestEventStream: GET /api/events is a stream of SSE events, each with
// its id, of the key's project only, filtered.
func TestEventStream(t *testing.T) {
	srv, evlog, projects := newEventsAPI(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	open := func(key, query string) *bufio.Reader {
		req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/api/events"+query, nil)
		req.Header.Set("X-API-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
			t.Fatalf("GET /api/events%s: %d %s", query, resp.StatusCode, resp.Header)
		}
		return bufio.NewReader(resp.Body)
	}
	mine := open(fuzzKey, "?type=sandbox.paused&sandboxId=sb1")
	theirs := open(otherKey, "")
	p := projects[fuzzKey]
	evlog.Publish(sandbox.Event{Type: sandbox.EventCreated, ProjectID: p.ID, SandboxID: "sb1"})
	evlog.Publish(sandbox.Event{Type: sandbox.EventPaused, ProjectID: p.ID, SandboxID: "sb2"})
	evlog.Publish(sandbox.Event{Type: sandbox.EventPaused, ProjectID: p.ID, SandboxID: "sb1", By: sandbox.CauseTimeout})
	q := projects[otherKey]
	evlog.Publish(sandbox.Event{Type: sandbox.EventKilled, ProjectID: q.ID, SandboxID: "sbq"})
	next := func(r *bufio.Reader) (id string, ev events.Event) {
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				t.Fatalf("stream: %v", err)
			}
			line = strings.TrimRight(line, "\n")
			switch {
			case strings.HasPrefix(line, "id: "):
				id = strings.TrimPrefix(line, "id: ")
			case strings.HasPrefix(line, "data: "):
				if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev); err != nil {
					t.Fatal(err)
				}
				return id, ev
			}
		}
	}
	id, ev := next(mine)
	if ev.Type != sandbox.EventPaused || ev.SandboxID != "sb1" || ev.By != sandbox.CauseTimeout || id != ev.ID || ev.ProjectID != p.ID {
		t.Fatalf("the filtered stream's first event: %s %+v", id, ev)
	}
	if _, ev := next(theirs); ev.ProjectID != q.ID || ev.SandboxID != "sbq" {
		t.Fatalf("the other project's stream: %+v", ev)
	}
}
