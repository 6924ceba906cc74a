package backup

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/store/sqlite"
	"github.com/lizard-build/lizard/internal/volume"
)

// fixture is a data directory with one of everything a backup holds.
type fixture struct {
	dir, key, snapID, volID string
	image                   []byte // the snapshot's checkpoint.img
}

func newFixture(t *testing.T) fixture {
	t.Helper()
	ctx := context.Background()
	f := fixture{dir: t.TempDir(), snapID: "snap_aaaa", volID: "vol_bbbb", image: bytes.Repeat([]byte("checkpoint"), 1000)}
	st, err := sqlite.Open(filepath.Join(f.dir, "lizard.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	p, err := st.CreateProject(ctx, "team", "")
	if err != nil {
		t.Fatal(err)
	}
	if f.key, err = st.CreateKey(ctx, p.ID, ""); err != nil {
		t.Fatal(err)
	}
	if err := st.PutSandbox(ctx, store.Sandbox{ID: "sbx_cccc", ProjectID: p.ID, Template: "base", Size: "small", Status: "running", Spec: json.RawMessage(`{}`), StartedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := st.PutSnapshot(ctx, store.Snapshot{ID: f.snapID, ProjectID: p.ID, Spec: json.RawMessage(`{"id":"snap_aaaa"}`), CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	// A snapshot whose image is gone: the backup leaves it out.
	if err := st.PutSnapshot(ctx, store.Snapshot{ID: "snap_gone", ProjectID: p.ID, Spec: json.RawMessage(`{}`), CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	snapDir := filepath.Join(f.dir, "snapshots", f.snapID)
	if err := os.MkdirAll(filepath.Join(snapDir, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(snapDir, "checkpoint.img"), f.image)
	write(t, filepath.Join(snapDir, "sub", "pages"), []byte("pages"))
	// A stray directory without a record is not backed up.
	write(t, filepath.Join(f.dir, "snapshots", "snap_stray", "checkpoint.img"), []byte("x"))

	v := volume.Volume{ID: f.volID, ProjectID: p.ID, Name: "data", SizeGB: 1, AttachedTo: "sbx_cccc", CreatedAt: time.Now().UTC()}
	spec, _ := json.Marshal(v)
	if err := st.InsertVolume(ctx, store.Volume{ID: v.ID, ProjectID: p.ID, Name: v.Name, Spec: spec, CreatedAt: v.CreatedAt}); err != nil {
		t.Fatal(err)
	}
	// A sparse image: 256 MiB long, data at the start and 128 MiB in.
	img, err := os.Create(filepath.Join(f.dir, "volumes", f.volID+".img"))
	if errors.Is(err, os.ErrNotExist) {
		os.MkdirAll(filepath.Join(f.dir, "volumes"), 0o700)
		img, err = os.Create(filepath.Join(f.dir, "volumes", f.volID+".img"))
	}
	if err != nil {
		t.Fatal(err)
	}
	defer img.Close()
	if err := img.Truncate(256 << 20); err != nil {
		t.Fatal(err)
	}
	img.WriteAt([]byte("superblock"), 0)
	img.WriteAt(bytes.Repeat([]byte{7}, 8192), 128<<20)
	return f
}

func write(t *testing.T, p string, b []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func backupOf(t *testing.T, f fixture) ([]byte, Manifest) {
	t.Helper()
	ctx := context.Background()
	st, err := sqlite.Open(filepath.Join(f.dir, "lizard.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var buf bytes.Buffer
	var warnings []string
	m, err := Create(ctx, Options{DataDir: f.dir, Store: st, Warn: func(s string) { warnings = append(warnings, s) }}, &buf)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(warnings, m.Warnings) || len(warnings) != 2 {
		t.Errorf("warnings %q, manifest %q: want the gone snapshot and the attached volume", warnings, m.Warnings)
	}
	if left, _ := filepath.Glob(filepath.Join(f.dir, ".backup-*")); len(left) > 0 {
		t.Errorf("staging left behind: %v", left)
	}
	return buf.Bytes(), m
}

func TestBackupRestore(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	archive, m := backupOf(t, f)
	if !slices.Equal(m.Snapshots, []string{f.snapID}) || !slices.Equal(m.Volumes, []string{f.volID}) ||
		!slices.Equal(m.Sandboxes, []string{"sbx_cccc"}) || m.Projects != 1 || m.SchemaVersion != sqlite.SchemaVersion() {
		t.Fatalf("manifest %+v", m)
	}
	// The volume's holes are not in the archive.
	if len(archive) > 1<<20 {
		t.Errorf("archive of %d bytes for a sparse 256 MiB image", len(archive))
	}

	dst := filepath.Join(t.TempDir(), "new")
	if _, err := Restore(ctx, bytes.NewReader(archive), dst); err != nil {
		t.Fatal(err)
	}
	st, err := sqlite.Open(filepath.Join(dst, "lizard.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	keys, err := st.ActiveKeys(ctx)
	if err != nil || len(keys) != 1 || keys[0].Hash != store.HashKey(f.key) || keys[0].Project.Slug != "team" {
		t.Errorf("keys after restore: %+v %v", keys, err)
	}
	if sbs, _ := st.Sandboxes(ctx); len(sbs) != 0 {
		t.Errorf("sandbox records restored: %v", sbs)
	}
	snaps, _ := st.Snapshots(ctx)
	if len(snaps) != 1 || snaps[0].ID != f.snapID {
		t.Errorf("snapshots after restore: %+v", snaps)
	}
	vols, _ := st.Volumes(ctx)
	var v volume.Volume
	if len(vols) != 1 || json.Unmarshal(vols[0].Spec, &v) != nil || v.ID != f.volID || v.AttachedTo != "" || v.Name != "data" {
		t.Errorf("volumes after restore: %+v (%+v)", vols, v)
	}
	if got, _ := os.ReadFile(filepath.Join(dst, "snapshots", f.snapID, "checkpoint.img")); !bytes.Equal(got, f.image) {
		t.Error("snapshot image differs")
	}
	if got, _ := os.ReadFile(filepath.Join(dst, "snapshots", f.snapID, "sub", "pages")); string(got) != "pages" {
		t.Errorf("snapshot file %q", got)
	}
	if _, err := os.Stat(filepath.Join(dst, "snapshots", "snap_stray")); err == nil {
		t.Error("a snapshot directory without a record was backed up")
	}
	src, _ := os.ReadFile(filepath.Join(f.dir, "volumes", f.volID+".img"))
	got, _ := os.ReadFile(filepath.Join(dst, "volumes", f.volID+".img"))
	if !bytes.Equal(src, got) {
		t.Error("volume image differs")
	}
	var sst unix.Stat_t
	if err := unix.Stat(filepath.Join(dst, "volumes", f.volID+".img"), &sst); err != nil || sst.Blocks*512 > 1<<20 {
		t.Errorf("restored image not sparse: %d bytes allocated (%v)", sst.Blocks*512, err)
	}

	// Not into a directory that holds anything.
	if _, err := Restore(ctx, bytes.NewReader(archive), dst); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("restore over a data dir: %v, want a conflict", err)
	}
	if _, err := os.Stat(filepath.Join(dst, "lizard.db")); err != nil {
		t.Errorf("a refused restore touched the data dir: %v", err)
	}
}

// rewrite returns archive with its manifest changed by edit and entry
// extra added.
func rewrite(t *testing.T, archive []byte, edit func(*Manifest), extra string) []byte {
	t.Helper()
	zr, err := zstd.NewReader(bytes.NewReader(archive))
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	tr := tar.NewReader(zr)
	var out bytes.Buffer
	zw, _ := zstd.NewWriter(&out)
	tw := tar.NewWriter(zw)
	for {
		hdr, err := tr.Next()
		if err != nil {
			break
		}
		var body bytes.Buffer
		body.ReadFrom(tr)
		if hdr.Name == manifestName {
			var m Manifest
			json.Unmarshal(body.Bytes(), &m)
			edit(&m)
			b, _ := json.Marshal(m)
			body.Reset()
			body.Write(b)
			hdr.Size = int64(len(b))
		}
		tw.WriteHeader(hdr)
		tw.Write(body.Bytes())
		if hdr.Name == manifestName && extra != "" {
			tw.WriteHeader(&tar.Header{Name: extra, Typeflag: tar.TypeReg, Size: 1, Mode: 0o600})
			tw.Write([]byte("x"))
		}
	}
	tw.Close()
	zw.Close()
	return out.Bytes()
}

func TestRestoreRefuses(t *testing.T) {
	ctx := context.Background()
	archive, _ := backupOf(t, newFixture(t))
	for _, tc := range []struct {
		name    string
		archive []byte
		want    error
	}{
		{"newer schema", rewrite(t, archive, func(m *Manifest) { m.SchemaVersion = sqlite.SchemaVersion() + 1 }, ""), store.ErrSchemaNewer},
		{"other format", rewrite(t, archive, func(m *Manifest) { m.Format = Format + 1 }, ""), errdefs.ErrInvalid},
		{"path out of the data dir", rewrite(t, archive, func(*Manifest) {}, "../escape"), errdefs.ErrInvalid},
		{"unknown entry", rewrite(t, archive, func(*Manifest) {}, "etc/passwd"), errdefs.ErrInvalid},
		{"not a backup", []byte("hello"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent := t.TempDir()
			dst := filepath.Join(parent, "new")
			_, err := Restore(ctx, bytes.NewReader(tc.archive), dst)
			if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
			if _, err := os.Stat(dst); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("a failed restore left %s", dst)
			}
			if _, err := os.Stat(filepath.Join(parent, "escape")); err == nil {
				t.Error("an entry escaped the data dir")
			}
		})
	}
}
