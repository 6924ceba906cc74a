package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/events"
	"github.com/lizard-build/lizard/internal/netguard"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/sandbox/sandboxtest"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/store/dbtest"
	"github.com/lizard-build/lizard/internal/store/sqlite"
)

// TestSign: the signature is HMAC-SHA256 of "<timestamp>.<body>" in hex
// after "v1=" (the string docs/API-EXTENSIONS.md gives receivers), and
// Verify refuses what was not signed so.
func TestSign(t *testing.T) {
	secret := "whsec_test_secret_0123456789"
	body := []byte(`{"id":"evt_1","type":"sandbox.paused"}`)
	// Computed apart: python3 -c 'import hmac,hashlib; print(hmac.new(SECRET, b"1733250000."+BODY, hashlib.sha256).hexdigest())'
	const want = "v1=566f56cb2c61b2bb3faea831bf3a347a40531a2e63474ba5d35da2991d7be5ce"
	if got := Sign(secret, 1733250000, body); got != want {
		t.Fatalf("Sign: %s, want %s", got, want)
	}
	at := time.Unix(1733250000, 0)
	if err := Verify(secret, "1733250000", want, body, at.Add(time.Minute), 5*time.Minute); err != nil {
		t.Fatalf("Verify of a good delivery: %v", err)
	}
	for name, tc := range map[string]struct {
		secret, ts, sig string
		body            []byte
		now             time.Time
	}{
		"another body":        {secret, "1733250000", want, []byte(`{"id":"evt_2"}`), at},
		"another secret":      {"whsec_other_secret_01234", "1733250000", want, body, at},
		"another timestamp":   {secret, "1733250001", want, body, at},
		"too old":             {secret, "1733250000", want, body, at.Add(10 * time.Minute)},
		"no version":          {secret, "1733250000", strings.TrimPrefix(want, "v1="), body, at},
		"not a number":        {secret, "yesterday", want, body, at},
		"signature truncated": {secret, "1733250000", want[:20], body, at},
	} {
		if err := Verify(tc.secret, tc.ts, tc.sig, tc.body, tc.now, 5*time.Minute); err == nil {
			t.Errorf("Verify with %s: accepted", name)
		}
	}
}

// TestBackoff: each wait is in the upper half of base·2^(n-1), capped at
// an hour; a delivery that always fails is attempted again and again for
// at least 24 hours after its event, then ends as failed (the schedule
// run with an injected clock).
func TestBackoff(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	base := 30 * time.Second
	for n, full := range map[int]time.Duration{1: 30 * time.Second, 2: time.Minute, 3: 2 * time.Minute, 7: 32 * time.Minute, 8: time.Hour, 9: time.Hour, 40: time.Hour} {
		for range 50 {
			if d := Backoff(n, base, rnd); d < full/2 || d > full {
				t.Fatalf("Backoff(%d) = %s, want %s to %s", n, d, full/2, full)
			}
		}
	}
	// Jitter: two deliveries failing together do not retry together.
	if a, b := Backoff(5, base, rnd), Backoff(5, base, rnd); a == b {
		t.Errorf("two waits of the same attempt alike: %s", a)
	}

	created := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	now := created
	clock := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return now
	}
	s := New(Config{Store: nopStore{}, Now: clock, Rand: rand.New(rand.NewPCG(3, 4))})
	defer s.Close()
	d := store.Delivery{ID: "dlv_1", CreatedAt: created}
	var waits []time.Duration
	for n := 1; ; n++ {
		r := s.outcome(d, store.Attempt{N: n, At: clock(), StatusCode: 500, Error: "HTTP 500"})
		if r.State == store.DeliveryFailed {
			if age := clock().Sub(created); age < RetryFor {
				t.Fatalf("given up after %d attempts, %s after the event: want at least %s", n, age, RetryFor)
			}
			if n < 30 || n > 50 {
				t.Fatalf("%d attempts in %s: the schedule changed (waits %v)", n, clock().Sub(created), waits)
			}
			t.Logf("%d attempts over %s", n, clock().Sub(created).Round(time.Minute))
			break
		}
		if r.State != store.DeliveryPending || r.RetryIn <= 0 {
			t.Fatalf("after failed attempt %d: %+v", n, r)
		}
		waits = append(waits, r.RetryIn)
		mu.Lock()
		now = now.Add(r.RetryIn)
		mu.Unlock()
	}
	if r := s.outcome(d, store.Attempt{N: 1, At: clock(), StatusCode: 204}); r.State != store.DeliveryDelivered {
		t.Fatalf("a 204: %+v", r)
	}
}

// nopStore is a Store with nothing in it.
type nopStore struct{ Store }

func (nopStore) ReleaseClaims(context.Context, store.Fence) error { return nil }
func (nopStore) ClaimDeliveries(context.Context, store.Fence, time.Duration, int) ([]store.Delivery, error) {
	return nil, nil
}
func (nopStore) PruneDeliveries(context.Context, time.Time) (int64, error) { return 0, nil }

// env is a project's store, its event log and webhooks, with receivers
// on the loopback address that --webhook-allow lets through.
type env struct {
	st      *sqlite.Store
	path    string
	project store.Project
	log     *events.Log
	guard   *netguard.Policy
}

func newEnv(t *testing.T) *env {
	t.Helper()
	path := filepath.Join(t.TempDir(), "lizard.db")
	st, err := sqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	p, err := st.CreateProject(context.Background(), "p", "p")
	if err != nil {
		t.Fatal(err)
	}
	guard, err := netguard.New("--webhook-allow", []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{st: st, path: path, project: p, guard: guard}
	e.openLog(t)
	return e
}

// openLog starts the event log over e's store (a restart when called
// again).
func (e *env) openLog(t *testing.T) {
	t.Helper()
	l, err := events.New(events.Config{Store: e.st, Logger: sandboxtest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
	e.log = l
}

// service starts webhooks over e's store (a restart when called again).
func (e *env) service(t *testing.T, edit func(*Config)) *Service {
	t.Helper()
	cfg := Config{Store: e.st, Guard: e.guard, RetryBase: 20 * time.Millisecond, PollInterval: 20 * time.Millisecond, Logger: sandboxtest.Logger(t)}
	if edit != nil {
		edit(&cfg)
	}
	s := New(cfg)
	t.Cleanup(s.Close)
	return s
}

func (e *env) publish(typ, sandboxID string) {
	e.log.Publish(sandbox.Event{Type: typ, ProjectID: e.project.ID, SandboxID: sandboxID, By: sandbox.CauseAPI})
}

// receiver is a webhook endpoint of the test: it checks every delivery's
// signature and answers with what answer says.
type receiver struct {
	t      *testing.T
	srv    *httptest.Server
	secret string
	mu     sync.Mutex
	got    []delivery
	answer func(n int) int // status of the nth request (from 1)
}

type delivery struct {
	header http.Header
	event  events.Event
	err    error // of the signature check
	status int   // the receiver's answer
}

func newReceiver(t *testing.T, answer func(n int) int) *receiver {
	r := &receiver{t: t, answer: answer}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		d := delivery{header: req.Header.Clone()}
		r.mu.Lock()
		d.err = Verify(r.secret, req.Header.Get(TimestampHeader), req.Header.Get(SignatureHeader), body, time.Now(), 5*time.Minute)
		if err := json.Unmarshal(body, &d.event); err != nil && d.err == nil {
			d.err = err
		}
		d.status = r.answer(len(r.got) + 1)
		r.got = append(r.got, d)
		r.mu.Unlock()
		w.WriteHeader(d.status)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) deliveries() []delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]delivery(nil), r.got...)
}

func (r *receiver) create(t *testing.T, s *Service, project string, types ...string) store.Webhook {
	t.Helper()
	w, err := s.Create(context.Background(), project, Request{URL: r.srv.URL + "/hook", Types: types})
	if err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	r.secret = w.Secret
	r.mu.Unlock()
	return w
}

func always(status int) func(int) int { return func(int) int { return status } }

// TestDeliver: deliveries are signed and carry the event with its stable
// id; a receiver that answers 500 three times gets the event on the
// fourth attempt, every attempt kept with its answer; the types filter.
func TestDeliver(t *testing.T) {
	e := newEnv(t)
	s := e.service(t, nil)
	flaky := newReceiver(t, func(n int) int {
		if n <= 3 {
			return 500
		}
		return 204
	})
	w := flaky.create(t, s, e.project.ID, sandbox.EventPaused)
	if !strings.HasPrefix(w.Secret, "whsec_") || len(w.Secret) < 32 {
		t.Fatalf("a made secret: %q", w.Secret)
	}
	e.publish(sandbox.EventCreated, "sb1") // not wanted
	e.publish(sandbox.EventPaused, "sb1")
	sandboxtest.Eventually(t, "the fourth attempt", func() bool { return len(flaky.deliveries()) >= 4 })
	time.Sleep(100 * time.Millisecond) // no fifth
	got := flaky.deliveries()
	if len(got) != 4 {
		t.Fatalf("%d requests, want 4", len(got))
	}
	for i, d := range got {
		if d.err != nil {
			t.Fatalf("request %d: %v", i+1, d.err)
		}
		h := d.header
		if d.event.Type != sandbox.EventPaused || d.event.SandboxID != "sb1" || h.Get(EventIDHeader) != d.event.ID || d.event.ID != got[0].event.ID ||
			h.Get(EventTypeHeader) != sandbox.EventPaused || h.Get(WebhookIDHeader) != w.ID || h.Get(AttemptHeader) != strconv.Itoa(i+1) ||
			h.Get(DeliveryHeader) != got[0].header.Get(DeliveryHeader) || h.Get("Content-Type") != "application/json" {
			t.Fatalf("request %d: %+v %v", i+1, d.event, h)
		}
	}
	var ds []store.Delivery
	sandboxtest.Eventually(t, "the delivery recorded delivered", func() bool {
		var err error
		ds, err = s.Deliveries(context.Background(), e.project.ID, w.ID, 10)
		return err == nil && len(ds) == 1 && ds[0].State == store.DeliveryDelivered
	})
	d := ds[0]
	if d.EventID != got[0].event.ID || d.Attempts != 4 || len(d.History) != 4 {
		t.Fatalf("the delivery: %+v", d)
	}
	for i, a := range d.History {
		want := 500
		if i == 3 {
			want = 204
		}
		if a.N != i+1 || a.StatusCode != want || (want == 500) != (a.Error == "HTTP 500") || a.At.IsZero() {
			t.Fatalf("attempt %d: %+v", i+1, a)
		}
	}
	if _, err := s.Deliveries(context.Background(), "prj_other", w.ID, 10); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another project's deliveries: %v", err)
	}
}

// TestRestart: deliveries pending when the server stops, attempted and
// refused or not attempted yet, are made after it starts again; none is
// lost.
func TestRestart(t *testing.T) {
	e := newEnv(t)
	s := e.service(t, func(c *Config) { c.RetryBase = 300 * time.Millisecond })
	var mu sync.Mutex
	down := true
	r := newReceiver(t, func(int) int {
		mu.Lock()
		defer mu.Unlock()
		if down {
			return 503
		}
		return 200
	})
	r.create(t, s, e.project.ID)
	for i := range 3 {
		e.publish(sandbox.EventCreated, fmt.Sprintf("sb%d", i))
	}
	sandboxtest.Eventually(t, "three refused attempts", func() bool { return len(r.deliveries()) >= 3 })
	s.Close()
	// Two more while no deliverer runs.
	e.publish(sandbox.EventKilled, "sb0")
	e.publish(sandbox.EventKilled, "sb1")
	e.log.Close()
	e.st.Close()

	// The restart: the database opened again, a new log and deliverer.
	st, err := sqlite.Open(e.path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	e.st = st
	e.openLog(t)
	mu.Lock()
	down = false
	mu.Unlock()
	e.service(t, nil)
	ok := func() map[string]delivery {
		got := map[string]delivery{}
		for _, d := range r.deliveries() {
			if d.err != nil {
				t.Fatalf("a delivery: %v", d.err)
			}
			if d.status == 200 {
				got[d.event.Type+"/"+d.event.SandboxID] = d
			}
		}
		return got
	}
	sandboxtest.Eventually(t, "the five events after the restart", func() bool { return len(ok()) == 5 })
	for _, key := range []string{"sandbox.created/sb0", "sandbox.created/sb1", "sandbox.created/sb2", "sandbox.killed/sb0", "sandbox.killed/sb1"} {
		if _, seen := ok()[key]; !seen {
			t.Fatalf("%s not delivered: %v", key, ok())
		}
	}
}

// TestCreate: the fields of a webhook, each refusal naming its field; a
// URL on a loopback, link-local or private address is refused unless the
// operator allows its host; the project's max.
func TestCreate(t *testing.T) {
	e := newEnv(t)
	strict := e.service(t, func(c *Config) { c.Guard = nil; c.MaxWebhooks = 2 })
	allowing := e.service(t, nil)
	ctx := context.Background()
	for _, tc := range []struct {
		req         Request
		field, code string
		allowedToo  bool
	}{
		{Request{}, "url", "", true},
		{Request{URL: "ftp://example.com/x"}, "url", "", true},
		{Request{URL: "https:///x"}, "url", "", true},
		{Request{URL: "https://user:pw@example.com/x"}, "url", "", true},
		{Request{URL: "https://example.com/x#frag"}, "url", "", true},
		{Request{URL: "https://example.com/" + strings.Repeat("a", 2048)}, "url", "", true},
		{Request{URL: "http://127.0.0.1:9/hook"}, "url", CodeURLRefused, false},
		{Request{URL: "http://localhost/hook"}, "url", CodeURLRefused, true}, // allowed: 127.0.0.1 only, not the name
		{Request{URL: "http://10.0.0.7/hook"}, "url", CodeURLRefused, true},
		{Request{URL: "http://169.254.169.254/latest/meta-data"}, "url", CodeURLRefused, true},
		{Request{URL: "http://[::1]:8080/"}, "url", CodeURLRefused, true},
		{Request{URL: "http://192.168.1.1/"}, "url", CodeURLRefused, true},
		{Request{URL: "https://93.184.215.14/hook", Types: []string{"sandbox.paused", "sandbox.exploded"}}, "events[1]", "", true},
		{Request{URL: "https://93.184.215.14/hook", Secret: "short"}, "secret", "", true},
		{Request{URL: "https://93.184.215.14/hook", Secret: "has a space in the middle"}, "secret", "", true},
	} {
		for _, s := range []*Service{strict, allowing} {
			if s == allowing && !tc.allowedToo {
				continue
			}
			_, err := s.Create(ctx, e.project.ID, tc.req)
			if !errors.Is(err, errdefs.ErrInvalid) || !strings.HasPrefix(err.Error(), tc.field) || tc.code != "" && errdefs.Code(err) != tc.code {
				t.Errorf("Create %+v: %v (code %q), want ErrInvalid naming %s, code %q", tc.req, err, errdefs.Code(err), tc.field, tc.code)
			}
		}
	}
	// Allowed by the operator: the loopback receiver of a test.
	w, err := allowing.Create(ctx, e.project.ID, Request{URL: "http://127.0.0.1:9/hook", Types: []string{"sandbox.paused", "sandbox.paused"},
		Secret: "my-own-secret-0123456789"})
	if err != nil {
		t.Fatal(err)
	}
	if w.Secret != "my-own-secret-0123456789" || len(w.Types) != 1 || w.URL != "http://127.0.0.1:9/hook" {
		t.Fatalf("created: %+v", w)
	}
	// A public address.
	if _, err := strict.Create(ctx, e.project.ID, Request{URL: "https://93.184.215.14/hook"}); err != nil {
		t.Fatalf("a public address: %v", err)
	}
	if _, err := strict.Create(ctx, e.project.ID, Request{URL: "https://93.184.215.14/hook2"}); !errors.Is(err, errdefs.ErrLimit) {
		t.Fatalf("a third webhook over a max of 2: %v, want ErrLimit", err)
	}
	ws, err := strict.List(ctx, e.project.ID)
	if err != nil || len(ws) != 2 || ws[0].Secret != "" || ws[1].Secret != "" {
		t.Fatalf("List: %+v %v (no secrets)", ws, err)
	}
	if got, err := strict.Get(ctx, e.project.ID, w.ID); err != nil || got.URL != w.URL || got.Secret != "" {
		t.Fatalf("Get: %+v %v", got, err)
	}
	if _, err := strict.Get(ctx, "prj_other", w.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Get by another project: %v", err)
	}
	if err := strict.Delete(ctx, "prj_other", w.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Delete by another project: %v", err)
	}
	if err := strict.Delete(ctx, e.project.ID, w.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := strict.Deliveries(ctx, e.project.ID, w.ID, 0); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("Deliveries with limit 0: %v", err)
	}
}

// TestRefusedAtDial: a delivery's connection is checked again when it is
// made: a URL that was allowed when the webhook was made, but is not by
// the deliverer's rule, is refused without a connection.
func TestRefusedAtDial(t *testing.T) {
	e := newEnv(t)
	s := e.service(t, nil)
	r := newReceiver(t, always(200))
	w := r.create(t, s, e.project.ID)
	s.Close()
	strict := e.service(t, func(c *Config) { c.Guard = nil; c.RetryBase = time.Hour })
	e.publish(sandbox.EventKilled, "sb1")
	var ds []store.Delivery
	sandboxtest.Eventually(t, "a refused attempt", func() bool {
		ds, _ = strict.Deliveries(context.Background(), e.project.ID, w.ID, 10)
		return len(ds) == 1 && len(ds[0].History) == 1
	})
	if a := ds[0].History[0]; a.StatusCode != 0 || a.Error != errRefusedAddr.Error() || ds[0].State != store.DeliveryPending {
		t.Fatalf("the attempt: %+v (%s)", a, ds[0].State)
	}
	if n := len(r.deliveries()); n != 0 {
		t.Fatalf("the receiver got %d requests", n)
	}
}

// TestRedirect: a redirect is an answer, not followed: the attempt fails
// with its status.
func TestRedirect(t *testing.T) {
	e := newEnv(t)
	s := e.service(t, func(c *Config) { c.RetryBase = time.Hour })
	target := newReceiver(t, always(200))
	redirect := httptest.NewServer(http.RedirectHandler(target.srv.URL, http.StatusFound))
	t.Cleanup(redirect.Close)
	u, _ := url.Parse(redirect.URL)
	w, err := s.Create(context.Background(), e.project.ID, Request{URL: u.String()})
	if err != nil {
		t.Fatal(err)
	}
	e.publish(sandbox.EventKilled, "sb1")
	var ds []store.Delivery
	sandboxtest.Eventually(t, "the attempt", func() bool {
		ds, _ = s.Deliveries(context.Background(), e.project.ID, w.ID, 10)
		return len(ds) == 1 && len(ds[0].History) == 1
	})
	if a := ds[0].History[0]; a.StatusCode != 302 || a.Error != "HTTP 302" {
		t.Fatalf("the attempt: %+v", a)
	}
	if len(target.deliveries()) != 0 {
		t.Fatal("the redirect was followed")
	}
}

// TestOnceAcrossNodes: two nodes' deliverers on one database (a cluster)
// deliver each event once, each claiming under its own fence, on both
// backends.
func TestOnceAcrossNodes(t *testing.T) { dbtest.Each(t, onceAcrossNodes) }

func onceAcrossNodes(t *testing.T, open func() dbtest.Database) {
	ctx := context.Background()
	db := open()
	p, err := db.CreateProject(ctx, "p", "p")
	if err != nil {
		t.Fatal(err)
	}
	evlog, err := events.New(events.Config{Store: db, Logger: sandboxtest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(evlog.Close)
	guard, _ := netguard.New("--webhook-allow", []string{"127.0.0.1"})
	r := newReceiver(t, always(200))
	var nodes []*Service
	for _, name := range []string{"a", "b"} {
		st := open()
		f, err := st.RegisterNode(ctx, store.NodeInfo{Name: name, Address: name + ":7070"}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		s := New(Config{Store: st, Guard: guard, Fence: func() store.Fence { return f }, PollInterval: 5 * time.Millisecond, Workers: 2,
			Logger: sandboxtest.Logger(t)})
		t.Cleanup(s.Close)
		nodes = append(nodes, s)
	}
	r.create(t, nodes[0], p.ID)
	const n = 40
	for i := range n {
		evlog.Publish(sandbox.Event{Type: sandbox.EventCreated, ProjectID: p.ID, SandboxID: fmt.Sprintf("sb%d", i)})
	}
	sandboxtest.Eventually(t, "every event delivered", func() bool { return len(r.deliveries()) >= n })
	time.Sleep(100 * time.Millisecond)
	count := map[string]int{}
	for _, d := range r.deliveries() {
		if d.err != nil {
			t.Fatal(d.err)
		}
		count[d.event.ID]++
	}
	if len(count) != n || len(r.deliveries()) != n {
		t.Fatalf("%d requests for %d events, want each once", len(r.deliveries()), len(count))
	}
}
