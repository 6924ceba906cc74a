package store

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// openTemp opens a new database in a temporary directory.
func openTemp(t *testing.T) *Store {
	t.Helper()
	st, err := Open(filepath.Join(t.TempDir(), "lizard.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func TestStore(t *testing.T) {
	ctx := context.Background()
	st := openTemp(t)
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

func TestLimits(t *testing.T) {
	ctx := context.Background()
	st := openTemp(t)
	p, err := st.CreateProject(ctx, "limited", "")
	if err != nil {
		t.Fatal(err)
	}
	defaults := Limits{Sandboxes: 50, VCPUs: 64, MemoryGB: 128, VolumeGB: 500, Snapshots: 100}
	if got, err := st.ProjectLimits(ctx, p.ID, defaults); err != nil || got != defaults {
		t.Fatalf("no overrides: %+v %v", got, err)
	}
	five, zero := 5, 0
	if err := st.SetProjectLimit(ctx, p.ID, LimitSandboxes, &five); err != nil {
		t.Fatal(err)
	}
	if err := st.SetProjectLimit(ctx, p.ID, LimitSnapshots, &zero); err != nil {
		t.Fatal(err)
	}
	want := defaults
	want.Sandboxes, want.Snapshots = 5, 0
	if got, err := st.ProjectLimits(ctx, p.ID, defaults); err != nil || got != want {
		t.Fatalf("overrides: %+v %v, want %+v", got, err, want)
	}
	if err := st.SetProjectLimit(ctx, p.ID, LimitSandboxes, nil); err != nil {
		t.Fatal(err)
	}
	want.Sandboxes = 50
	if got, _ := st.ProjectLimits(ctx, p.ID, defaults); got != want {
		t.Fatalf("back to default: %+v, want %+v", got, want)
	}
	minus := -1
	if err := st.SetProjectLimit(ctx, p.ID, LimitVCPUs, &minus); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("negative: %v", err)
	}
	if err := st.SetProjectLimit(ctx, p.ID, Limit("cores"), &five); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("unknown limit: %v", err)
	}
	if _, ok, err := st.DefaultLimits(ctx); ok || err != nil {
		t.Fatalf("defaults before any server: %v %v", ok, err)
	}
	if err := st.SetDefaultLimits(ctx, defaults); err != nil {
		t.Fatal(err)
	}
	if got, ok, err := st.DefaultLimits(ctx); !ok || err != nil || got != defaults {
		t.Fatalf("defaults: %+v %v %v", got, ok, err)
	}
	err = LimitVCPUs.Exceeded(8, 8, 2)
	if !errors.Is(err, errdefs.ErrQuota) || errdefs.Code(err) != "quota_exceeded" || !strings.Contains(err.Error(), "project quota: vcpus 8 of 8 in use, this needs 2") {
		t.Fatalf("exceeded: %v", err)
	}
}
