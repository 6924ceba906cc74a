package durable_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/lizard-build/lizard/internal/durable"
)

// sparseFile makes a file of size bytes holding data at each offset of
// runs (a run of n bytes of value off%251+1), holes elsewhere.
func sparseFile(t *testing.T, size int64, runs map[int64]int) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "sparse.img")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	for off, n := range runs {
		if _, err := f.WriteAt(bytes.Repeat([]byte{byte(off%251 + 1)}, n), off); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

func extentsOf(t *testing.T, p string) []durable.Extent {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	exts, err := durable.DataExtents(f, st.Size())
	if err != nil {
		t.Fatal(err)
	}
	return exts
}

// TestDataExtents: data runs and holes of sparse files (block-aligned, so
// every filesystem reports them exactly), one ending in a hole, one in
// data, one all hole, one all data.
func TestDataExtents(t *testing.T) {
	const k = 64 << 10
	for _, c := range []struct {
		name string
		size int64
		runs map[int64]int
		want []durable.Extent
	}{
		{"EndsInHole", 64 * k, map[int64]int{0: k, 8 * k: 2 * k, 20 * k: k}, []durable.Extent{{0, k}, {8 * k, 10 * k}, {20 * k, 21 * k}}},
		{"EndsInData", 16 * k, map[int64]int{4 * k: k, 15 * k: k}, []durable.Extent{{4 * k, 5 * k}, {15 * k, 16 * k}}},
		{"AllHole", 16 * k, nil, nil},
		{"AllData", 4 * k, map[int64]int{0: 4 * k}, []durable.Extent{{0, 4 * k}}},
		{"Empty", 0, nil, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := extentsOf(t, sparseFile(t, c.size, c.runs)); !reflect.DeepEqual(got, c.want) {
				t.Fatalf("extents %v, want %v", got, c.want)
			}
		})
	}
}

// TestSparseUpload: a 10 GB sparse image holding 1 MiB of data is uploaded
// reading about that 1 MiB, its holes recorded as hole chunks;
// materialized, it is the same bytes and as sparse; uploaded again
// unchanged nothing is stored, and after a 4 KiB change one chunk is.
func TestSparseUpload(t *testing.T) {
	ctx := context.Background()
	_, st := gateway(t)
	im := durable.New(st, nil)
	const size = 10 << 30
	dataAt := int64(5<<30 + 3*4096) // inside a chunk, not at its start
	src := sparseFile(t, size, map[int64]int{dataAt: 1 << 20})
	dir := filepath.Dir(src)

	before := im.Stats()
	m, err := im.Upload(ctx, "volumes/v", dir)
	if err != nil {
		t.Fatal(err)
	}
	after := im.Stats()
	if read := after.Read - before.Read; read < 1<<20 || read > 1<<20+64<<10 {
		t.Fatalf("the upload read %d bytes of a file holding 1 MiB of data", read)
	}
	if len(m.Files) != 1 || !m.Files[0].Sparse {
		t.Fatalf("manifest: %d files, first sparse=%v", len(m.Files), m.Files[0].Sparse)
	}
	// A hole, the data (1 MiB, with what its extent rounds up to), a hole.
	var data, at int64
	for i, c := range m.Files[0].Chunks {
		switch {
		case c.Hole && (i == 0 || i == len(m.Files[0].Chunks)-1):
		case c.Hole:
			t.Fatalf("chunk %d is a hole between data", i)
		case at > dataAt || at+c.Size < dataAt:
			t.Fatalf("data chunk %d at [%d, %d), the data at %d", i, at, at+c.Size, dataAt)
		default:
			data += c.Size
		}
		at += c.Size
	}
	if data < 1<<20 || data > 1<<20+64<<10 || at != size {
		t.Fatalf("%d bytes in data chunks, %d in all; want about 1 MiB of %d", data, at, int64(size))
	}
	if up := after.Uploaded - before.Uploaded; up == 0 || up > 1<<20 {
		t.Fatalf("uploaded %d bytes", up)
	}

	dst := filepath.Join(t.TempDir(), "img")
	if _, err := im.Materialize(ctx, "volumes/v", dst); err != nil {
		t.Fatal(err)
	}
	got := filepath.Join(dst, "sparse.img")
	var sst unix.Stat_t
	if err := unix.Stat(got, &sst); err != nil || sst.Size != size || sst.Blocks*512 > 4<<20 {
		t.Fatalf("materialized: %d bytes, %d allocated (%v)", sst.Size, sst.Blocks*512, err)
	}
	if exts := extentsOf(t, got); len(exts) != 1 || exts[0].Off > dataAt || exts[0].End < dataAt+1<<20 {
		t.Fatalf("materialized extents %v, want one around [%d, %d)", exts, dataAt, dataAt+1<<20)
	}
	f, err := os.Open(got)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20+2)
	if _, err := f.ReadAt(buf, dataAt-1); err != nil {
		t.Fatal(err)
	}
	want := append(append([]byte{0}, bytes.Repeat([]byte{byte(dataAt%251 + 1)}, 1<<20)...), 0)
	if !bytes.Equal(buf, want) {
		t.Fatal("the materialized data differs")
	}

	// Unchanged: nothing new stored, no chunk compressed again.
	before = im.Stats()
	if _, err := im.Upload(ctx, "volumes/v", dir); err != nil {
		t.Fatal(err)
	}
	if up := im.Stats().Uploaded - before.Uploaded; up != 0 {
		t.Fatalf("an unchanged image uploaded %d bytes again", up)
	}

	// 4 KiB changed in a new place: one more data chunk, only it stored.
	w, err := os.OpenFile(src, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = w.WriteAt(bytes.Repeat([]byte{9}, 4096), 7<<30)
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	before = im.Stats()
	m2, err := im.Upload(ctx, "volumes/v", dir)
	if err != nil {
		t.Fatal(err)
	}
	after = im.Stats()
	if read := after.Read - before.Read; read > 1<<20+128<<10 {
		t.Fatalf("the second upload read %d bytes", read)
	}
	if up := after.Uploaded - before.Uploaded; up == 0 || up > 64<<10 {
		t.Fatalf("the second upload stored %d bytes; want one small chunk", up)
	}
	if m2.Files[0].SHA256 == m.Files[0].SHA256 {
		t.Fatal("the file digest did not change with the data")
	}
	dst2 := filepath.Join(t.TempDir(), "img")
	if _, err := im.Materialize(ctx, "volumes/v", dst2); err != nil {
		t.Fatal(err)
	}
	f2, err := os.Open(filepath.Join(dst2, "sparse.img"))
	if err != nil {
		t.Fatal(err)
	}
	defer f2.Close()
	page := make([]byte, 4096)
	if _, err := f2.ReadAt(page, 7<<30); err != nil || !bytes.Equal(page, bytes.Repeat([]byte{9}, 4096)) {
		t.Fatalf("the changed page did not come back (%v)", err)
	}
}
