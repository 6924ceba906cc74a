// Package usage samples what each running sandbox uses — CPU share, memory
// and disk against their limits, network bytes — every interval through
// the runtime (runtime.UsageReporter), and keeps the last hour of samples
// of each live sandbox in memory for the APIs' metrics routes and lists.
// It is a feature over the sandbox service's core: it reads the live table
// (EachLive) and checks a caller's project with Get.
package usage

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/lizard-build/lizard/internal/runtime"
	"github.com/lizard-build/lizard/internal/sandbox"
)

// DefaultInterval is how often Run samples unless told.
const DefaultInterval = 5 * time.Second

// Keep is how long samples are kept.
const Keep = time.Hour

// Sample is what a running sandbox used at one moment: its CPU share since
// the sample before, its memory and disk now against its limits, and the
// bytes its network interface has moved since it started (or resumed).
type Sample struct {
	Time       time.Time
	CPUCount   float64 // the sandbox's CPU quota in cores
	CPUUsedPct float64 // of CPUCount, since the sample before (0 in the first)
	MemUsed    int64
	MemTotal   int64
	DiskUsed   int64
	DiskTotal  int64
	NetRxBytes uint64
	NetTxBytes uint64
}

// Core is what sampling needs of the sandbox service.
type Core interface {
	Get(projectID, id string) (sandbox.Record, error)
	EachLive(fn func(sandbox.Record))
}

// Sampler samples and keeps usage. It is safe for concurrent use.
type Sampler struct {
	core  Core
	ur    runtime.UsageReporter // nil: the runtime reports none
	log   *slog.Logger
	rings rings
}

// New returns a sampler of core's sandboxes on rt; a runtime that is not a
// runtime.UsageReporter gives no samples.
func New(core Core, rt runtime.Runtime, log *slog.Logger) *Sampler {
	if log == nil {
		log = slog.Default()
	}
	ur, _ := rt.(runtime.UsageReporter)
	return &Sampler{core: core, ur: ur, log: log}
}

// Run samples every running sandbox each interval until ctx is done.
func (s *Sampler) Run(ctx context.Context, interval time.Duration) {
	if s.ur == nil {
		s.log.Warn("the runtime reports no usage: sandboxes have no usage metrics")
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		s.Sample()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Sample takes one sample of every running sandbox and drops the samples
// of those that are gone.
func (s *Sampler) Sample() {
	type target struct {
		id   string
		cpus float64
	}
	var running []target
	live := map[string]bool{}
	s.core.EachLive(func(r sandbox.Record) {
		live[r.ID] = true
		if r.Status == sandbox.StatusRunning {
			running = append(running, target{r.ID, r.CPUs})
		}
	})
	s.rings.keep(live)
	if s.ur == nil {
		return
	}
	for _, t := range running {
		u, err := s.ur.Usage(t.id)
		if err != nil {
			// It may have gone or paused since the list was made.
			s.log.Debug("sample usage", "sandbox", t.id, "err", err)
			continue
		}
		s.rings.add(t.id, t.cpus, u, time.Now())
	}
}

// Usage returns the project's sandbox's samples taken between start and
// end (zero times are open ends), oldest first.
func (s *Sampler) Usage(projectID, id string, start, end time.Time) ([]Sample, error) {
	if _, err := s.core.Get(projectID, id); err != nil {
		return nil, err
	}
	return s.rings.between(id, start, end), nil
}

// LatestUsage returns the sandbox's last sample, if it has one.
func (s *Sampler) LatestUsage(id string) (Sample, bool) {
	return s.rings.latest(id)
}

// rings holds the samples of the last Keep of each live sandbox.
// The zero value is ready.
type rings struct {
	mu sync.Mutex
	m  map[string]*ring
}

type ring struct {
	samples []Sample // oldest first
	cpu     uint64   // the CPU counter at the last sample
}

// add appends a sample made from u and drops those older than Keep.
func (r *rings) add(id string, cpus float64, u runtime.Usage, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[string]*ring{}
	}
	rg := r.m[id]
	if rg == nil {
		rg = &ring{}
		r.m[id] = rg
	}
	sm := Sample{
		Time: now, CPUCount: cpus, MemUsed: u.MemoryBytes, MemTotal: u.MemoryLimit,
		DiskUsed: u.DiskBytes, DiskTotal: u.DiskLimit, NetRxBytes: u.RxBytes, NetTxBytes: u.TxBytes,
	}
	// A counter that went back belongs to a new cgroup (a resume): the
	// sample has no share to report.
	if n := len(rg.samples); n > 0 && u.CPUNanos >= rg.cpu && cpus > 0 {
		if wall := now.Sub(rg.samples[n-1].Time); wall > 0 {
			sm.CPUUsedPct = float64(u.CPUNanos-rg.cpu) / (float64(wall.Nanoseconds()) * cpus) * 100
		}
	}
	rg.cpu = u.CPUNanos
	drop := 0
	for drop < len(rg.samples) && now.Sub(rg.samples[drop].Time) > Keep {
		drop++
	}
	rg.samples = append(rg.samples[drop:], sm)
}

// keep drops the rings of sandboxes that are gone.
func (r *rings) keep(live map[string]bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id := range r.m {
		if !live[id] {
			delete(r.m, id)
		}
	}
}

// between returns the samples with start <= time <= end (zero times are
// open ends).
func (r *rings) between(id string, start, end time.Time) []Sample {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := []Sample{}
	rg := r.m[id]
	if rg == nil {
		return out
	}
	for _, sm := range rg.samples {
		if (start.IsZero() || !sm.Time.Before(start)) && (end.IsZero() || !sm.Time.After(end)) {
			out = append(out, sm)
		}
	}
	return out
}

func (r *rings) latest(id string) (Sample, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rg := r.m[id]
	if rg == nil || len(rg.samples) == 0 {
		return Sample{}, false
	}
	return rg.samples[len(rg.samples)-1], true
}
