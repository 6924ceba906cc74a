// Package storetest is the conformance suite of the store contract: every
// backend's test runs it (store/sqlite, store/postgres), so that they behave
// alike. Only tests import it.
package storetest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
)

// NewDB makes a fresh, empty database for one test and returns a function
// that opens it; the suite may open it more than once at a time (the server
// and the CLI do), and closes what it opens.
type NewDB func(t *testing.T) (open func() (store.Store, error))

// Run runs the suite against a backend.
func Run(t *testing.T, newDB NewDB) {
	for _, tc := range []struct {
		name string
		f    func(*testing.T, context.Context, func() store.Store)
	}{
		{"Projects", testProjects},
		{"Keys", testKeys},
		{"NewKey", testNewKey},
		{"KeysAcrossHandles", testKeysAcrossHandles},
		{"TouchKeys", testTouchKeys},
		{"Sandboxes", testSandboxes},
		{"Snapshots", testSnapshots},
		{"Volumes", testVolumes},
		{"Limits", testLimits},
		{"Concurrent", testConcurrent},
		{"Reopen", testReopen},
		{"TemplateVersions", testTemplateVersions},
		{"Secrets", testSecrets},
		{"Identity", testIdentity},
		{"Schedules", testSchedules},
		{"Events", testEvents},
		{"EventsFollow", testEventsFollow},
		{"Webhooks", testWebhooks},
		{"TemplateTags", testTemplateTags},
		{"TemplatePools", testTemplatePools},
	} {
		t.Run(tc.name, func(t *testing.T) {
			open := newDB(t)
			tc.f(t, context.Background(), func() store.Store {
				t.Helper()
				st, err := open()
				if err != nil {
					t.Fatalf("open: %v", err)
				}
				t.Cleanup(func() { st.Close() })
				return st
			})
		})
	}
}

// ts is a time the backends keep exactly (PostgreSQL keeps microseconds).
func ts(sec int) time.Time { return time.Date(2026, 5, 1, 12, 0, sec, 123456000, time.UTC) }

// sameJSON compares two documents as values: a backend may keep JSON in a
// normalized form (key order, spaces).
func sameJSON(a, b json.RawMessage) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xs, _ := json.Marshal(x)
	ys, _ := json.Marshal(y)
	return bytes.Equal(xs, ys)
}

func testProjects(t *testing.T, ctx context.Context, open func() store.Store) {
	st := open()
	if ps, err := st.Projects(ctx); err != nil || ps == nil || len(ps) != 0 {
		t.Fatalf("projects of an empty store: %#v %v", ps, err)
	}
	p, err := st.CreateProject(ctx, "My Team", "")
	if err != nil || p.Slug != "my-team" || p.Name != "My Team" || p.ID == "" {
		t.Fatalf("create project: %+v %v", p, err)
	}
	if _, err := st.CreateProject(ctx, "my team", ""); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("duplicate slug: %v, want ErrConflict", err)
	}
	if _, err := st.CreateProject(ctx, "!!!", ""); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("name without letters: %v, want ErrInvalid", err)
	}
	q, err := st.CreateProject(ctx, "Other", "other-slug")
	if err != nil || q.Slug != "other-slug" {
		t.Fatalf("create with slug: %+v %v", q, err)
	}
	for _, ref := range []string{"my-team", p.ID} {
		if got, err := st.ProjectByRef(ctx, ref); err != nil || got != p {
			t.Fatalf("by %q: %+v %v", ref, got, err)
		}
	}
	if _, err := st.ProjectByRef(ctx, "nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("unknown ref: %v, want ErrNotFound", err)
	}
	ps, err := st.Projects(ctx)
	if err != nil || len(ps) != 2 || ps[0] != p || ps[1] != q {
		t.Fatalf("projects: %+v %v, want oldest first", ps, err)
	}
}

func testKeys(t *testing.T, ctx context.Context, open func() store.Store) {
	st := open()
	p, err := st.CreateProject(ctx, "p", "")
	if err != nil {
		t.Fatal(err)
	}
	if ks, err := st.Keys(ctx, p.ID); err != nil || ks == nil || len(ks) != 0 {
		t.Fatalf("keys of a new project: %#v %v", ks, err)
	}
	if ks, err := st.ActiveKeys(ctx); err != nil || ks == nil || len(ks) != 0 {
		t.Fatalf("active keys of an empty store: %#v %v", ks, err)
	}
	g0, err := st.KeyGeneration(ctx)
	if err != nil {
		t.Fatal(err)
	}
	secret, err := st.CreateKey(ctx, p.ID, "")
	if err != nil || len(secret) < 16 {
		t.Fatalf("create key: %q %v", secret, err)
	}
	g1, err := st.KeyGeneration(ctx)
	if err != nil || g1 == g0 {
		t.Fatalf("create did not change the generation (%d → %d, %v)", g0, g1, err)
	}
	active, err := st.ActiveKeys(ctx)
	if err != nil || len(active) != 1 || active[0].Hash != store.HashKey(secret) || active[0].Project != p {
		t.Fatalf("active keys: %+v %v", active, err)
	}
	if _, err := st.CreateKey(ctx, p.ID, "short"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("short key: %v, want ErrInvalid", err)
	}
	if _, err := st.CreateKey(ctx, p.ID, secret); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("same secret again: %v, want ErrConflict", err)
	}
	if g, _ := st.KeyGeneration(ctx); g != g1 {
		t.Fatalf("refused creates changed the generation (%d → %d)", g1, g)
	}
	short, err := st.CreateKey(ctx, p.ID, "0123456789abcdef")
	if err != nil || short != "0123456789abcdef" {
		t.Fatalf("given secret: %q %v", short, err)
	}
	ks, err := st.Keys(ctx, p.ID)
	if err != nil || len(ks) != 2 {
		t.Fatalf("keys: %+v %v", ks, err)
	}
	k := ks[0]
	if k.Prefix != secret[:10] || k.ProjectID != p.ID || k.LastUsed != nil || k.RevokedAt != nil || k.CreatedAt.IsZero() {
		t.Fatalf("key %+v of %q", k, secret)
	}
	if ks[1].Prefix != short[:5] {
		t.Fatalf("prefix of a 16-character key: %q", ks[1].Prefix)
	}

	gBefore, _ := st.KeyGeneration(ctx)
	if err := st.RevokeKey(ctx, k.ID); err != nil {
		t.Fatal(err)
	}
	gAfter, _ := st.KeyGeneration(ctx)
	if gAfter == gBefore {
		t.Fatal("revoke did not change the generation")
	}
	if err := st.RevokeKey(ctx, k.ID); err != nil {
		t.Fatalf("revoke twice: %v", err)
	}
	if err := st.RevokeKey(ctx, "key_nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("unknown id: %v, want ErrNotFound", err)
	}
	ks, _ = st.Keys(ctx, p.ID)
	if ks[0].RevokedAt == nil || ks[1].RevokedAt != nil {
		t.Fatalf("revoked: %+v", ks)
	}
	active, err = st.ActiveKeys(ctx)
	if err != nil || len(active) != 1 || active[0].ID != ks[1].ID {
		t.Fatalf("active after revoke: %+v %v", active, err)
	}
}

// testNewKey: the key NewKey returns is the one Keys lists.
func testNewKey(t *testing.T, ctx context.Context, open func() store.Store) {
	st := open()
	p, err := st.CreateProject(ctx, "p", "")
	if err != nil {
		t.Fatal(err)
	}
	made, third, err := st.NewKey(ctx, p.ID, "")
	if err != nil || made.ID == "" || made.ProjectID != p.ID || made.Prefix != third[:10] || made.CreatedAt.IsZero() {
		t.Fatalf("NewKey: %+v %q %v", made, third, err)
	}
	if ks, _ := st.Keys(ctx, p.ID); len(ks) != 1 || ks[0].ID != made.ID || !ks[0].CreatedAt.Equal(made.CreatedAt) || ks[0].Prefix != made.Prefix {
		t.Fatalf("NewKey returned %+v, Keys lists %+v", made, ks)
	}
	if _, _, err := st.NewKey(ctx, p.ID, third); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("NewKey with a taken secret: %v, want ErrConflict", err)
	}
}

// testKeysAcrossHandles: a key made through one handle (the CLI) is seen
// through another (the server) by its generation.
func testKeysAcrossHandles(t *testing.T, ctx context.Context, open func() store.Store) {
	server, cli := open(), open()
	g0, err := server.KeyGeneration(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p, err := cli.CreateProject(ctx, "p", "")
	if err != nil {
		t.Fatal(err)
	}
	secret, err := cli.CreateKey(ctx, p.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	if g, err := server.KeyGeneration(ctx); err != nil || g == g0 {
		t.Fatalf("generation seen by the other handle: %d → %d %v", g0, g, err)
	}
	active, err := server.ActiveKeys(ctx)
	if err != nil || len(active) != 1 || active[0].Hash != store.HashKey(secret) {
		t.Fatalf("active keys through the other handle: %+v %v", active, err)
	}
}

func testTouchKeys(t *testing.T, ctx context.Context, open func() store.Store) {
	st := open()
	p, err := st.CreateProject(ctx, "p", "")
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := st.CreateKey(ctx, p.ID, ""); err != nil {
			t.Fatal(err)
		}
	}
	ks, _ := st.Keys(ctx, p.ID)
	if err := st.TouchKeys(ctx, nil); err != nil {
		t.Fatalf("touch nothing: %v", err)
	}
	used := ts(1)
	if err := st.TouchKeys(ctx, map[string]time.Time{ks[0].ID: used, ks[1].ID: ts(2), "key_gone": used}); err != nil {
		t.Fatal(err)
	}
	ks, _ = st.Keys(ctx, p.ID)
	if ks[0].LastUsed == nil || !ks[0].LastUsed.Equal(used) || ks[1].LastUsed == nil || !ks[1].LastUsed.Equal(ts(2)) {
		t.Fatalf("last used %v %v, want %v %v", ks[0].LastUsed, ks[1].LastUsed, used, ts(2))
	}
}

func testSandboxes(t *testing.T, ctx context.Context, open func() store.Store) {
	st := open()
	p, err := st.CreateProject(ctx, "p", "")
	if err != nil {
		t.Fatal(err)
	}
	if all, err := st.Sandboxes(ctx); err != nil || all == nil || len(all) != 0 {
		t.Fatalf("sandboxes of an empty store: %#v %v", all, err)
	}
	end := ts(3600)
	sb := store.Sandbox{ID: "s1", ProjectID: p.ID, Template: "base", Size: "small", Status: "creating",
		Spec: json.RawMessage(`{"a":1,"b":["x"]}`), StartedAt: ts(0), EndAt: &end}
	if err := st.PutSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	all, err := st.Sandboxes(ctx)
	if err != nil || len(all) != 1 {
		t.Fatalf("sandboxes: %+v %v", all, err)
	}
	got := all[0]
	if got.ID != "s1" || got.ProjectID != p.ID || got.Template != "base" || got.Size != "small" || got.Status != "creating" ||
		!sameJSON(got.Spec, sb.Spec) || !got.StartedAt.Equal(ts(0)) || got.EndAt == nil || !got.EndAt.Equal(end) || got.PauseError != "" {
		t.Fatalf("sandbox read back: %+v", got)
	}

	// A second put updates status, spec, deadline and pause error only.
	sb.Status, sb.EndAt, sb.PauseError, sb.Spec = "paused", nil, "disk full", json.RawMessage(`{"a":2}`)
	sb.Template, sb.StartedAt = "other", ts(9)
	if err := st.PutSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	all, _ = st.Sandboxes(ctx)
	if len(all) != 1 || all[0].Status != "paused" || all[0].EndAt != nil || all[0].PauseError != "disk full" ||
		!sameJSON(all[0].Spec, json.RawMessage(`{"a":2}`)) || all[0].Template != "base" || !all[0].StartedAt.Equal(ts(0)) {
		t.Fatalf("sandbox after update: %+v", all)
	}
	if err := st.PutSandbox(ctx, store.Sandbox{ID: "s2", ProjectID: "prj_none", Template: "base", Size: "small", Status: "running", Spec: json.RawMessage(`{}`), StartedAt: ts(0)}); err == nil {
		t.Fatal("sandbox of an unknown project: no error")
	}
	if err := st.DeleteSandbox(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteSandbox(ctx, "s1"); err != nil {
		t.Fatalf("delete a missing record: %v", err)
	}
	if all, _ := st.Sandboxes(ctx); len(all) != 0 {
		t.Fatalf("after delete: %+v", all)
	}
}

func testSnapshots(t *testing.T, ctx context.Context, open func() store.Store) {
	st := open()
	p, err := st.CreateProject(ctx, "p", "")
	if err != nil {
		t.Fatal(err)
	}
	if sn, err := st.Snapshots(ctx); err != nil || sn == nil || len(sn) != 0 {
		t.Fatalf("snapshots of an empty store: %#v %v", sn, err)
	}
	// Put out of order: the list is oldest first.
	for i, id := range []string{"snap_b", "snap_a"} {
		if err := st.PutSnapshot(ctx, store.Snapshot{ID: id, ProjectID: p.ID, Spec: json.RawMessage(`{"n":0}`), CreatedAt: ts(10 - i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.PutSnapshot(ctx, store.Snapshot{ID: "snap_b", ProjectID: p.ID, Spec: json.RawMessage(`{"n":1}`), CreatedAt: ts(99)}); err != nil {
		t.Fatal(err)
	}
	sn, err := st.Snapshots(ctx)
	if err != nil || len(sn) != 2 || sn[0].ID != "snap_a" || sn[1].ID != "snap_b" || !sn[1].CreatedAt.Equal(ts(10)) ||
		!sameJSON(sn[1].Spec, json.RawMessage(`{"n":1}`)) || sn[0].ProjectID != p.ID {
		t.Fatalf("snapshots: %+v %v", sn, err)
	}
	if err := st.DeleteSnapshot(ctx, "snap_a"); err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteSnapshot(ctx, "snap_a"); err != nil {
		t.Fatalf("delete a missing record: %v", err)
	}
	if sn, _ := st.Snapshots(ctx); len(sn) != 1 || sn[0].ID != "snap_b" {
		t.Fatalf("after delete: %+v", sn)
	}
}

func testVolumes(t *testing.T, ctx context.Context, open func() store.Store) {
	st := open()
	p, err := st.CreateProject(ctx, "p", "")
	if err != nil {
		t.Fatal(err)
	}
	q, err := st.CreateProject(ctx, "q", "")
	if err != nil {
		t.Fatal(err)
	}
	if vs, err := st.Volumes(ctx); err != nil || vs == nil || len(vs) != 0 {
		t.Fatalf("volumes of an empty store: %#v %v", vs, err)
	}
	v := store.Volume{ID: "v1", ProjectID: p.ID, Name: "data", Spec: json.RawMessage(`{"sizeGB":1}`), CreatedAt: ts(5)}
	if err := st.InsertVolume(ctx, v); err != nil {
		t.Fatal(err)
	}
	dup := v
	dup.ID = "v2"
	if err := st.InsertVolume(ctx, dup); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("duplicate volume name: %v, want ErrConflict", err)
	}
	other := store.Volume{ID: "v3", ProjectID: q.ID, Name: "data", Spec: json.RawMessage(`{}`), CreatedAt: ts(1)}
	if err := st.InsertVolume(ctx, other); err != nil {
		t.Fatalf("same name in another project: %v", err)
	}
	v.Spec = json.RawMessage(`{"sizeGB":2}`)
	if err := st.UpdateVolume(ctx, v); err != nil {
		t.Fatal(err)
	}
	vs, err := st.Volumes(ctx)
	if err != nil || len(vs) != 2 || vs[0].ID != "v3" || vs[1].ID != "v1" || vs[1].Name != "data" || vs[1].ProjectID != p.ID ||
		!sameJSON(vs[1].Spec, v.Spec) || !vs[1].CreatedAt.Equal(ts(5)) {
		t.Fatalf("volumes: %+v %v", vs, err)
	}
	if err := st.DeleteVolume(ctx, "v1"); err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteVolume(ctx, "v1"); err != nil {
		t.Fatalf("delete a missing record: %v", err)
	}
	if err := st.InsertVolume(ctx, dup); err != nil {
		t.Fatalf("name free again after delete: %v", err)
	}
}

// testConcurrent: writers on two handles at once (the server's goroutines
// and a CLI) all succeed, and each key change bumps the generation.
func testConcurrent(t *testing.T, ctx context.Context, open func() store.Store) {
	a, b := open(), open()
	p, err := a.CreateProject(ctx, "p", "")
	if err != nil {
		t.Fatal(err)
	}
	g0, _ := a.KeyGeneration(ctx)
	const n = 8
	var wg sync.WaitGroup
	errs := make(chan error, 4*n)
	for i := range n {
		for j, st := range []store.Store{a, b} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := st.CreateKey(ctx, p.ID, ""); err != nil {
					errs <- fmt.Errorf("create key: %w", err)
				}
				id := fmt.Sprintf("s%d-%d", i, j)
				if err := st.PutSandbox(ctx, store.Sandbox{ID: id, ProjectID: p.ID, Template: "base", Size: "small", Status: "running", Spec: json.RawMessage(`{}`), StartedAt: ts(i)}); err != nil {
					errs <- fmt.Errorf("put sandbox %s: %w", id, err)
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if ks, err := b.ActiveKeys(ctx); err != nil || len(ks) != 2*n {
		t.Fatalf("%d active keys (%v), want %d", len(ks), err, 2*n)
	}
	if sbs, err := b.Sandboxes(ctx); err != nil || len(sbs) != 2*n {
		t.Fatalf("%d sandboxes (%v), want %d", len(sbs), err, 2*n)
	}
	if g, _ := a.KeyGeneration(ctx); g-g0 != 2*n {
		t.Fatalf("generation moved by %d, want %d", g-g0, 2*n)
	}
}

// testReopen: a closed store fails its calls; opening the database again
// migrates nothing and keeps the data, at the same schema version.
func testReopen(t *testing.T, ctx context.Context, open func() store.Store) {
	st := open()
	v, err := st.SchemaVersion(ctx)
	if err != nil || v < 1 {
		t.Fatalf("schema version %d %v", v, err)
	}
	if err := st.Ping(ctx); err != nil {
		t.Fatalf("ping: %v", err)
	}
	p, err := st.CreateProject(ctx, "p", "")
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	if err := st.Ping(ctx); err == nil {
		t.Fatal("ping of a closed store: no error")
	}
	again := open()
	if v2, err := again.SchemaVersion(ctx); err != nil || v2 != v {
		t.Fatalf("schema version after reopen %d %v, want %d", v2, err, v)
	}
	if got, err := again.ProjectByRef(ctx, p.ID); err != nil || got != p {
		t.Fatalf("project after reopen: %+v %v", got, err)
	}
}

func testLimits(t *testing.T, ctx context.Context, open func() store.Store) {
	st := open()
	p, err := st.CreateProject(ctx, "limited", "")
	if err != nil {
		t.Fatal(err)
	}
	defaults := store.Limits{Sandboxes: 50, VCPUs: 64, MemoryGB: 128, VolumeGB: 500, Snapshots: 100}
	if got, err := store.ProjectLimits(ctx, st, p.ID, defaults); err != nil || got != defaults {
		t.Fatalf("no overrides: %+v %v", got, err)
	}
	if o, err := st.ProjectOverrides(ctx, p.ID); err != nil || o == nil || len(o) != 0 {
		t.Fatalf("overrides of a new project: %#v %v", o, err)
	}
	five, zero := 5, 0
	if err := st.SetProjectLimit(ctx, p.ID, store.LimitSandboxes, &five); err != nil {
		t.Fatal(err)
	}
	if err := st.SetProjectLimit(ctx, p.ID, store.LimitSnapshots, &zero); err != nil {
		t.Fatal(err)
	}
	want := defaults
	want.Sandboxes, want.Snapshots = 5, 0
	if got, err := store.ProjectLimits(ctx, st, p.ID, defaults); err != nil || got != want {
		t.Fatalf("overrides: %+v %v, want %+v", got, err, want)
	}
	if o, err := st.ProjectOverrides(ctx, p.ID); err != nil || len(o) != 2 || o[store.LimitSandboxes] != 5 || o[store.LimitSnapshots] != 0 {
		t.Fatalf("overrides: %v %v", o, err)
	}
	if err := st.SetProjectLimit(ctx, p.ID, store.LimitSandboxes, nil); err != nil {
		t.Fatal(err)
	}
	want.Sandboxes = 50
	if got, _ := store.ProjectLimits(ctx, st, p.ID, defaults); got != want {
		t.Fatalf("back to default: %+v, want %+v", got, want)
	}
	minus := -1
	if err := st.SetProjectLimit(ctx, p.ID, store.LimitVCPUs, &minus); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("negative: %v, want ErrInvalid", err)
	}
	if err := st.SetProjectLimit(ctx, p.ID, store.Limit("cores"), &five); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("unknown limit: %v, want ErrInvalid", err)
	}
	if _, ok, err := st.DefaultLimits(ctx); ok || err != nil {
		t.Fatalf("defaults before any server: %v %v", ok, err)
	}
	for _, d := range []store.Limits{defaults, {Sandboxes: 1}} { // set, then replace
		if err := st.SetDefaultLimits(ctx, d); err != nil {
			t.Fatal(err)
		}
		if got, ok, err := st.DefaultLimits(ctx); !ok || err != nil || got != d {
			t.Fatalf("defaults: %+v %v %v, want %+v", got, ok, err, d)
		}
	}
}
