package durable

import (
	"math/rand/v2"
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
		if got := cutsBy(b, c.parts, c.least); !slices.Equal(got, serial) {
			t.Fatalf("%d parts of at least %d bytes: %d chunks, serially %d; first difference at %d", c.parts, c.least, len(got), len(serial), firstDiff(got, serial))
		}
	}
	if got := cuts(nil, 2); len(got) != 0 {
		t.Fatalf("cuts of nothing: %v", got)
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
