package sandbox

import (
	"context"
	"time"

	"github.com/lizard-build/lizard/internal/agent"

	"github.com/lizard-build/lizard/internal/metrics"
	"github.com/lizard-build/lizard/internal/template"
)

// Observer is told what the service did, for metrics. Its methods must be
// quick and safe for concurrent use.
type Observer interface {
	// Operation reports one lifecycle operation (the op* names), how long
	// it took and its error (nil when it succeeded).
	Operation(op string, took time.Duration, err error)
	// AgentRoundTrip reports one health call's round trip to an agent.
	AgentRoundTrip(took time.Duration)
}

// Lifecycle operations as Observer sees them.
const (
	opCreate   = "create"
	opExec     = "exec"
	opPause    = "pause"
	opResume   = "resume"
	opSnapshot = "snapshot"
	opRestore  = "restore"
	opFork     = "fork"
	opKill     = "kill"
)

// observe reports an operation that began at start and ended with *err;
// it is deferred at the top of each lifecycle method.
func (s *Service) observe(op string, start time.Time, err *error) {
	if s.cfg.Observer != nil {
		s.cfg.Observer.Operation(op, time.Since(start), *err)
	}
}

// ProbeAgents times a health call to the agent of every running sandbox
// each interval until ctx is done, for the Observer's AgentRoundTrip; it
// returns at once without an Observer.
func (s *Service) ProbeAgents(ctx context.Context, interval time.Duration) {
	if s.cfg.Observer == nil {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		var agents []*agent.Client
		s.mu.Lock()
		for _, e := range s.sandboxes {
			if !e.gone && e.rec.Status == StatusRunning && e.agent != nil {
				agents = append(agents, e.agent)
			}
		}
		s.mu.Unlock()
		for _, ag := range agents {
			hctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			start := time.Now()
			if _, err := ag.Health(hctx); err == nil {
				s.cfg.Observer.AgentRoundTrip(time.Since(start))
			}
			cancel()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Sandboxes is metrics.Inventory's sandboxes: every live sandbox, warm
// pool copies, ones being made and unresponsive ones included.
func (s *Service) Sandboxes() []metrics.Sandbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]metrics.Sandbox, 0, len(s.sandboxes))
	for _, e := range s.sandboxes {
		out = append(out, metrics.Sandbox{State: e.rec.Status, Template: metricsTemplate(e.rec.Template), CPUs: e.rec.CPUs, MemoryMB: e.rec.MemoryMB})
	}
	// Unresponsive sandboxes run (and hold their size) but are not
	// reattached yet: lizard_sandboxes{state="unresponsive"}.
	for id := range s.unresponsive {
		if rec, ok := s.recovering[id]; ok {
			out = append(out, metrics.Sandbox{State: StatusUnresponsive, Template: metricsTemplate(rec.Template), CPUs: rec.CPUs, MemoryMB: rec.MemoryMB})
		}
	}
	return out
}

// metricsTemplate is the template label of a sandbox: a built-in's name,
// or "custom" for a project's own, whose name is that project's business
// (metrics are unauthenticated) and would make labels unbounded.
func metricsTemplate(name string) string {
	if template.IsBuiltin(name) {
		return template.Resolve(name)
	}
	return "custom"
}
