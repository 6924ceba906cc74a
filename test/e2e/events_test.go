package e2e

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// event is an event as GET /api/events and webhooks carry it.
type event struct {
	ID        string    `json:"id"`
	Type      string    `json:"type"`
	ProjectID string    `json:"projectId"`
	SandboxID string    `json:"sandboxId"`
	By        string    `json:"by"`
	At        time.Time `json:"at"`
}

// stream is a GET /api/events of the test's, read as it comes.
type stream struct {
	events chan streamed
	cancel context.CancelFunc
}

type streamed struct {
	id string // the SSE id
	ev event
}

// openStream opens GET /api/events with key (and Last-Event-ID when
// lastID is set) and reads it until the test ends.
func openStream(t *testing.T, s *server, key, query, lastID string) *stream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", s.url+"/api/events"+query, nil)
	req.Header.Set("X-API-Key", key)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		t.Fatalf("GET /api/events%s: %d %s", query, resp.StatusCode, b)
	}
	st := &stream{events: make(chan streamed, 100), cancel: cancel}
	go func() {
		defer resp.Body.Close()
		r := bufio.NewReader(resp.Body)
		var id string
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				close(st.events)
				return
			}
			line = strings.TrimRight(line, "\n")
			switch {
			case strings.HasPrefix(line, "id: "):
				id = strings.TrimPrefix(line, "id: ")
			case strings.HasPrefix(line, "data: "):
				var ev event
				if json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev) == nil {
					st.events <- streamed{id: id, ev: ev}
				}
			}
		}
	}()
	t.Cleanup(cancel)
	return st
}

// next is the stream's next event within d.
func (st *stream) next(t *testing.T, d time.Duration) streamed {
	t.Helper()
	select {
	case e, ok := <-st.events:
		if !ok {
			t.Fatal("the event stream ended")
		}
		return e
	case <-time.After(d):
		t.Fatalf("no event within %s", d)
	}
	return streamed{}
}

// hookReceiver is the test's webhook endpoint on the loopback address
// (which the server is allowed to reach by --webhook-allow): it checks
// each delivery's signature as docs/API-EXTENSIONS.md tells receivers to,
// and answers what its path's answer says.
type hookReceiver struct {
	srv     *httptest.Server
	mu      sync.Mutex
	secrets map[string]string                      // path → secret
	answer  map[string]func(ev event, nth int) int // path → status of the nth request carrying ev
	got     map[string][]received                  // path → requests
	byEvent map[string]map[string]int              // path → event id → requests
}

type received struct {
	ev     event
	header http.Header
	status int
	err    error // of the signature check
}

func newHookReceiver(t *testing.T) *hookReceiver {
	h := &hookReceiver{secrets: map[string]string{}, answer: map[string]func(event, int) int{}, got: map[string][]received{},
		byEvent: map[string]map[string]int{}}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rec := received{header: r.Header.Clone()}
		h.mu.Lock()
		defer h.mu.Unlock()
		rec.err = verifySignature(h.secrets[r.URL.Path], r.Header.Get("Lizard-Timestamp"), r.Header.Get("Lizard-Signature"), body)
		if err := json.Unmarshal(body, &rec.ev); err != nil && rec.err == nil {
			rec.err = err
		}
		if h.byEvent[r.URL.Path] == nil {
			h.byEvent[r.URL.Path] = map[string]int{}
		}
		h.byEvent[r.URL.Path][rec.ev.ID]++
		rec.status = 200
		if a := h.answer[r.URL.Path]; a != nil {
			rec.status = a(rec.ev, h.byEvent[r.URL.Path][rec.ev.ID])
		}
		h.got[r.URL.Path] = append(h.got[r.URL.Path], rec)
		w.WriteHeader(rec.status)
	}))
	t.Cleanup(h.srv.Close)
	return h
}

// verifySignature checks a delivery as docs/API-EXTENSIONS.md says:
// HMAC-SHA256 with the secret of "<Lizard-Timestamp>.<body>", hex, after
// "v1=", and a timestamp within five minutes.
func verifySignature(secret, ts, sig string, body []byte) error {
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("Lizard-Timestamp %q", ts)
	}
	if d := time.Since(time.Unix(sec, 0)); d > 5*time.Minute || d < -5*time.Minute {
		return fmt.Errorf("Lizard-Timestamp %q is %s away", ts, d)
	}
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(ts + "."))
	m.Write(body)
	if want := "v1=" + hex.EncodeToString(m.Sum(nil)); !hmac.Equal([]byte(sig), []byte(want)) {
		return fmt.Errorf("Lizard-Signature %q, want %q", sig, want)
	}
	return nil
}

// of is what path received, carrying events of sandbox id ("" for all).
func (h *hookReceiver) of(path, id string) []received {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []received
	for _, r := range h.got[path] {
		if id == "" || r.ev.SandboxID == id {
			out = append(out, r)
		}
	}
	return out
}

// create makes a webhook of s's project to path of the receiver, for
// types (none: every type).
func (h *hookReceiver) create(t *testing.T, s *server, path string, types ...string) string {
	t.Helper()
	var w struct {
		ID     string   `json:"id"`
		Secret string   `json:"secret"`
		Events []string `json:"events"`
	}
	body := map[string]any{"url": h.srv.URL + path}
	if types != nil {
		body["events"] = types
	}
	if code, raw := s.do("POST", "/api/webhooks", body, &w); code != http.StatusCreated || w.Secret == "" {
		t.Fatalf("POST /api/webhooks %s: %d %s", path, code, raw)
	}
	h.mu.Lock()
	h.secrets[path] = w.Secret
	h.mu.Unlock()
	return w.ID
}

// TestEvents: a sandbox driven by the official SDK shows on the project's
// event stream (created, paused, resumed, killed, with their cause) and
// reaches its webhooks, signed, with the same stable ids; a receiver that
// answers 500 three times gets the event on the fourth attempt, every
// attempt readable through the API; a stream resumes with Last-Event-ID;
// another project's key sees none of it; a webhook on a private address
// is refused without the operator's allowance; deliveries pending when
// the server stops are made after it starts again.
func TestEvents(t *testing.T) {
	hooks := newHookReceiver(t)
	s := startServer(t, "", "--webhook-allow", "127.0.0.1", "--webhook-retry-base", "200ms")

	// The loopback address is allowed; private and link-local ones are
	// not.
	for _, u := range []string{"http://10.1.2.3/hook", "http://169.254.169.254/latest", "http://192.168.0.10:8080/"} {
		code, body := s.do("POST", "/api/webhooks", map[string]any{"url": u}, nil)
		if code != http.StatusBadRequest || !strings.Contains(string(body), `"code":"webhook_url_refused"`) ||
			!strings.Contains(string(body), `url \"`+u) {
			t.Fatalf("a webhook to %s: %d %s, want 400 webhook_url_refused naming url", u, code, body)
		}
	}
	allID := hooks.create(t, s, "/all")
	flakyID := hooks.create(t, s, "/flaky", "sandbox.paused")
	hooks.mu.Lock()
	hooks.answer["/flaky"] = func(_ event, nth int) int {
		if nth <= 3 {
			return 500
		}
		return 200
	}
	hooks.mu.Unlock()

	s.cli(t, "projects", "create", "events-other")
	other := s.newKey(t, "events-other")
	mine := openStream(t, s, s.key, "", "")
	theirs := openStream(t, s, other, "", "")
	killedOnly := openStream(t, s, s.key, "?type=sandbox.killed", "")

	ctx, cancel := context.WithTimeout(context.Background(), budget(5*time.Minute))
	defer cancel()
	out := filepath.Join(t.TempDir(), "sandbox-id")
	if err := s.runNodeEnv(ctx, []string{"EVENTS_OUT=" + out}, "js/events/lifecycle.test.mjs"); err != nil {
		t.Fatalf("the SDK's sandbox: %v", err)
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	id := string(raw)

	var seen []streamed
	for _, want := range []string{"sandbox.created", "sandbox.paused", "sandbox.resumed", "sandbox.killed"} {
		e := mine.next(t, budget(30*time.Second))
		if e.ev.Type != want || e.ev.SandboxID != id || e.ev.By != "api" || e.id != e.ev.ID || e.ev.ID == "" {
			t.Fatalf("the stream: %+v, want %s of %s by api", e, want, id)
		}
		seen = append(seen, e)
	}
	if e := killedOnly.next(t, budget(10*time.Second)); e.ev.ID != seen[3].ev.ID {
		t.Fatalf("the stream of kills: %+v, want %s", e, seen[3].ev.ID)
	}

	// The webhook of every type got the four, signed, with the stream's
	// ids.
	deadline := time.Now().Add(budget(30 * time.Second))
	for len(hooks.of("/all", id)) < 4 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	all := hooks.of("/all", id)
	if len(all) != 4 {
		t.Fatalf("/all got %d deliveries of %s, want 4", len(all), id)
	}
	for i, r := range all {
		if r.err != nil {
			t.Fatalf("delivery %d to /all: %v", i, r.err)
		}
		if r.ev.ID != seen[i].ev.ID || r.header.Get("Lizard-Event-Id") != r.ev.ID || r.header.Get("Lizard-Event-Type") != seen[i].ev.Type ||
			r.header.Get("Lizard-Webhook-Id") != allID {
			t.Fatalf("delivery %d to /all: %+v %v, want event %s", i, r.ev, r.header, seen[i].ev.ID)
		}
	}

	// The flaky receiver: the paused event only, on the fourth attempt.
	for len(hooks.of("/flaky", id)) < 4 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	flaky := hooks.of("/flaky", id)
	if len(flaky) != 4 {
		t.Fatalf("/flaky got %d requests, want 4 (three 500s, then 200)", len(flaky))
	}
	for i, r := range flaky {
		if r.err != nil || r.ev.ID != seen[1].ev.ID || r.header.Get("Lizard-Delivery-Attempt") != strconv.Itoa(i+1) {
			t.Fatalf("request %d to /flaky: %+v %v %v", i+1, r.ev, r.header, r.err)
		}
	}
	var deliveries []struct {
		EventID  string `json:"eventId"`
		State    string `json:"state"`
		Attempts []struct {
			Attempt    int `json:"attempt"`
			StatusCode int `json:"statusCode"`
		} `json:"attempts"`
	}
	for time.Now().Before(deadline) {
		s.do("GET", "/api/webhooks/"+flakyID+"/deliveries", nil, &deliveries)
		if len(deliveries) == 1 && deliveries[0].State == "delivered" {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(deliveries) != 1 || deliveries[0].EventID != seen[1].ev.ID || deliveries[0].State != "delivered" || len(deliveries[0].Attempts) != 4 {
		t.Fatalf("the flaky webhook's deliveries: %+v", deliveries)
	}
	for i, a := range deliveries[0].Attempts {
		want := 500
		if i == 3 {
			want = 200
		}
		if a.Attempt != i+1 || a.StatusCode != want {
			t.Fatalf("attempt %d: %+v, want %d", i+1, a, want)
		}
	}

	// A stream that reconnects after the create goes on from the pause.
	resumed := openStream(t, s, s.key, "", seen[0].ev.ID)
	for _, want := range seen[1:] {
		if e := resumed.next(t, budget(10*time.Second)); e.ev.ID != want.ev.ID {
			t.Fatalf("the resumed stream: %+v, want %s", e.ev, want.ev.ID)
		}
	}
	// Another project's key cannot resume from this project's event.
	req, _ := http.NewRequest("GET", s.url+"/api/events", nil)
	req.Header.Set("X-API-Key", other)
	req.Header.Set("Last-Event-ID", seen[0].ev.ID)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "event_not_found") {
		t.Fatalf("another project resuming after this project's event: %d %s", resp.StatusCode, b)
	}
	// The other project's stream: its own sandbox's events, none of ours.
	var theirSandbox sandboxInfo
	if code, body := s.doKey(other, "POST", "/api/sandboxes", map[string]any{"template": "base"}, &theirSandbox); code >= 300 {
		t.Fatalf("create with the other key: %d %s", code, body)
	}
	if code, body := s.doKey(other, "DELETE", "/api/sandboxes/"+theirSandbox.SandboxID, nil, nil); code >= 300 {
		t.Fatalf("kill with the other key: %d %s", code, body)
	}
	for _, want := range []string{"sandbox.created", "sandbox.killed"} {
		if e := theirs.next(t, budget(30*time.Second)); e.ev.Type != want || e.ev.SandboxID != theirSandbox.SandboxID {
			t.Fatalf("the other project's stream: %+v, want %s of its own sandbox %s", e.ev, want, theirSandbox.SandboxID)
		}
	}
	if n := len(hooks.of("/all", theirSandbox.SandboxID)); n != 0 {
		t.Fatalf("this project's webhook got %d deliveries of another project's sandbox", n)
	}

	// A restart with deliveries pending: the receiver refuses everything,
	// a sandbox comes and goes, the server stops with its two events
	// refused; once it is back, the receiver gets them.
	hooks.mu.Lock()
	down := true
	hooks.answer["/all"] = func(event, int) int {
		if down {
			return 503
		}
		return 204
	}
	hooks.mu.Unlock()
	var sb sandboxInfo
	if code, body := s.do("POST", "/api/sandboxes", map[string]any{"template": "base"}, &sb); code >= 300 {
		t.Fatalf("create: %d %s", code, body)
	}
	if code, body := s.do("DELETE", "/api/sandboxes/"+sb.SandboxID, nil, nil); code >= 300 {
		t.Fatalf("kill: %d %s", code, body)
	}
	refused := func() bool {
		kinds := map[string]bool{}
		for _, r := range hooks.of("/all", sb.SandboxID) {
			kinds[r.ev.Type] = true
		}
		return kinds["sandbox.created"] && kinds["sandbox.killed"]
	}
	for end := time.Now().Add(budget(30 * time.Second)); !refused() && time.Now().Before(end); {
		time.Sleep(50 * time.Millisecond)
	}
	if !refused() {
		t.Fatalf("the two events were not attempted before the stop: %+v", hooks.of("/all", sb.SandboxID))
	}
	s.stop()
	hooks.mu.Lock()
	down = false
	hooks.mu.Unlock()
	s.start()
	delivered := func() map[string]received {
		got := map[string]received{}
		for _, r := range hooks.of("/all", sb.SandboxID) {
			if r.status == 204 {
				got[r.ev.Type] = r
			}
		}
		return got
	}
	for end := time.Now().Add(budget(60 * time.Second)); len(delivered()) < 2 && time.Now().Before(end); {
		time.Sleep(100 * time.Millisecond)
	}
	got := delivered()
	if len(got) != 2 {
		t.Fatalf("after the restart /all got %v of %s, want created and killed", got, sb.SandboxID)
	}
	for _, r := range got {
		if r.err != nil || r.header.Get("Lizard-Delivery-Attempt") == "1" {
			t.Fatalf("a delivery after the restart: %v %v (want a retry of one refused before)", r.err, r.header)
		}
	}
	// And the stream resumes across the restart.
	again := openStream(t, s, s.key, "", seen[3].ev.ID)
	for _, want := range []string{"sandbox.created", "sandbox.killed"} {
		if e := again.next(t, budget(10*time.Second)); e.ev.Type != want || e.ev.SandboxID != sb.SandboxID {
			t.Fatalf("the stream resumed after the restart: %+v, want %s of %s", e.ev, want, sb.SandboxID)
		}
	}
	s.waitNoLeaks(t)
}
