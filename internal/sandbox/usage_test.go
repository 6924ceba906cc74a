package sandbox

import (
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/runtime"
)

func TestUsageRings(t *testing.T) {
	var r usageRings
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	sec := uint64(time.Second)
	r.add("a", 2, runtime.Usage{CPUNanos: 10 * sec, MemoryBytes: 100, MemoryLimit: 1000, DiskBytes: 5, DiskLimit: 50, RxBytes: 7, TxBytes: 8}, t0)
	// 2 s of CPU over 2 s of wall time on 2 CPUs: 50%.
	r.add("a", 2, runtime.Usage{CPUNanos: 12 * sec}, t0.Add(2*time.Second))
	// A counter that went back (a new cgroup after a resume) has no share.
	r.add("a", 2, runtime.Usage{CPUNanos: 1 * sec}, t0.Add(4*time.Second))
	// 1 s over 2 s on 2 CPUs: 25%, from the new counter.
	r.add("a", 2, runtime.Usage{CPUNanos: 2 * sec}, t0.Add(6*time.Second))

	got := r.between("a", time.Time{}, time.Time{})
	want := []float64{0, 50, 0, 25}
	if len(got) != len(want) {
		t.Fatalf("%d samples, want %d", len(got), len(want))
	}
	for i, w := range want {
		if got[i].CPUUsedPct != w {
			t.Errorf("sample %d: cpuUsedPct %v, want %v", i, got[i].CPUUsedPct, w)
		}
	}
	if s := got[0]; s.MemUsed != 100 || s.MemTotal != 1000 || s.DiskUsed != 5 || s.DiskTotal != 50 || s.NetRxBytes != 7 || s.NetTxBytes != 8 || s.CPUCount != 2 || !s.Time.Equal(t0) {
		t.Errorf("first sample %+v", s)
	}
	if n := len(r.between("a", t0.Add(2*time.Second), t0.Add(4*time.Second))); n != 2 {
		t.Errorf("window of 2 s holds %d samples, want 2", n)
	}
	if l, ok := r.latest("a"); !ok || !l.Time.Equal(t0.Add(6*time.Second)) {
		t.Errorf("latest %+v %v", l, ok)
	}

	// Older than UsageKeep goes.
	r.add("a", 2, runtime.Usage{CPUNanos: 3 * sec}, t0.Add(UsageKeep+3*time.Second))
	got = r.between("a", time.Time{}, time.Time{})
	if len(got) != 3 || !got[0].Time.Equal(t0.Add(4*time.Second)) {
		t.Errorf("after an hour: %d samples from %v, want 3 from %v", len(got), got[0].Time, t0.Add(4*time.Second))
	}

	// A sandbox that is gone loses its samples.
	r.add("b", 1, runtime.Usage{}, t0)
	r.keep(map[string]bool{"b": true})
	if _, ok := r.latest("a"); ok {
		t.Error("samples of a gone sandbox kept")
	}
	if got := r.between("a", time.Time{}, time.Time{}); got == nil || len(got) != 0 {
		t.Errorf("between of a gone sandbox: %v, want empty", got)
	}
	if _, ok := r.latest("b"); !ok {
		t.Error("samples of a live sandbox dropped")
	}
}
