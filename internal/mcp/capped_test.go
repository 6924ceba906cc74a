package mcp

import (
	"strconv"
	"strings"
	"testing"
)

func TestCapped(t *testing.T) {
	tests := []struct {
		name   string
		cap    int
		writes []string
		want   string // "" to check cut instead
		cut    bool
		head   string
		tail   string
	}{
		{name: "under the cap", cap: 10, writes: []string{"abc", "def"}, want: "abcdef"},
		{name: "at the cap", cap: 6, writes: []string{"abcdef"}, want: "abcdef"},
		{name: "one write over", cap: 6, writes: []string{"abcdefghij"}, cut: true, head: "abc", tail: "hij"},
		{name: "many small writes over", cap: 6, writes: strings.Split("abcdefghij", ""), cut: true, head: "abc", tail: "hij"},
		{name: "a write past the ring", cap: 6, writes: []string{"ab", "cdefg", "hijklmnop", "q"}, cut: true, head: "abc", tail: "opq"},
		{name: "odd cap", cap: 5, writes: []string{"0123456789"}, cut: true, head: "012", tail: "89"},
		// The cut falls between characters: é is two bytes.
		{name: "characters", cap: 6, writes: []string{"aéébcdeéf"}, cut: true, head: "aé", tail: "éf"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCapped(tt.cap)
			total := 0
			for _, w := range tt.writes {
				if n, err := c.Write([]byte(w)); n != len(w) || err != nil {
					t.Fatalf("Write(%q) = %d, %v", w, n, err)
				}
				total += len(w)
			}
			if c.total != int64(total) {
				t.Errorf("total %d, want %d", c.total, total)
			}
			got := c.String()
			if !tt.cut {
				if got != tt.want || c.Truncated() {
					t.Fatalf("String() = %q (truncated %v), want %q", got, c.Truncated(), tt.want)
				}
				return
			}
			if !c.Truncated() {
				t.Fatal("not truncated")
			}
			if !strings.HasPrefix(got, tt.head+"\n[…") || !strings.HasSuffix(got, "…]\n"+tt.tail) {
				t.Fatalf("String() = %q, want %q … %q", got, tt.head, tt.tail)
			}
			// The line says the size and the cap.
			for _, s := range []string{"the output was " + strconv.Itoa(total) + " bytes", "the cap of " + strconv.Itoa(tt.cap)} {
				if !strings.Contains(got, s) {
					t.Errorf("String() = %q, want it to say %q", got, s)
				}
			}
		})
	}
}

func TestClip(t *testing.T) {
	if got := clip("héllo", 2); got != "h…" {
		t.Errorf("clip cuts a character: %q", got)
	}
	if got := clip("hello", 5); got != "hello" {
		t.Errorf("clip of a short string: %q", got)
	}
}

func TestStripANSI(t *testing.T) {
	in := "\x1b[0;31mValueError\x1b[0m: boom\x1b[1;32m"
	if got := stripANSI(in); got != "ValueError: boom" {
		t.Errorf("stripANSI = %q", got)
	}
}
