package ratelimit

import (
	"testing"
	"time"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }
func newClock() *clock                   { return &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)} }

func TestBucket(t *testing.T) {
	c := newClock()
	l := New(2, 3, 0, c.now) // 2/s, bursts of 3
	for i := range 3 {
		if _, ok := l.Allow("a"); !ok {
			t.Fatalf("request %d of the burst refused", i)
		}
	}
	wait, ok := l.Allow("a")
	if ok || wait != 500*time.Millisecond {
		t.Fatalf("over the burst: ok %v, wait %v, want 500ms", ok, wait)
	}
	if _, ok := l.Allow("b"); !ok {
		t.Fatal("another key shares a's bucket")
	}
	c.advance(250 * time.Millisecond)
	if wait, ok := l.Allow("a"); ok || wait != 250*time.Millisecond {
		t.Fatalf("after 250ms: ok %v, wait %v, want 250ms", ok, wait)
	}
	c.advance(250 * time.Millisecond)
	if _, ok := l.Allow("a"); !ok {
		t.Fatal("after 500ms a token should be back")
	}
	if _, ok := l.Allow("a"); ok {
		t.Fatal("only one token came back")
	}
	c.advance(time.Hour) // refills to the burst, not beyond
	n := 0
	for {
		if _, ok := l.Allow("a"); !ok {
			break
		}
		n++
	}
	if n != 3 {
		t.Fatalf("after an hour: %d requests allowed, want the burst of 3", n)
	}
}

func TestFractionalRate(t *testing.T) {
	c := newClock()
	l := New(0.5, 1, 0, c.now)
	l.Allow("a")
	if wait, ok := l.Allow("a"); ok || wait != 2*time.Second {
		t.Fatalf("ok %v, wait %v, want 2s", ok, wait)
	}
}

func TestBounded(t *testing.T) {
	c := newClock()
	l := New(1, 2, 4, c.now)
	for _, k := range []string{"a", "b", "c", "d"} {
		l.Allow(k)
	}
	l.Allow("e") // none has refilled: one goes, arbitrarily
	if n := len(l.buckets); n != 4 {
		t.Fatalf("%d buckets, want at most 4", n)
	}
	if _, ok := l.buckets["e"]; !ok {
		t.Fatal("the new key has no bucket")
	}
	c.advance(time.Second) // all refilled
	l.Allow("f")
	if n := len(l.buckets); n != 1 {
		t.Fatalf("refilled buckets kept: %d, want only f's", n)
	}
	// A key evicted with an empty bucket starts full again: the bound
	// costs precision, never memory.
	for range 2 {
		l.Allow("f")
	}
	if _, ok := l.Allow("f"); ok {
		t.Fatal("f is over its burst")
	}
}
