package durable

import (
	"errors"
	"slices"
	"sync"
)

// Content-defined chunking: a file's data is cut where a rolling hash of
// the last 64 bytes matches a mask, not at fixed offsets, so that the
// chunks of two images that hold the same runs of bytes at different
// offsets (two checkpoints of one sandbox: the memory file lays the same
// pages out a few pages apart) are the same chunks, and a second upload
// stores only the chunks around what changed. The hash is a gear hash
// (FastCDC's), with normalized chunking: a stricter mask before AvgChunk
// and a looser one after keep sizes near the average.
//
// The table and the masks are part of the stored format in effect: a
// change makes every chunk of a re-upload new (never wrong).

const (
	// MinChunk, AvgChunk and MaxChunk bound a data chunk's size (the last
	// of a run of data may be shorter than MinChunk).
	MinChunk = 256 << 10
	AvgChunk = 1 << 20
	MaxChunk = 4 << 20
)

const (
	avgBits = 20 // log2(AvgChunk)
	// maskS has avgBits+2 bits set (cuts less often), maskL avgBits-2
	// (more often), both among the hash's high bits, which mix the most
	// bytes.
	maskS = (uint64(1)<<(avgBits+2) - 1) << (64 - avgBits - 2)
	maskL = (uint64(1)<<(avgBits-2) - 1) << (64 - avgBits + 2)
)

// gear is the rolling hash's table: 256 fixed pseudo-random words
// (splitmix64 from a fixed seed).
var gear = func() (t [256]uint64) {
	x := uint64(0x6c697a617264) // "lizard"
	for i := range t {
		x += 0x9e3779b97f4a7c15
		z := x
		z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
		z = (z ^ z>>27) * 0x94d049bb133111eb
		t[i] = z ^ z>>31
	}
	return t
}()

// cut returns the length of the chunk that starts b, and true; or false
// when b is too short to tell and more of the data follows (final says b
// is all that is left).
func cut(b []byte, final bool) (int, bool) {
	if len(b) <= MinChunk {
		return len(b), final
	}
	lim := min(len(b), MaxChunk)
	mid := min(lim, AvgChunk)
	var h uint64
	// Ranges over subslices: no bounds checks in the loops.
	for i, c := range b[MinChunk:mid] {
		h = h<<1 + gear[c]
		if h&maskS == 0 {
			return MinChunk + i + 1, true
		}
	}
	for i, c := range b[mid:lim] {
		h = h<<1 + gear[c]
		if h&maskL == 0 {
			return mid + i + 1, true
		}
	}
	if lim == MaxChunk || final {
		return lim, true
	}
	return 0, false
}

// segment is the least data cuts gives a goroutine of its own.
const segment = 32 << 20

// cuts returns the ends of the chunks of b, the same as cutting b one
// chunk after another from its start, found by up to parts goroutines:
// each cuts a segment of b from the segment's start; then, in order, the
// chunks of a segment are followed past its end until one ends where a
// chunk of the next segment ends, from which on the two agree (a cut
// depends only on where its chunk starts). That takes a chunk or two
// here.
//
// b may be a mapping of mapFile: a fault reading it (the file shrank) is
// the error, in whichever goroutine it happens (guard).
func cuts(b []byte, parts int) ([]int, error) { return cutsBy(b, parts, segment) }

// cutsBy is cuts with segments of at least least bytes.
func cutsBy(b []byte, parts, least int) (out []int, err error) {
	parts = max(1, min(parts, len(b)/least))
	starts := make([]int, parts+1)
	for i := range starts {
		starts[i] = len(b) * i / parts
	}
	ends := make([][]int, parts)
	errs := make([]error, parts)
	var wg sync.WaitGroup
	for i := range parts {
		wg.Go(func() {
			errs[i] = guard(func() error {
				// Cut from the segment's start to past its end (all of
				// b for the last).
				for at := starts[i]; at < starts[i+1]; {
					n, _ := cut(b[at:], true)
					at += n
					ends[i] = append(ends[i], at)
				}
				return nil
			})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	err = guard(func() error { out = join(b, ends); return nil })
	return out, err
}

// join is the chunk ends of b from those of its segments (cutsBy).
func join(b []byte, ends [][]int) []int {
	out := ends[0]
	for i := 1; i < len(ends); i++ {
		next := ends[i]
		for {
			last := out[len(out)-1]
			j, found := slices.BinarySearch(next, last)
			if found {
				out = append(out, next[j+1:]...)
				break
			}
			if j == len(next) {
				// Past every chunk of the segment (it had one or two):
				// the next segment's are matched from here.
				break
			}
			n, _ := cut(b[last:], true)
			out = append(out, last+n)
		}
	}
	return out
}
