package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
)

// eventsOf is open's store as store.Events.
func eventsOf(t *testing.T, open func() store.Store) (store.Store, store.Events) {
	t.Helper()
	st := open()
	ev, ok := st.(store.Events)
	if !ok {
		t.Fatalf("%T does not implement store.Events", st)
	}
	return st, ev
}

func event(project, sandbox, typ string, at time.Time) store.Event {
	id := store.NewID("evt_", 20)
	data, _ := json.Marshal(map[string]string{"id": id, "type": typ, "sandboxId": sandbox})
	return store.Event{ID: id, ProjectID: project, SandboxID: sandbox, Type: typ, At: at, Data: data}
}

func ids(evs []store.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.ID
	}
	return out
}

// testEvents: the log keeps events in the order appended, per project;
// filters; resume after a seq; a retried append adds nothing; another
// handle reads what one wrote; pruning by age.
func testEvents(t *testing.T, ctx context.Context, open func() store.Store) {
	_, st := eventsOf(t, open)
	_, other := eventsOf(t, open)
	if n, err := st.LastEventSeq(ctx); err != nil || n != 0 {
		t.Fatalf("LastEventSeq of an empty log: %d %v", n, err)
	}
	if l, err := st.Events(ctx, store.EventQuery{ProjectID: "prj_a"}); err != nil || l == nil || len(l) != 0 {
		t.Fatalf("Events of an empty log: %v %v, want []", l, err)
	}
	old := ts(0)
	a := []store.Event{
		event("prj_a", "sb1", "sandbox.created", old),
		event("prj_a", "sb1", "sandbox.paused", ts(10)),
		event("prj_b", "sb9", "sandbox.created", ts(11)),
		event("prj_a", "sb2", "sandbox.created", ts(12)),
		event("prj_a", "sb1", "sandbox.resumed", ts(13)),
	}
	if err := st.AppendEvents(ctx, a[:3]); err != nil {
		t.Fatal(err)
	}
	if err := other.AppendEvents(ctx, a[3:]); err != nil {
		t.Fatal(err)
	}
	// A retry of the first append (its outcome unknown) adds nothing.
	if err := st.AppendEvents(ctx, a[:2]); err != nil {
		t.Fatalf("a retried append: %v", err)
	}
	all, err := other.Events(ctx, store.EventQuery{ProjectID: "prj_a"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{a[0].ID, a[1].ID, a[3].ID, a[4].ID}
	if got := ids(all); !slices.Equal(got, want) {
		t.Fatalf("events of prj_a: %v, want %v (in order, once, none of prj_b)", got, want)
	}
	for i := 1; i < len(all); i++ {
		if all[i].Seq <= all[i-1].Seq {
			t.Fatalf("seqs not increasing: %+v", all)
		}
	}
	if e := all[0]; e.ProjectID != "prj_a" || e.SandboxID != "sb1" || e.Type != "sandbox.created" || !e.At.Equal(old) || !sameJSON(e.Data, a[0].Data) {
		t.Fatalf("first event read back: %+v, want %+v", e, a[0])
	}
	if last, err := st.LastEventSeq(ctx); err != nil || last != all[3].Seq {
		t.Fatalf("LastEventSeq: %d %v, want %d", last, err, all[3].Seq)
	}
	seq, err := st.EventSeq(ctx, "prj_a", a[1].ID)
	if err != nil || seq != all[1].Seq {
		t.Fatalf("EventSeq: %d %v, want %d", seq, err, all[1].Seq)
	}
	if _, err := st.EventSeq(ctx, "prj_b", a[1].ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("EventSeq of another project's event: %v, want ErrNotFound", err)
	}
	if _, err := st.EventSeq(ctx, "prj_a", "evt_nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("EventSeq of an unknown id: %v, want ErrNotFound", err)
	}
	for _, tc := range []struct {
		name string
		q    store.EventQuery
		want []string
	}{
		{"after", store.EventQuery{ProjectID: "prj_a", After: seq}, []string{a[3].ID, a[4].ID}},
		{"sandbox", store.EventQuery{ProjectID: "prj_a", SandboxID: "sb1"}, []string{a[0].ID, a[1].ID, a[4].ID}},
		{"types", store.EventQuery{ProjectID: "prj_a", Types: []string{"sandbox.paused", "sandbox.resumed"}}, []string{a[1].ID, a[4].ID}},
		{"since", store.EventQuery{ProjectID: "prj_a", Since: ts(12)}, []string{a[3].ID, a[4].ID}},
		{"limit", store.EventQuery{ProjectID: "prj_a", Limit: 2}, []string{a[0].ID, a[1].ID}},
		{"all filters", store.EventQuery{ProjectID: "prj_a", After: all[0].Seq, SandboxID: "sb1", Types: []string{"sandbox.resumed"}}, []string{a[4].ID}},
		{"other project", store.EventQuery{ProjectID: "prj_b"}, []string{a[2].ID}},
	} {
		got, err := st.Events(ctx, tc.q)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !slices.Equal(ids(got), tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, ids(got), tc.want)
		}
	}
	n, err := other.PruneEvents(ctx, ts(11))
	if err != nil || n != 2 {
		t.Fatalf("PruneEvents before ts(11): %d %v, want 2", n, err)
	}
	if got, _ := st.Events(ctx, store.EventQuery{ProjectID: "prj_a"}); !slices.Equal(ids(got), []string{a[3].ID, a[4].ID}) {
		t.Fatalf("after pruning: %v", ids(got))
	}
	if _, err := st.EventSeq(ctx, "prj_a", a[0].ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("EventSeq of a pruned event: %v, want ErrNotFound", err)
	}
	// Seqs are never reused: an append after pruning goes after.
	e := event("prj_a", "sb3", "sandbox.created", ts(20))
	if err := st.AppendEvents(ctx, []store.Event{e}); err != nil {
		t.Fatal(err)
	}
	if got, _ := st.Events(ctx, store.EventQuery{ProjectID: "prj_a", After: all[3].Seq}); !slices.Equal(ids(got), []string{e.ID}) {
		t.Fatalf("after pruning, an append: %v", ids(got))
	}
}

// testEventsFollow: writers on several handles append at once while a
// reader follows the log by seq (as the event stream does); the reader
// sees every event exactly once, none skipped (seq order is commit
// order).
func testEventsFollow(t *testing.T, ctx context.Context, open func() store.Store) {
	const writers, batches, per = 4, 25, 4
	var handles []store.Events
	for range writers + 1 {
		_, h := eventsOf(t, open)
		handles = append(handles, h)
	}
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	done := make(chan struct{})
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range batches {
				var evs []store.Event
				for i := range per {
					evs = append(evs, event("prj_f", fmt.Sprintf("w%d", w), fmt.Sprintf("t%d.%d", b, i), time.Now()))
				}
				if err := handles[w].AppendEvents(ctx, evs); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	go func() { wg.Wait(); close(done) }()
	reader := handles[writers]
	seen := map[string]int{}
	var after int64
	read := func() {
		got, err := reader.Events(ctx, store.EventQuery{ProjectID: "prj_f", After: after})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range got {
			seen[e.ID]++
			after = e.Seq
		}
	}
	for finished := false; !finished; {
		select {
		case <-done:
			finished = true
		default:
		}
		read()
	}
	read()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	all, err := reader.Events(ctx, store.EventQuery{ProjectID: "prj_f", Limit: writers * batches * per})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != writers*batches*per {
		t.Fatalf("%d events in the log, want %d", len(all), writers*batches*per)
	}
	for _, e := range all {
		if seen[e.ID] != 1 {
			t.Fatalf("event %s (seq %d) seen %d times by the follower, want once: an event committed below a seq already read", e.ID, e.Seq, seen[e.ID])
		}
	}
	// Each writer's events are in its own order.
	last := map[string]string{}
	for _, e := range all {
		if prev := last[e.SandboxID]; prev != "" && e.Type < prev && len(e.Type) == len(prev) {
			t.Fatalf("writer %s: %s after %s", e.SandboxID, e.Type, prev)
		}
		last[e.SandboxID] = e.Type
	}
}

// testWebhooks: webhooks per project with a limit; an append makes a
// delivery per webhook that wants the event; claims, attempts, retries,
// lapsed and released claims; the history; pruning; a delete takes the
// deliveries with it.
func testWebhooks(t *testing.T, ctx context.Context, open func() store.Store) {
	plain, st := eventsOf(t, open)
	_, other := eventsOf(t, open)
	p, err := plain.CreateProject(ctx, "hooks", "")
	if err != nil {
		t.Fatal(err)
	}
	q, err := plain.CreateProject(ctx, "other hooks", "")
	if err != nil {
		t.Fatal(err)
	}
	if l, err := st.Webhooks(ctx, p.ID); err != nil || l == nil || len(l) != 0 {
		t.Fatalf("Webhooks of a new project: %v %v, want []", l, err)
	}
	all := store.Webhook{ID: store.NewID("whk_", 16), ProjectID: p.ID, URL: "https://a.example/hook", Secret: "s1"}
	paused := store.Webhook{ID: store.NewID("whk_", 16), ProjectID: p.ID, URL: "https://b.example/hook", Types: []string{"sandbox.paused"}, Secret: "s2"}
	for _, w := range []store.Webhook{all, paused} {
		got, err := st.CreateWebhook(ctx, w, 2)
		if err != nil {
			t.Fatal(err)
		}
		if got.CreatedAt.IsZero() || time.Since(got.CreatedAt) > time.Minute {
			t.Fatalf("CreateWebhook's CreatedAt: %v", got.CreatedAt)
		}
	}
	if _, err := st.CreateWebhook(ctx, store.Webhook{ID: store.NewID("whk_", 16), ProjectID: p.ID, URL: "https://c.example", Secret: "s"}, 2); !errors.Is(err, errdefs.ErrLimit) {
		t.Fatalf("a third webhook over a max of 2: %v, want ErrLimit", err)
	}
	qw := store.Webhook{ID: store.NewID("whk_", 16), ProjectID: q.ID, URL: "https://q.example", Secret: "s3"}
	if _, err := other.CreateWebhook(ctx, qw, 2); err != nil {
		t.Fatalf("another project's webhook: %v", err)
	}
	ws, err := other.Webhooks(ctx, p.ID)
	if err != nil || len(ws) != 2 || ws[0].ID != all.ID || ws[1].ID != paused.ID {
		t.Fatalf("Webhooks: %+v %v", ws, err)
	}
	if ws[0].URL != all.URL || ws[0].Secret != "s1" || len(ws[0].Types) != 0 || !slices.Equal(ws[1].Types, []string{"sandbox.paused"}) {
		t.Fatalf("Webhooks read back: %+v", ws)
	}

	created := event(p.ID, "sb1", "sandbox.created", time.Now())
	pause := event(p.ID, "sb1", "sandbox.paused", time.Now())
	if err := st.AppendEvents(ctx, []store.Event{created, pause, event(q.ID, "sb2", "sandbox.created", time.Now())}); err != nil {
		t.Fatal(err)
	}
	// A retried append makes no second delivery.
	if err := st.AppendEvents(ctx, []store.Event{created}); err != nil {
		t.Fatal(err)
	}
	f := store.Fence{Incarnation: 1}
	got, err := st.ClaimDeliveries(ctx, f, time.Minute, 10)
	if err != nil {
		t.Fatal(err)
	}
	// all: created and paused; paused: paused; q's: created.
	if len(got) != 4 {
		t.Fatalf("claimed %d deliveries, want 4: %+v", len(got), got)
	}
	byHook := map[string][]store.Delivery{}
	for _, d := range got {
		byHook[d.WebhookID] = append(byHook[d.WebhookID], d)
		if d.Claim == "" || d.State != store.DeliveryPending || d.Attempts != 0 {
			t.Fatalf("a claimed delivery: %+v", d)
		}
	}
	if len(byHook[all.ID]) != 2 || len(byHook[paused.ID]) != 1 || len(byHook[qw.ID]) != 1 {
		t.Fatalf("deliveries per webhook: %v", byHook)
	}
	pd := byHook[paused.ID][0]
	if pd.EventID != pause.ID || pd.EventType != "sandbox.paused" || pd.URL != paused.URL || pd.Secret != "s2" || pd.ProjectID != p.ID ||
		!sameJSON(pd.Body, pause.Data) {
		t.Fatalf("the paused webhook's delivery: %+v", pd)
	}
	if again, err := other.ClaimDeliveries(ctx, f, time.Minute, 10); err != nil || len(again) != 0 {
		t.Fatalf("a second claim while the first holds: %v %v, want none", again, err)
	}
	// A failed attempt: pending, due again at once.
	fail := store.AttemptResult{Attempt: store.Attempt{At: time.Now(), StatusCode: 500, Error: "HTTP 500", Duration: 12 * time.Millisecond},
		State: store.DeliveryPending}
	if err := st.RecordAttempt(ctx, f, pd.ID, pd.Claim, fail); err != nil {
		t.Fatal(err)
	}
	if err := st.RecordAttempt(ctx, f, pd.ID, pd.Claim, fail); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("an attempt under a claim already ended: %v, want ErrConflict", err)
	}
	re, err := other.ClaimDeliveries(ctx, f, time.Minute, 10)
	if err != nil || len(re) != 1 || re[0].ID != pd.ID || re[0].Attempts != 1 || re[0].Claim == pd.Claim {
		t.Fatalf("the failed delivery claimed again: %+v %v", re, err)
	}
	ok := store.AttemptResult{Attempt: store.Attempt{At: time.Now(), StatusCode: 204, Duration: time.Millisecond}, State: store.DeliveryDelivered}
	if err := other.RecordAttempt(ctx, f, pd.ID, re[0].Claim, ok); err != nil {
		t.Fatal(err)
	}
	// A failure far from due: not claimed.
	ad := byHook[all.ID][0]
	later := fail
	later.RetryIn = time.Hour
	if err := st.RecordAttempt(ctx, f, ad.ID, ad.Claim, later); err != nil {
		t.Fatal(err)
	}
	if none, err := st.ClaimDeliveries(ctx, f, time.Minute, 10); err != nil || len(none) != 0 {
		t.Fatalf("claims with nothing due: %+v %v", none, err)
	}
	// A restart of the node (a new incarnation) releases what the last
	// one held.
	if err := st.ReleaseClaims(ctx, store.Fence{Incarnation: 2}); err != nil {
		t.Fatal(err)
	}
	rel, err := st.ClaimDeliveries(ctx, store.Fence{Incarnation: 2}, 10*time.Millisecond, 10)
	if err != nil || len(rel) != 2 {
		t.Fatalf("after ReleaseClaims: claimed %+v %v, want the 2 still held by incarnation 1", rel, err)
	}
	// A claim that lapses is taken by the next claimer; the first can no
	// longer record.
	time.Sleep(50 * time.Millisecond)
	taken, err := other.ClaimDeliveries(ctx, store.Fence{Incarnation: 3}, time.Minute, 10)
	if err != nil || len(taken) != 2 {
		t.Fatalf("claims that lapsed: %+v %v, want 2 taken", taken, err)
	}
	if err := st.RecordAttempt(ctx, f, rel[0].ID, rel[0].Claim, ok); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("an attempt under a lapsed claim someone took: %v, want ErrConflict", err)
	}
	for _, d := range taken {
		if err := other.RecordAttempt(ctx, store.Fence{Incarnation: 3}, d.ID, d.Claim, store.AttemptResult{Attempt: ok.Attempt, State: store.DeliveryFailed}); err != nil {
			t.Fatal(err)
		}
	}

	hist, err := st.Deliveries(ctx, p.ID, paused.ID, 10)
	if err != nil || len(hist) != 1 {
		t.Fatalf("Deliveries of the paused webhook: %+v %v", hist, err)
	}
	h := hist[0]
	if h.State != store.DeliveryDelivered || h.Attempts != 2 || len(h.History) != 2 || h.Secret != "" || h.Claim != "" {
		t.Fatalf("a delivered delivery's record: %+v", h)
	}
	if a := h.History; a[0].N != 1 || a[0].StatusCode != 500 || a[0].Error != "HTTP 500" || a[0].Duration != 12*time.Millisecond ||
		a[1].N != 2 || a[1].StatusCode != 204 || a[1].Error != "" {
		t.Fatalf("its attempts: %+v", a)
	}
	if _, err := st.Deliveries(ctx, q.ID, paused.ID, 10); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Deliveries of another project's webhook: %v, want ErrNotFound", err)
	}
	if l, err := st.Deliveries(ctx, p.ID, all.ID, 1); err != nil || len(l) != 1 {
		t.Fatalf("Deliveries with limit 1: %d %v", len(l), err)
	}

	// Pruning takes ended deliveries only.
	n, err := st.PruneDeliveries(ctx, time.Now().Add(time.Minute))
	if err != nil || n != 3 {
		t.Fatalf("PruneDeliveries: %d %v, want 3 (delivered or failed)", n, err)
	}
	if l, _ := st.Deliveries(ctx, p.ID, all.ID, 10); len(l) != 1 || l[0].State != store.DeliveryPending {
		t.Fatalf("after pruning, the all webhook's deliveries: %+v", l)
	}

	if err := st.DeleteWebhook(ctx, q.ID, all.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("delete of a webhook by another project: %v, want ErrNotFound", err)
	}
	if err := other.DeleteWebhook(ctx, p.ID, all.ID); err != nil {
		t.Fatal(err)
	}
	if err := other.DeleteWebhook(ctx, p.ID, all.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("a second delete: %v, want ErrNotFound", err)
	}
	if _, err := st.Deliveries(ctx, p.ID, all.ID, 10); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Deliveries of a deleted webhook: %v, want ErrNotFound", err)
	}
	if ws, _ := st.Webhooks(ctx, p.ID); len(ws) != 1 || ws[0].ID != paused.ID {
		t.Fatalf("webhooks after a delete: %+v", ws)
	}
	// An event after the delete makes no delivery for it.
	if err := st.AppendEvents(ctx, []store.Event{event(p.ID, "sb1", "sandbox.killed", time.Now())}); err != nil {
		t.Fatal(err)
	}
	if l, err := st.ClaimDeliveries(ctx, f, time.Minute, 10); err != nil || len(l) != 0 {
		t.Fatalf("deliveries of a killed event (no webhook wants it): %+v %v", l, err)
	}
}

// testDeliveryFence: in a cluster, claims and attempts are fenced by the
// node's incarnation, and nodes claiming at once share the due deliveries
// without overlap.
func testDeliveryFence(t *testing.T, ctx context.Context, open func() store.Cluster, p store.Project) {
	c := open()
	st, isEvents := c.(store.Events)
	if !isEvents {
		t.Fatalf("%T does not implement store.Events", c)
	}
	old, err := c.RegisterNode(ctx, nodeInfo("a"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	fa, err := c.RegisterNode(ctx, nodeInfo("a"), time.Minute) // a restart
	if err != nil {
		t.Fatal(err)
	}
	fb, err := open().RegisterNode(ctx, nodeInfo("b"), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	w := store.Webhook{ID: store.NewID("whk_", 16), ProjectID: p.ID, URL: "https://a.example", Secret: "s"}
	if _, err := st.CreateWebhook(ctx, w, 0); err != nil {
		t.Fatal(err)
	}
	const n = 40
	var evs []store.Event
	for i := range n {
		evs = append(evs, event(p.ID, fmt.Sprintf("sb%d", i), "sandbox.created", time.Now()))
	}
	if err := st.AppendEvents(ctx, evs); err != nil {
		t.Fatal(err)
	}
	if _, err := st.ClaimDeliveries(ctx, old, time.Minute, 10); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("a claim by a node's old incarnation: %v, want ErrFenced", err)
	}
	// Two nodes claim at once, a few at a time, until nothing is left.
	var mu sync.Mutex
	claimed := map[string]string{}
	// first is one delivery and the node that claimed it (either may take
	// them all).
	var first store.Delivery
	var firstBy store.Fence
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for _, f := range []store.Fence{fa, fb} {
		h := open().(store.Events)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				ds, err := h.ClaimDeliveries(ctx, f, time.Minute, 3)
				if err != nil {
					errs <- err
					return
				}
				if len(ds) == 0 {
					return
				}
				mu.Lock()
				for _, d := range ds {
					if by, dup := claimed[d.ID]; dup {
						errs <- fmt.Errorf("delivery %s claimed by %s and %s", d.ID, by, f.Node)
					}
					claimed[d.ID] = f.Node
					if first.ID == "" {
						first, firstBy = d, f
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(claimed) != n {
		t.Fatalf("%d deliveries claimed, want %d", len(claimed), n)
	}
	ok := store.AttemptResult{Attempt: store.Attempt{N: 1, At: time.Now(), StatusCode: 200}, State: store.DeliveryDelivered}
	if err := st.RecordAttempt(ctx, old, first.ID, first.Claim, ok); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("an attempt recorded by a node's old incarnation: %v, want ErrFenced", err)
	}
	if err := st.RecordAttempt(ctx, firstBy, first.ID, first.Claim, ok); err != nil {
		t.Fatal(err)
	}
	// A node declared dead records nothing more.
	time.Sleep(10 * time.Millisecond)
	if _, err := c.(store.Cluster).DeclareDead(ctx, "b", -time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := st.ClaimDeliveries(ctx, fb, time.Minute, 1); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("a claim by a node declared dead: %v, want ErrFenced", err)
	}
}
