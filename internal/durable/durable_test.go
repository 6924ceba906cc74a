package durable_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
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

// mib16 is the size of the test's images' large files (many chunks).
const mib16 = 16 << 20

// image writes a directory like a checkpoint image: a file of random bytes
// over many chunks, one mostly zeros, a small manifest.
func image(t *testing.T, rng *rand.Rand) string {
	dir := t.TempDir()
	big := make([]byte, 2*mib16+4321)
	for i := range big {
		big[i] = byte(rng.Uint32())
	}
	zeros := make([]byte, 3*mib16)
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

// seeded is a random source of a seed the test logs.
func seeded(t *testing.T) *rand.Rand {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	return rand.New(rand.NewPCG(uint64(seed), 2))
}

func TestImages(t *testing.T) {
	ctx := context.Background()
	rng := seeded(t)
	gw, st := gateway(t)
	im := durable.New(st, nil)
	src := image(t, rng)

	m, err := im.Upload(ctx, "sandboxes/a", src)
	if err != nil {
		t.Fatal(err)
	}
	stored, size := m.Stored()
	if size != 5*mib16+4321+5+int64(len(`{"runscVersion":"runsc x","cpuFeatures":["sse2"]}`)) || stored >= size {
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

	t.Run("Stream", func(t *testing.T) {
		for _, p := range []string{"pages.img", "sparse.img", "sub/checkpoint.img", "empty"} {
			var got bytes.Buffer
			if err := im.Stream(ctx, "sandboxes/a", p, &got); err != nil {
				t.Fatalf("stream %s: %v", p, err)
			}
			want, _ := os.ReadFile(filepath.Join(src, filepath.FromSlash(p)))
			if !bytes.Equal(got.Bytes(), want) {
				t.Fatalf("stream %s: %d bytes, not the file's %d", p, got.Len(), len(want))
			}
		}
		if err := im.Stream(ctx, "sandboxes/a", "nope", io.Discard); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("stream of a file not in the image: %v", err)
		}
		if err := im.Stream(ctx, "sandboxes/nope", "pages.img", io.Discard); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("stream of a missing image: %v", err)
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
			err = im.Stream(ctx, "sandboxes/a", "pages.img", io.Discard)
			if errdefs.Code(err) != "corrupt_object" || !strings.Contains(err.Error(), key) {
				t.Fatalf("stream of a %s object: %v, want corrupt_object naming %s", c.name, err, key)
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

	t.Run("Version1", func(t *testing.T) {
		// An image uploaded before version 2: a file that is not sparse
		// has the digest of its bytes, checked once it is downloaded.
		m, err := im.Upload(ctx, "sandboxes/v1", src)
		if err != nil {
			t.Fatal(err)
		}
		m.Version = 1
		for i, f := range m.Files {
			if !f.Sparse {
				b, _ := os.ReadFile(filepath.Join(src, filepath.FromSlash(f.Path)))
				sum := sha256.Sum256(b)
				m.Files[i].SHA256 = hex.EncodeToString(sum[:])
			}
		}
		put := func(m durable.Manifest) {
			b, _ := json.Marshal(m)
			if _, err := st.Put(ctx, "images/sandboxes/v1/manifest.json", bytes.NewReader(b)); err != nil {
				t.Fatal(err)
			}
		}
		put(m)
		dst := filepath.Join(t.TempDir(), "img")
		if _, err := im.Materialize(ctx, "sandboxes/v1", dst); err != nil {
			t.Fatalf("materialize of a version 1 image: %v", err)
		}
		sameTree(t, src, dst)
		i := indexOf(m, "pages.img")
		m.Files[i].SHA256 = strings.Repeat("0", 64)
		put(m)
		if _, err := im.Materialize(ctx, "sandboxes/v1", filepath.Join(t.TempDir(), "img")); errdefs.Code(err) != "corrupt_object" {
			t.Fatalf("a version 1 file whose bytes are not its digest: %v, want corrupt_object", err)
		}
		if err := im.Stream(ctx, "sandboxes/v1", "pages.img", io.Discard); errdefs.Code(err) != "corrupt_object" {
			t.Fatalf("stream of a version 1 file whose bytes are not its digest: %v, want corrupt_object", err)
		}
		if err := im.Stream(ctx, "sandboxes/v1", "sparse.img", io.Discard); err != nil {
			t.Fatalf("stream of a version 1 sparse file: %v", err)
		}
		if err := im.Delete(ctx, "sandboxes/v1"); err != nil {
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

// TestShiftedUpload: a sandbox's pause image is retired when it resumes
// (not durable any more, its blobs kept as the base of the next upload);
// the next upload, of an image whose bytes moved (12 KiB inserted near its
// start, as a checkpoint lays the same pages out a few pages apart) and
// changed in one page, stores only the chunks around the two changes,
// materializes to the new bytes and replaces the base; Delete removes
// every blob, and so does Delete of an image only retired.
func TestShiftedUpload(t *testing.T) {
	ctx := context.Background()
	rng := seeded(t)
	_, st := gateway(t)
	im := durable.New(st, nil)
	dir := t.TempDir()
	pages := make([]byte, 4*mib16)
	for i := range pages {
		pages[i] = byte(rng.Uint32())
	}
	write := func(b []byte) {
		if err := os.WriteFile(filepath.Join(dir, "pages.img"), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(pages)
	m, err := im.Upload(ctx, "sandboxes/s", dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range m.Files[0].Chunks {
		if c.Size > durable.MaxChunk || c.Size < durable.MinChunk && c != m.Files[0].Chunks[len(m.Files[0].Chunks)-1] {
			t.Fatalf("chunk of %d bytes, want %d to %d", c.Size, durable.MinChunk, durable.MaxChunk)
		}
	}
	if n := len(m.Files[0].Chunks); n < len(pages)/durable.MaxChunk || n > len(pages)/durable.MinChunk/2 {
		t.Fatalf("%d chunks of %d random bytes; want about %d", n, len(pages), len(pages)/durable.AvgChunk)
	}

	inserted := make([]byte, 12<<10)
	for i := range inserted {
		inserted[i] = byte(rng.Uint32())
	}
	at := 3<<20 + 123
	moved := slices.Concat(pages[:at], inserted, pages[at:])
	for i := 40 << 20; i < 40<<20+4096; i++ {
		moved[i] ^= 0x5a
	}
	write(moved)
	if err := im.Retire(ctx, "sandboxes/s"); err != nil {
		t.Fatal(err)
	}
	if _, err := im.Stat(ctx, "sandboxes/s"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("stat of a retired image: %v", err)
	}
	if _, err := im.Materialize(ctx, "sandboxes/s", filepath.Join(t.TempDir(), "img")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("materialize of a retired image: %v", err)
	}
	if err := im.Retire(ctx, "sandboxes/none"); err != nil {
		t.Fatalf("retire of no image: %v", err)
	}
	before := im.Stats()
	m2, err := im.Upload(ctx, "sandboxes/s", dir)
	if err != nil {
		t.Fatal(err)
	}
	if m.MatchSeed == 0 || m2.MatchSeed != m.MatchSeed {
		t.Fatalf("match seeds %d then %d: want one, kept through the base", m.MatchSeed, m2.MatchSeed)
	}
	// Random bytes do not compress: what is stored is the chunks' size.
	if up := im.Stats().Uploaded - before.Uploaded; up > 4*durable.MaxChunk {
		t.Fatalf("the second upload stored %d bytes of %d; want only the chunks around its two changes", up, len(moved))
	}
	dst := filepath.Join(t.TempDir(), "img")
	if _, err := im.Materialize(ctx, "sandboxes/s", dst); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(dst, "pages.img")); err != nil || !bytes.Equal(got, moved) {
		t.Fatalf("materialized %d bytes (%v), not the second upload's", len(got), err)
	}
	var keys []string
	st.List(ctx, "", func(i objstore.Info) error { keys = append(keys, i.Key); return nil })
	if slices.ContainsFunc(keys, func(k string) bool { return strings.HasPrefix(k, "bases/") }) {
		t.Fatalf("the base stayed after the upload it served: %v", keys)
	}
	if err := im.Delete(ctx, "sandboxes/s"); err != nil {
		t.Fatal(err)
	}
	if got := blobs(t, st); len(got) != 0 {
		t.Fatalf("%d blobs left after Delete", len(got))
	}

	r, err := im.Upload(ctx, "sandboxes/r", dir)
	if err != nil {
		t.Fatal(err)
	}
	if r.MatchSeed == m.MatchSeed || r.Files[0].Chunks[0].Match == m2.Files[0].Chunks[0].Match {
		t.Fatal("two images share their match seed: the matches of one tell the other's bytes")
	}
	if err := im.Retire(ctx, "sandboxes/r"); err != nil {
		t.Fatal(err)
	}
	if err := im.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if len(blobs(t, st)) == 0 {
		t.Fatal("a sweep removed the blobs of a retired image's base")
	}
	if err := im.Delete(ctx, "sandboxes/r"); err != nil {
		t.Fatal(err)
	}
	if got := blobs(t, st); len(got) != 0 {
		t.Fatalf("%d blobs left after Delete of a retired image", len(got))
	}
}
