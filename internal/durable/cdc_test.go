package durable

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestCuts: cutting in parallel segments gives the chunks of cutting one
// after another, for random data, runs of zeros (no cut but MaxChunk) and
// segments shorter than a chunk; every chunk is MinChunk to MaxChunk bytes
// but the last.
func TestCuts(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, 40<<20)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	clear(b[5<<20 : 17<<20]) // zeros across segments
	var serial []int
	for at := 0; at < len(b); {
		n, ok := cut(b[at:], true)
		if !ok || n <= 0 {
			t.Fatalf("cut at %d: %d, %v", at, n, ok)
		}
		if (n < MinChunk || n > MaxChunk) && at+n != len(b) {
			t.Fatalf("chunk at %d of %d bytes", at, n)
		}
		at += n
		serial = append(serial, at)
	}
	for _, c := range []struct{ parts, least int }{{1, 1 << 20}, {2, 1 << 20}, {3, 1 << 20}, {7, 1 << 20}, {40, 1 << 20}, {4, 64 << 10}, {2, segment}} {
		if got, err := cutsBy(b, c.parts, c.least); err != nil || !slices.Equal(got, serial) {
			t.Fatalf("%d parts of at least %d bytes: %d chunks, serially %d; first difference at %d", c.parts, c.least, len(got), len(serial), firstDiff(got, serial))
		}
	}
	if got, err := cuts(nil, 2); len(got) != 0 || err != nil {
		t.Fatalf("cuts of nothing: %v %v", got, err)
	}
}

func firstDiff(a, b []int) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestCutsShrunkFile: cutting a mapped file that shrank meanwhile is an
// error, not a crash of the server (SIGBUS under guard), whichever
// goroutine reads past the end.
func TestCutsShrunkFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "pages.img")
	b := make([]byte, 8<<20)
	for i := range b {
		b[i] = byte(i * 7)
	}
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	data, unmap, err := mapFile(f, int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	defer unmap()
	if err := os.Truncate(p, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := cutsBy(data, 4, 1<<20); err == nil {
		t.Fatal("cutting a mapping whose file shrank: no error")
	}
}
