package usage

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/runtime"
	"github.com/lizard-build/lizard/internal/runtime/fake"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/sandbox/sandboxtest"
)

func TestUsageRings(t *testing.T) {
	var r rings
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

	// Older than Keep goes.
	r.add("a", 2, runtime.Usage{CPUNanos: 3 * sec}, t0.Add(Keep+3*time.Second))
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

// reporting is the fake runtime reporting a fixed use of every sandbox,
// and counting the sandboxes it was asked about.
type reporting struct {
	*fake.Runtime
	mu    sync.Mutex
	asked map[string]int
}

func (r *reporting) Usage(id string) (runtime.Usage, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.asked[id]++
	return runtime.Usage{CPUNanos: uint64(r.asked[id]) * uint64(time.Second), MemoryBytes: 64 << 20, MemoryLimit: 512 << 20}, nil
}

// TestSampler, over the fake runtime: running sandboxes are sampled, paused
// ones are not; another project's sandbox is not found; a killed one
// loses its samples at the next sample; a runtime without usage gives
// none and Run returns at once.
func TestSampler(t *testing.T) {
	env := sandboxtest.NewEnv(t)
	rt := &reporting{Runtime: env.Runtime, asked: map[string]int{}}
	core := sandbox.New(sandbox.Config{Runtime: rt, Store: env.Store, Templates: env.Templates,
		SnapshotDir: env.SnapshotDir, Logger: sandboxtest.Logger(t)})
	ctx := context.Background()
	if err := core.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(core.Close)
	pid := env.Project.ID
	run, err := core.Create(ctx, sandbox.CreateRequest{ProjectID: pid})
	if err != nil {
		t.Fatal(err)
	}
	paused, err := core.Create(ctx, sandbox.CreateRequest{ProjectID: pid})
	if err != nil {
		t.Fatal(err)
	}
	if err := core.Pause(ctx, pid, paused.ID); err != nil {
		t.Fatal(err)
	}
	s := New(core, rt, sandboxtest.Logger(t))
	s.Sample()
	s.Sample()
	got, err := s.Usage(pid, run.ID, time.Time{}, time.Time{})
	if err != nil || len(got) != 2 || got[1].MemUsed != 64<<20 || got[1].MemTotal != 512<<20 || got[1].CPUCount != run.CPUs {
		t.Fatalf("Usage of the running sandbox: %+v %v, want 2 samples", got, err)
	}
	if got, err := s.Usage(pid, paused.ID, time.Time{}, time.Time{}); err != nil || len(got) != 0 || rt.asked[paused.ID] != 0 {
		t.Fatalf("the paused sandbox: %+v %v (asked %d times), want no samples", got, err, rt.asked[paused.ID])
	}
	if _, err := s.Usage("prj_other", run.ID, time.Time{}, time.Time{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another project's: %v, want ErrNotFound", err)
	}
	if l, ok := s.LatestUsage(run.ID); !ok || !l.Time.Equal(got[1].Time) {
		t.Fatalf("LatestUsage: %+v %v", l, ok)
	}
	if err := core.Kill(ctx, pid, run.ID); err != nil {
		t.Fatal(err)
	}
	s.Sample()
	if _, ok := s.LatestUsage(run.ID); ok {
		t.Fatalf("a killed sandbox keeps its samples")
	}

	none := New(core, env.Runtime, sandboxtest.Logger(t))
	done := make(chan struct{})
	go func() { none.Run(ctx, time.Millisecond); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatalf("Run without a usage reporter did not return")
	}
	if _, ok := none.LatestUsage(paused.ID); ok {
		t.Fatalf("samples without a usage reporter")
	}
}
