package metrics

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/lizard-build/lizard/internal/errdefs"
)

func TestOutcome(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{nil, "ok"},
		{fmt.Errorf("sandbox %q: %w", "x", errdefs.ErrNotFound), "not_found"},
		{errdefs.WithCode("invalid_size", fmt.Errorf("size: %w", errdefs.ErrInvalid)), "invalid"},
		{fmt.Errorf("pause: %w", errdefs.ErrConflict), "conflict"},
		{fmt.Errorf("wait: %w", context.Canceled), "canceled"},
		{errors.New("runsc exploded"), "error"},
	} {
		if got := Outcome(tc.err); got != tc.want {
			t.Errorf("Outcome(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}

type fakeInventory struct {
	sandboxes []Sandbox
	pools     []Pool
}

func (f fakeInventory) Sandboxes() []Sandbox { return f.sandboxes }
func (f fakeInventory) WarmPools() []Pool    { return f.pools }

// gather returns the registry's families by name.
func gather(t *testing.T, m *Metrics) map[string]*dto.MetricFamily {
	t.Helper()
	fams, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		out[f.GetName()] = f
	}
	return out
}

// series returns the value of the series of name with exactly these labels,
// or false.
func series(fams map[string]*dto.MetricFamily, name string, labels ...string) (float64, bool) {
	f := fams[name]
next:
	for _, m := range f.GetMetric() {
		if len(m.GetLabel())*2 != len(labels) {
			continue
		}
		for i, l := range m.GetLabel() {
			if l.GetName() != labels[2*i] || l.GetValue() != labels[2*i+1] {
				continue next
			}
		}
		switch {
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}

func TestStateCollector(t *testing.T) {
	m := New()
	inv := fakeInventory{
		sandboxes: []Sandbox{
			{State: "running", Template: "base", CPUs: 4, MemoryMB: 8192},
			{State: "running", Template: "base", CPUs: 0.5, MemoryMB: 1024},
			{State: "paused", Template: "base", CPUs: 4, MemoryMB: 8192},
			{State: "pooled", Template: "python", CPUs: 2, MemoryMB: 4096},
		},
		pools: []Pool{{Ready: 1, Target: 2}, {Ready: 3, Target: 3}},
	}
	if err := m.Register(NewStateCollector(StateConfig{Inventory: inv, DataDir: t.TempDir(), MaxSandboxes: 7})); err != nil {
		t.Fatal(err)
	}
	fams := gather(t, m)
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"lizard_sandboxes", []string{"state", "running", "template", "base"}, 2},
		{"lizard_sandboxes", []string{"state", "paused", "template", "base"}, 1},
		{"lizard_sandboxes", []string{"state", "pooled", "template", "python"}, 1},
		{"lizard_warm_pools", nil, 2},
		{"lizard_warm_pool_ready_sandboxes", nil, 4},
		{"lizard_warm_pool_target_sandboxes", nil, 5},
		{"lizard_node_max_sandboxes", nil, 7},
		// Paused sandboxes gave their CPU and memory back.
		{"lizard_node_reserved_cpus", nil, 6.5},
		{"lizard_node_reserved_memory_bytes", nil, float64((8192 + 1024 + 4096) << 20)},
	} {
		got, ok := series(fams, c.name, c.labels...)
		if !ok || got != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	for _, name := range []string{"lizard_node_cpus", "lizard_node_memory_bytes", "lizard_data_dir_filesystem_available_bytes"} {
		if v, ok := series(fams, name); !ok || v <= 0 {
			t.Errorf("%s = %v (present %v)", name, v, ok)
		}
	}
	if v, ok := series(fams, "lizard_data_dir_filesystem_bytes", "kind", "size"); !ok || v <= 0 {
		t.Errorf("lizard_data_dir_filesystem_bytes{size} = %v (present %v)", v, ok)
	}
}

type fixedReservations struct{}

func (fixedReservations) Reserved() (float64, int64) { return 3, 100 }

func TestStateCollectorReservations(t *testing.T) {
	m := New()
	m.Register(NewStateCollector(StateConfig{Inventory: fakeInventory{}, Reservations: fixedReservations{}}))
	fams := gather(t, m)
	if v, _ := series(fams, "lizard_node_reserved_cpus"); v != 3 {
		t.Errorf("reserved cpus %v, want the admission's 3", v)
	}
	if v, _ := series(fams, "lizard_node_reserved_memory_bytes"); v != 100<<20 {
		t.Errorf("reserved memory %v, want 100 MiB", v)
	}
}

func TestEvents(t *testing.T) {
	m := New()
	m.Operation("create", time.Second, nil)
	m.Operation("create", time.Second, fmt.Errorf("x: %w", errdefs.ErrLimit))
	m.Operation("create", 2*time.Second, nil)
	m.APIRequest("POST /api/sandboxes", 201, time.Millisecond)
	m.APIRequest("", 404, time.Millisecond)
	m.APIRequest("GET /x", 1000, time.Millisecond)
	m.ProxyRequest("forwarded", 10, 200)
	m.ProxyRequest("unauthorized", 0, 30)
	m.TemplateBuild(time.Minute, nil)
	m.AgentRoundTrip(time.Millisecond)
	m.EgressConnection("spliced")
	m.EgressConnection("denied")
	m.EgressConnection("denied")
	m.EgressRequest("unresolved")
	m.EgressBytes("out", 100)
	m.EgressBytes("in", 0)
	fams := gather(t, m)
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"lizard_sandbox_operation_duration_seconds", []string{"operation", "create", "outcome", "ok"}, 2},
		{"lizard_sandbox_operation_duration_seconds", []string{"operation", "create", "outcome", "limit"}, 1},
		{"lizard_api_requests_total", []string{"route", "POST /api/sandboxes", "status", "201"}, 1},
		{"lizard_api_requests_total", []string{"route", "unmatched", "status", "404"}, 1},
		{"lizard_api_requests_total", []string{"route", "GET /x", "status", "other"}, 1},
		{"lizard_proxy_requests_total", []string{"outcome", "forwarded"}, 1},
		{"lizard_proxy_bytes_total", []string{"direction", "in"}, 10},
		{"lizard_proxy_bytes_total", []string{"direction", "out"}, 230},
		{"lizard_template_build_duration_seconds", []string{"outcome", "ok"}, 1},
		{"lizard_agent_round_trip_seconds", nil, 1},
		{"lizard_egress_connections_total", []string{"decision", "spliced"}, 1},
		{"lizard_egress_connections_total", []string{"decision", "denied"}, 2},
		{"lizard_egress_requests_total", []string{"outcome", "unresolved"}, 1},
		{"lizard_egress_bytes_total", []string{"direction", "out"}, 100},
	} {
		got, ok := series(fams, c.name, c.labels...)
		if !ok || got != c.want {
			t.Errorf("%s%v = %v (present %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
	sum := fams["lizard_sandbox_operation_duration_seconds"].GetMetric()
	var total float64
	for _, s := range sum {
		total += s.GetHistogram().GetSampleSum()
	}
	if total != 4 {
		t.Errorf("operation durations sum to %v s, want 4", total)
	}
}

// A nil *Metrics records nothing and does not panic: parts built without
// metrics (tests, tools) pass nil.
func TestNil(t *testing.T) {
	var m *Metrics
	m.Operation("create", time.Second, nil)
	m.APIRequest("GET /", 200, time.Second)
	m.ProxyRequest("forwarded", 1, 1)
	m.TemplateBuild(time.Second, nil)
	m.AgentRoundTrip(time.Second)
	m.EgressConnection("spliced")
	m.EgressRequest("forwarded")
	m.EgressBytes("in", 1)
}
