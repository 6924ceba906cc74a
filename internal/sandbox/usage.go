package sandbox

import (
	"context"
	"sync"
	"time"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/runtime"
)

// DefaultUsageInterval is how often SampleUsage samples unless told.
const DefaultUsageInterval = 5 * time.Second

// UsageKeep is how long samples are kept.
const UsageKeep = time.Hour

// UsageSample is what a running sandbox used at one moment: its CPU share
// since the sample before, its memory and disk now against its limits, and
// the bytes its network interface has moved since it started (or resumed).
type UsageSample struct {
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

// usageRings holds the samples of the last UsageKeep of each live sandbox.
// The zero value is ready.
type usageRings struct {
	mu sync.Mutex
	m  map[string]*usageRing
}

type usageRing struct {
	samples []UsageSample // oldest first
	cpu     uint64        // the CPU counter at the last sample
}

// add appends a sample made from u and drops those older than UsageKeep.
func (r *usageRings) add(id string, cpus float64, u runtime.Usage, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[string]*usageRing{}
	}
	ring := r.m[id]
	if ring == nil {
		ring = &usageRing{}
		r.m[id] = ring
	}
	sm := UsageSample{
		Time: now, CPUCount: cpus, MemUsed: u.MemoryBytes, MemTotal: u.MemoryLimit,
		DiskUsed: u.DiskBytes, DiskTotal: u.DiskLimit, NetRxBytes: u.RxBytes, NetTxBytes: u.TxBytes,
	}
	// A counter that went back belongs to a new cgroup (a resume): the
	// sample has no share to report.
	if n := len(ring.samples); n > 0 && u.CPUNanos >= ring.cpu && cpus > 0 {
		if wall := now.Sub(ring.samples[n-1].Time); wall > 0 {
			sm.CPUUsedPct = float64(u.CPUNanos-ring.cpu) / (float64(wall.Nanoseconds()) * cpus) * 100
		}
	}
	ring.cpu = u.CPUNanos
	drop := 0
	for drop < len(ring.samples) && now.Sub(ring.samples[drop].Time) > UsageKeep {
		drop++
	}
	ring.samples = append(ring.samples[drop:], sm)
}

// keep drops the rings of sandboxes that are gone.
func (r *usageRings) keep(live map[string]bool) {
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
func (r *usageRings) between(id string, start, end time.Time) []UsageSample {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := []UsageSample{}
	ring := r.m[id]
	if ring == nil {
		return out
	}
	for _, sm := range ring.samples {
		if (start.IsZero() || !sm.Time.Before(start)) && (end.IsZero() || !sm.Time.After(end)) {
			out = append(out, sm)
		}
	}
	return out
}

func (r *usageRings) latest(id string) (UsageSample, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ring := r.m[id]
	if ring == nil || len(ring.samples) == 0 {
		return UsageSample{}, false
	}
	return ring.samples[len(ring.samples)-1], true
}

// SampleUsage samples every running sandbox each interval until ctx is
// done: what it uses (when the runtime is a runtime.UsageReporter) and the
// round trip to its agent (for the Observer).
func (s *Service) SampleUsage(ctx context.Context, interval time.Duration) {
	ur, _ := s.cfg.Runtime.(runtime.UsageReporter)
	if ur == nil {
		s.log.Warn("the runtime reports no usage: sandboxes have no usage metrics")
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		s.sampleUsage(ctx, ur)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *Service) sampleUsage(ctx context.Context, ur runtime.UsageReporter) {
	type target struct {
		id   string
		cpus float64
		ag   *agent.Client
	}
	var running []target
	live := map[string]bool{}
	s.mu.Lock()
	for id, e := range s.sandboxes {
		if e.gone {
			continue
		}
		live[id] = true
		if e.rec.Status == StatusRunning {
			running = append(running, target{id, e.rec.CPUs, e.agent})
		}
	}
	s.mu.Unlock()
	s.usage.keep(live)
	for _, t := range running {
		if ur != nil {
			u, err := ur.Usage(t.id)
			if err != nil {
				// It may have gone or paused since the list was made.
				s.log.Debug("sample usage", "sandbox", t.id, "err", err)
			} else {
				s.usage.add(t.id, t.cpus, u, time.Now())
			}
		}
		if s.cfg.Observer != nil && t.ag != nil {
			hctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			start := time.Now()
			if _, err := t.ag.Health(hctx); err == nil {
				s.cfg.Observer.AgentRoundTrip(time.Since(start))
			}
			cancel()
		}
	}
}

// Usage returns the project's sandbox's samples taken between start and
// end (zero times are open ends), oldest first.
func (s *Service) Usage(projectID, id string, start, end time.Time) ([]UsageSample, error) {
	if _, err := s.lookup(projectID, id); err != nil {
		return nil, err
	}
	return s.usage.between(id, start, end), nil
}

// LatestUsage returns the sandbox's last sample, if it has one.
func (s *Service) LatestUsage(id string) (UsageSample, bool) {
	return s.usage.latest(id)
}
