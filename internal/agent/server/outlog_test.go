package server

import (
	"strings"
	"testing"
)

func TestOutputLog(t *testing.T) {
	l := newOutputLog(10)
	l.append("pty", []byte("abcd"))
	l.append("pty", []byte("efgh"))

	read := func(off int64) (string, int64, int64) {
		v := l.from(off)
		var b strings.Builder
		for _, c := range v.chunks {
			b.Write(c.data)
		}
		return b.String(), v.next, v.dropped
	}
	tests := []struct {
		name          string
		off           int64
		want          string
		next, dropped int64
	}{
		{"from the start", 0, "abcdefgh", 8, 0},
		{"inside a chunk", 5, "fgh", 8, 0},
		{"at the end", 8, "", 8, 0},
	}
	for _, tt := range tests {
		if got, next, dropped := read(tt.off); got != tt.want || next != tt.next || dropped != tt.dropped {
			t.Errorf("%s: from(%d) = %q next %d dropped %d; want %q %d %d", tt.name, tt.off, got, next, dropped, tt.want, tt.next, tt.dropped)
		}
	}

	// Past the limit the oldest chunks go; a reader behind them is told.
	l.append("pty", []byte("ijkl"))
	if got, next, dropped := read(0); got != "efghijkl" || next != 12 || dropped != 4 {
		t.Errorf("after trimming: %q next %d dropped %d; want efghijkl 12 4", got, next, dropped)
	}
	// A chunk larger than the limit is kept alone, whole.
	l.append("pty", []byte("0123456789ABCDEF"))
	if got, next, dropped := read(12); got != "0123456789ABCDEF" || next != 28 || dropped != 0 {
		t.Errorf("big chunk: %q next %d dropped %d", got, next, dropped)
	}

	w := l.from(28).wake
	l.finish(3, "")
	select {
	case <-w:
	default:
		t.Fatal("finish did not wake readers")
	}
	if v := l.from(28); v.exit == nil || *v.exit != 3 || len(v.chunks) != 0 {
		t.Fatalf("after finish: %+v", v)
	}
}
