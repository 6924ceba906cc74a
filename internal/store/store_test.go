package store

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
)

func TestStore(t *testing.T) {
	ctx := context.Background()
	st, err := Open(filepath.Join(t.TempDir(), "lizard.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	p, err := st.CreateProject(ctx, "My Team", "")
	if err != nil || p.Slug != "my-team" {
		t.Fatalf("create project: %+v %v", p, err)
	}
	if _, err := st.CreateProject(ctx, "my team", ""); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("duplicate slug: %v", err)
	}
	if _, err := st.CreateProject(ctx, "!!!", ""); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("empty slug: %v", err)
	}
	key, err := st.CreateKey(ctx, p.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	if ks, err := st.ActiveKeys(ctx); err != nil || len(ks) != 1 || ks[0].Hash != HashKey(key) || ks[0].Project != p {
		t.Fatalf("active keys: %+v %v", ks, err)
	}
	if _, err := st.CreateKey(ctx, p.ID, "short"); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("short key: %v", err)
	}
	if got, err := st.ProjectByRef(ctx, "my-team"); err != nil || got.ID != p.ID {
		t.Fatalf("by slug: %v", err)
	}

	end := time.Now().Add(time.Hour)
	sb := Sandbox{ID: "s1", ProjectID: p.ID, Template: "base", Size: "small", Status: "running", Spec: []byte(`{"a":1}`), StartedAt: time.Now(), EndAt: &end}
	if err := st.PutSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	sb.Status = "paused"
	sb.EndAt = nil
	if err := st.PutSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	all, err := st.Sandboxes(ctx)
	if err != nil || len(all) != 1 || all[0].Status != "paused" || all[0].EndAt != nil || string(all[0].Spec) != `{"a":1}` {
		t.Fatalf("sandboxes: %+v %v", all, err)
	}
	if err := st.DeleteSandbox(ctx, "s1"); err != nil {
		t.Fatal(err)
	}

	v := Volume{ID: "v1", ProjectID: p.ID, Name: "data", Spec: []byte(`{}`), CreatedAt: time.Now()}
	if err := st.InsertVolume(ctx, v); err != nil {
		t.Fatal(err)
	}
	v.ID = "v2"
	if err := st.InsertVolume(ctx, v); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("duplicate volume name: %v", err)
	}
	if err := st.PutSnapshot(ctx, Snapshot{ID: "snap", ProjectID: p.ID, Spec: []byte(`{}`), CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if sn, err := st.Snapshots(ctx); err != nil || len(sn) != 1 {
		t.Fatalf("snapshots: %v %v", sn, err)
	}
}

func TestNewID(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		id := NewID("", 20)
		if len(id) != 20 || id[0] < 'a' || id[0] > 'z' || seen[id] {
			t.Fatalf("bad or repeated id %q", id)
		}
		seen[id] = true
	}
}
