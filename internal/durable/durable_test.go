package durable_test

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/durable"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/objstore"
	"github.com/lizard-build/lizard/internal/objstore/s3"
	"github.com/lizard-build/lizard/internal/objstore/vgwtest"
)

// gateway starts a versitygw for the test and returns a store on it.
func gateway(t *testing.T) (*vgwtest.Server, objstore.Store) {
	t.Helper()
	gw := vgwtest.New(t)
	cfg, err := s3.ParseURL(gw.URL(""))
	if err != nil {
		t.Fatal(err)
	}
	cfg.AccessKey, cfg.SecretKey = gw.AccessKey, gw.SecretKey
	st, err := s3.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return gw, st
}

// image writes a directory like a checkpoint image: a file of random bytes
// over several chunks, one mostly zeros, a small manifest.
func image(t *testing.T, rng *rand.Rand) string {
	dir := t.TempDir()
	big := make([]byte, 2*durable.ChunkSize+4321)
	for i := range big {
		big[i] = byte(rng.Uint32())
	}
	zeros := make([]byte, 3*durable.ChunkSize)
	zeros[12345] = 7
	for name, b := range map[string][]byte{
		"pages.img":            big,
		"sparse.img":           zeros,
		"sub/checkpoint.img":   []byte("state"),
		"empty":                nil,
		durable.CheckpointFile: []byte(`{"runscVersion":"runsc x","cpuFeatures":["sse2"]}`),
	} {
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o700)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func sameTree(t *testing.T, a, b string) {
	t.Helper()
	filepath.WalkDir(a, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(a, p)
		x, _ := os.ReadFile(p)
		y, err := os.ReadFile(filepath.Join(b, rel))
		if err != nil || !bytes.Equal(x, y) {
			t.Errorf("%s differs (%v)", rel, err)
		}
		return nil
	})
}

func blobs(t *testing.T, st objstore.Store) []objstore.Info {
	var out []objstore.Info
	if err := st.List(context.Background(), "blobs/", func(i objstore.Info) error { out = append(out, i); return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestImages(t *testing.T) {
	ctx := context.Background()
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 2))
	gw, st := gateway(t)
	im := durable.New(st, nil)
	src := image(t, rng)

	m, err := im.Upload(ctx, "sandboxes/a", src)
	if err != nil {
		t.Fatal(err)
	}
	stored, size := m.Stored()
	if size != 5*durable.ChunkSize+4321+5+int64(len(`{"runscVersion":"runsc x","cpuFeatures":["sse2"]}`)) || stored >= size {
		t.Fatalf("stored %d of %d bytes", stored, size)
	}
	if !strings.Contains(string(m.Checkpoint), "runsc x") {
		t.Fatalf("manifest checkpoint = %s", m.Checkpoint)
	}

	t.Run("Materialize", func(t *testing.T) {
		dst := filepath.Join(t.TempDir(), "img")
		if _, err := im.Materialize(ctx, "sandboxes/a", dst); err != nil {
			t.Fatal(err)
		}
		sameTree(t, src, dst)
		sameTree(t, dst, src)
		if _, err := im.Materialize(ctx, "sandboxes/a", dst); !errors.Is(err, errdefs.ErrConflict) {
			t.Fatalf("materialize into an existing dir: %v", err)
		}
		if _, err := im.Materialize(ctx, "sandboxes/nope", filepath.Join(t.TempDir(), "x")); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("materialize of a missing image: %v", err)
		}
	})

	// Each way of spoiling the first chunk of pages.img must be caught,
	// name the object, and leave no directory.
	key := "blobs/sha256/" + m.Files[indexOf(m, "pages.img")].Chunks[0].StoredSHA256
	orig, err := os.ReadFile(gw.Path(key))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		spoil func(b []byte) []byte
	}{
		{"flipped", func(b []byte) []byte { b = bytes.Clone(b); b[len(b)/2] ^= 1; return b }},
		{"truncated", func(b []byte) []byte { return b[:len(b)-100] }},
		{"longer", func(b []byte) []byte { return append(bytes.Clone(b), 1, 2, 3) }},
		{"missing", nil},
	} {
		t.Run("Corrupt/"+c.name, func(t *testing.T) {
			if c.spoil == nil {
				os.Remove(gw.Path(key))
			} else if err := os.WriteFile(gw.Path(key), c.spoil(orig), 0o600); err != nil {
				t.Fatal(err)
			}
			defer os.WriteFile(gw.Path(key), orig, 0o600)
			dst := filepath.Join(t.TempDir(), "img")
			_, err := im.Materialize(ctx, "sandboxes/a", dst)
			if !errors.Is(err, errdefs.ErrConflict) || errdefs.Code(err) != "corrupt_object" || !strings.Contains(err.Error(), key) {
				t.Fatalf("materialize of a %s object: %v (code %q), want corrupt_object naming %s", c.name, err, errdefs.Code(err), key)
			}
			if _, err := os.Stat(dst); !os.IsNotExist(err) {
				t.Fatalf("%s left behind", dst)
			}
			if _, err := os.Stat(dst + ".tmp"); !os.IsNotExist(err) {
				t.Fatalf("%s.tmp left behind", dst)
			}
		})
	}

	t.Run("SharedBlobsAndDelete", func(t *testing.T) {
		n := len(blobs(t, st))
		// The same image again shares every blob.
		if _, err := im.Upload(ctx, "snapshots/b", src); err != nil {
			t.Fatal(err)
		}
		if got := len(blobs(t, st)); got != n {
			t.Fatalf("%d blobs after a second upload of the same image, want %d", got, n)
		}
		if err := im.Delete(ctx, "sandboxes/a"); err != nil {
			t.Fatal(err)
		}
		if got := len(blobs(t, st)); got != n {
			t.Fatalf("deleting one of two images sharing blobs left %d of %d", got, n)
		}
		if _, err := im.Materialize(ctx, "snapshots/b", filepath.Join(t.TempDir(), "img")); err != nil {
			t.Fatal(err)
		}
		if err := im.Delete(ctx, "snapshots/b"); err != nil {
			t.Fatal(err)
		}
		if got := blobs(t, st); len(got) != 0 {
			t.Fatalf("blobs left after deleting every image: %v", got)
		}
		if _, err := im.Stat(ctx, "snapshots/b"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("stat of a deleted image: %v", err)
		}
	})

	t.Run("StoreDown", func(t *testing.T) {
		gw.Stop()
		_, err := im.Upload(ctx, "sandboxes/c", src)
		if !errors.Is(err, errdefs.ErrUnavailable) {
			t.Fatalf("upload with the store down: %v, want ErrUnavailable", err)
		}
		if err := gw.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := im.Stat(ctx, "sandboxes/c"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("a failed upload left a manifest: %v", err)
		}
		if _, err := im.Upload(ctx, "sandboxes/c", src); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("BadNames", func(t *testing.T) {
		for _, n := range []string{"", "/a", "a/", "a/../b", "a b", "."} {
			if _, err := im.Upload(ctx, n, src); !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("upload as %q: %v", n, err)
			}
		}
	})
}

func indexOf(m durable.Manifest, p string) int {
	for i, f := range m.Files {
		if f.Path == p {
			return i
		}
	}
	return -1
}
