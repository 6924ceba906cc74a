package slowness

import (
	"testing"
	"time"
)

func TestOf(t *testing.T) {
	for _, tt := range []struct {
		measured time.Duration
		want     float64
	}{
		{Reference, 1},
		{Reference / 2, 1}, // a faster machine keeps today's waits
		{4 * Reference, 4},
		{380 * time.Millisecond, 4},
	} {
		if got := Of(tt.measured); got != tt.want {
			t.Errorf("Of(%v) = %v, want %v", tt.measured, got, tt.want)
		}
	}
}

func TestParse(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want float64
		ok   bool
	}{
		{"", 1, true},
		{"1", 1, true},
		{"2.5", 2.5, true},
		{"0.5", 1, true},
		{"x", 0, false},
		{"NaN", 0, false},
		{"1e9", 0, false},
	} {
		got, err := Parse(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("Parse(%q) = %v, %v; want %v (ok %v)", tt.in, got, err, tt.want, tt.ok)
		}
	}
}

func TestScale(t *testing.T) {
	// Factor is read once per process: whatever the environment said,
	// at least 1.
	if got := Scale(30 * time.Second); got < 30*time.Second {
		t.Errorf("Scale(30s) = %v: shorter than today's wait", got)
	}
}
