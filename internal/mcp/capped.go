package mcp

import (
	"fmt"
	"unicode/utf8"
)

// capped keeps what a command writes within a budget: the first half of
// the cap and the last half, and counts the rest. A model reads the start
// (what ran) and the end (how it ended); the middle of a long output is
// what it can best do without.
type capped struct {
	cap   int
	head  []byte
	tail  []byte // a ring of the last cap/2 bytes once head is full
	next  int    // where the ring's next byte goes
	total int64
}

func newCapped(cap int) *capped { return &capped{cap: cap} }

func (c *capped) Write(b []byte) (int, error) {
	n := len(b)
	c.total += int64(n)
	half := c.cap - c.cap/2 // head's part; the tail gets cap/2
	if room := half - len(c.head); room > 0 {
		take := min(room, len(b))
		c.head = append(c.head, b[:take]...)
		b = b[take:]
	}
	keep := c.cap / 2
	if keep == 0 {
		return n, nil
	}
	if len(b) >= keep {
		c.tail = append(c.tail[:0], b[len(b)-keep:]...)
		c.next = 0
		return n, nil
	}
	for _, x := range b {
		if len(c.tail) < keep {
			c.tail = append(c.tail, x)
			continue
		}
		c.tail[c.next] = x
		c.next = (c.next + 1) % keep
	}
	return n, nil
}

// Truncated says whether bytes were left out.
func (c *capped) Truncated() bool { return c.total > int64(len(c.head)+len(c.tail)) }

// String is what was kept: all of it, or the head and the tail around a
// line that says how much was cut. The cut falls between characters.
func (c *capped) String() string {
	tail := append(append([]byte{}, c.tail[c.next:]...), c.tail[:c.next]...)
	if !c.Truncated() {
		return string(c.head) + string(tail)
	}
	head := c.head
	for len(head) > 0 && !utf8.FullRune(head[lastRuneStart(head):]) {
		head = head[:lastRuneStart(head)]
	}
	for len(tail) > 0 && !utf8.RuneStart(tail[0]) {
		tail = tail[1:]
	}
	cut := c.total - int64(len(head)+len(tail))
	return fmt.Sprintf("%s\n[… %d bytes cut: the output was %d bytes, more than the cap of %d; the first %d and the last %d are shown …]\n%s",
		head, cut, c.total, c.cap, len(head), len(tail), tail)
}

// lastRuneStart is the index of the start of b's last (maybe partial)
// character.
func lastRuneStart(b []byte) int {
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			return i
		}
	}
	return len(b) - 1
}
