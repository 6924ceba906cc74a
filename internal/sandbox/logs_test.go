package sandbox

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// dirSize is what the files in dir take.
func dirSize(t *testing.T, dir string) int64 {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		n += fi.Size()
	}
	return n
}

// TestLogRing: a flood of output many times the cap keeps the log within
// it, the newest lines readable in order; removal leaves nothing.
func TestLogRing(t *testing.T) {
	dir := t.TempDir()
	const max = 256 << 10
	l := newLogs(dir, max)
	line := strings.Repeat("x", 200)
	const n = 20000 // ~5 MB of output
	for i := range n {
		l.add("sb", LogLine{Type: "stdout", Message: fmt.Sprintf("%06d %s", i, line)})
		if i%1000 == 0 {
			if size := dirSize(t, dir); size > max {
				t.Fatalf("after %d lines the log takes %d bytes, cap %d", i, size, max)
			}
		}
	}
	if size := dirSize(t, dir); size > max || size < max/4 {
		t.Fatalf("log takes %d bytes, cap %d", size, max)
	}
	got := l.tail("sb", 300)
	if len(got) != 300 {
		t.Fatalf("tail 300 gave %d lines", len(got))
	}
	for i, g := range got {
		if want := fmt.Sprintf("%06d ", n-300+i); !strings.HasPrefix(g.Message, want) {
			t.Fatalf("line %d of the tail: %.20q, want %q…", i, g.Message, want)
		}
	}
	// A single line larger than the ring is cut, not dropped.
	l.add("sb", LogLine{Type: "stdout", Message: strings.Repeat("y", max)})
	last := l.tail("sb", 1)
	if len(last) != 1 || !strings.HasPrefix(last[0].Message, "yyyy") || !strings.Contains(last[0].Message, "line cut") {
		t.Fatalf("huge line: %d lines: %.60v", len(last), last)
	}
	if size := dirSize(t, dir); size > max {
		t.Fatalf("after a huge line the log takes %d bytes", size)
	}
	// A new logs (a restarted server) continues the same ring.
	l2 := newLogs(dir, max)
	for i := range 5000 {
		l2.add("sb", LogLine{Type: "stdout", Message: fmt.Sprintf("again %d %s", i, line)})
	}
	if size := dirSize(t, dir); size > max {
		t.Fatalf("after a restart the log takes %d bytes", size)
	}
	l2.remove("sb")
	if left, _ := filepath.Glob(filepath.Join(dir, "*")); len(left) != 0 {
		t.Fatalf("left after remove: %v", left)
	}
}
