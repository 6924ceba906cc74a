package volume

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/store/sqlite"
)

func newManager(t *testing.T) (*Manager, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: loop-mounts ext4 images")
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("mkfs.ext4 is not installed")
	}
	dir := t.TempDir()
	st, pid := testStore(t, dir)
	m, err := New(Config{Dir: filepath.Join(dir, "volumes"), Store: st, MaxSizeGB: 4})
	if err != nil {
		t.Fatal(err)
	}
	return m, pid
}

// testStore opens a SQLite store in dir with a project, whose id it
// returns.
func testStore(t *testing.T, dir string) (*sqlite.Store, string) {
	t.Helper()
	st, err := sqlite.Open(filepath.Join(dir, "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	p, err := st.CreateProject(context.Background(), "p", "")
	if err != nil {
		t.Fatal(err)
	}
	return st, p.ID
}

// TestLifecycle: create, a size that is a hard limit, online resize both
// ways with the 10% rule, one holder, delete.
func TestLifecycle(t *testing.T) {
	m, pid := newManager(t)
	ctx := context.Background()
	for _, bad := range []string{"", "Upper", "-dash", "dash-", "a_b"} {
		if _, err := m.Create(ctx, pid, bad, 1, "", false); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("name %q: %v", bad, err)
		}
	}
	if _, err := m.Create(ctx, pid, "big", 5, "", false); errdefs.Code(err) != "invalid_volume_size" {
		t.Errorf("over the maximum: %v", err)
	}
	v, err := m.Create(ctx, pid, "data", 1, "eu", false)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := m.Create(ctx, pid, "data", 2, "", true); err != nil || again.ID != v.ID || again.SizeGB != 1 {
		t.Fatalf("getOrCreate: %+v %v", again, err)
	}
	if _, err := m.Create(ctx, pid, "data", 1, "", false); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("duplicate: %v", err)
	}
	_, dir, err := m.Attach(ctx, pid, "data", "sb1")
	if err != nil {
		t.Fatal(err)
	}
	defer m.Detach(ctx, "sb1")
	if _, _, err := m.Attach(ctx, pid, v.ID, "sb2"); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("second holder: %v", err)
	}
	if err := m.Delete(ctx, pid, "data"); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("delete attached: %v", err)
	}
	write := func(name string, mb int) error {
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		defer f.Close()
		chunk := make([]byte, 1<<20)
		for range mb {
			if _, err := f.Write(chunk); err != nil {
				return err
			}
		}
		return f.Sync()
	}
	if err := write("fill", 1100); err == nil {
		t.Fatal("1100 MiB fit in a 1 GB volume")
	}
	if _, err := m.Resize(ctx, pid, "data", 2); err != nil {
		t.Fatalf("grow while attached: %v", err)
	}
	if err := write("more", 500); err != nil {
		t.Fatalf("after growing: %v", err)
	}
	if _, err := m.Resize(ctx, pid, "data", 1); errdefs.Code(err) != "volume_too_full_to_shrink" {
		t.Fatalf("shrink below the data: %v", err)
	}
	os.Remove(filepath.Join(dir, "fill"))
	if _, err := m.Resize(ctx, pid, "data", 1); err != nil {
		t.Fatalf("shrink with room: %v", err)
	}
	if err := m.Detach(ctx, "sb1"); err != nil {
		t.Fatal(err)
	}
	if mounted(m.mountDir(v.ID)) {
		t.Fatal("detach left the volume mounted")
	}
	if err := m.Delete(ctx, pid, "data"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Get(ctx, pid, "data"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
}

// TestProjectQuota: the sizes of a project's volumes add up to at most its
// limit, on create and on resize; other projects do not count.
func TestProjectQuota(t *testing.T) {
	m, pid := newManager(t)
	ctx := context.Background()
	m.cfg.MaxProjectGB = func(_ context.Context, projectID string) (int, error) {
		if projectID == pid {
			return 5, nil
		}
		return 0, nil
	}
	a, err := m.Create(ctx, pid, "a", 3, "", false)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Delete(ctx, pid, "a")
	_, err = m.Create(ctx, pid, "b", 3, "", false)
	if !errors.Is(err, errdefs.ErrQuota) || errdefs.Code(err) != "quota_exceeded" || err.Error() != "project quota: volume-gb 3 of 5 in use, this needs 3: quota exceeded" {
		t.Fatalf("over quota: %v", err)
	}
	if _, err := m.Get(ctx, pid, "b"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("a refused volume exists: %v", err)
	}
	if _, err := m.Resize(ctx, pid, a.ID, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Create(ctx, pid, "b", 3, "", false); err != nil {
		t.Fatalf("after shrinking: %v", err)
	}
	defer m.Delete(ctx, pid, "b")
	if _, err := m.Resize(ctx, pid, a.ID, 3); !errors.Is(err, errdefs.ErrQuota) {
		t.Fatalf("growing over quota: %v", err)
	}
	other, err := m.cfg.Store.CreateProject(ctx, "other", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Create(ctx, other.ID, "c", 4, "", false); err != nil {
		t.Fatalf("another project: %v", err)
	}
	m.Delete(ctx, other.ID, "c")

	// In a cluster the project's volumes on other nodes count too: 2 GB
	// here (a) and 3 GB on another node leave no room for 1 more.
	if err := m.Delete(ctx, pid, "b"); err != nil {
		t.Fatal(err)
	}
	spec, _ := json.Marshal(Volume{ID: "vol-elsewhere", ProjectID: pid, Name: "elsewhere", SizeGB: 3})
	m.cfg.Everywhere = func(ctx context.Context) ([]store.Volume, error) {
		recs, err := m.cfg.Store.Volumes(ctx)
		return append(recs, store.Volume{ID: "vol-elsewhere", ProjectID: pid, Node: "other-node", Name: "elsewhere", Spec: spec}), err
	}
	if _, err := m.Create(ctx, pid, "d", 1, "", false); !errors.Is(err, errdefs.ErrQuota) || !strings.Contains(err.Error(), "volume-gb 5 of 5 in use, this needs 1") {
		t.Fatalf("with 1 GB on another node: %v", err)
	}
}
