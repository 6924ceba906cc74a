// Package metrics defines every Prometheus metric lizard exports, on a
// registry of its own (never the client library's global one), and serves
// them in the text format. Parts of the server report through the small
// methods of Metrics (or, for the sandbox service, through an observer
// interface that Metrics satisfies); what is state rather than events —
// sandboxes by state, warm pools, node capacity, disk — is read when
// scraped, from an Inventory. Labels are bounded: operations, outcomes,
// route patterns, states and template names, never ids.
// cmd/lizard wires it; api, proxy and sandbox report to it.
package metrics

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// Metrics holds lizard's metrics and their registry. Its methods are safe
// for concurrent use; a nil *Metrics records nothing.
type Metrics struct {
	reg *prometheus.Registry

	operations     *prometheus.HistogramVec
	apiRequests    *prometheus.CounterVec
	apiDuration    *prometheus.HistogramVec
	proxyRequests  *prometheus.CounterVec
	proxyBytes     *prometheus.CounterVec
	templateBuilds *prometheus.HistogramVec
	agentRTT       prometheus.Histogram
	egressConns    *prometheus.CounterVec
	egressRequests *prometheus.CounterVec
	egressBytes    *prometheus.CounterVec
}

// lifecycleBuckets span a warm restore (milliseconds) to a cold boot or a
// long exec (minutes).
var lifecycleBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}

// New makes the metrics on a fresh registry, with the Go runtime's and the
// process's own collectors.
func New() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		operations: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "lizard_sandbox_operation_duration_seconds",
			Help:    "Sandbox lifecycle operations (create, exec, pause, resume, snapshot, restore, fork, kill) by outcome: ok or the error class.",
			Buckets: lifecycleBuckets,
		}, []string{"operation", "outcome"}),
		apiRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lizard_api_requests_total",
			Help: "API requests by route pattern and status code.",
		}, []string{"route", "status"}),
		apiDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "lizard_api_request_duration_seconds",
			Help:    "API request durations by route pattern (streams last as long as they stream).",
			Buckets: lifecycleBuckets,
		}, []string{"route"}),
		proxyRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lizard_proxy_requests_total",
			Help: "Preview proxy requests by outcome: forwarded, unauthorized, not_found, bad_host, unavailable, upstream_error.",
		}, []string{"outcome"}),
		proxyBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lizard_proxy_bytes_total",
			Help: "Bytes through the preview proxy: in from clients, out to clients.",
		}, []string{"direction"}),
		templateBuilds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "lizard_template_build_duration_seconds",
			Help:    "Template builds by outcome.",
			Buckets: []float64{1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600},
		}, []string{"outcome"}),
		agentRTT: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "lizard_agent_round_trip_seconds",
			Help:    "Round trip of a health call from the host to a sandbox's agent.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}),
	}
	m.egressConns = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lizard_egress_connections_total",
		Help: "Connections through the egress proxy by decision: spliced, intercepted, http, tcp (allowed, by how), denied, error.",
	}, []string{"decision"})
	m.egressRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lizard_egress_requests_total",
		Help: "Requests of parsed egress connections (plain HTTP, intercepted TLS) by outcome: forwarded, denied, unresolved, misdirected, upstream_error.",
	}, []string{"outcome"})
	m.egressBytes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "lizard_egress_bytes_total",
		Help: "Bytes through the egress proxy: out from sandboxes, in to them.",
	}, []string{"direction"})
	m.reg.MustRegister(m.egressConns, m.egressRequests, m.egressBytes)
	m.reg.MustRegister(m.operations, m.apiRequests, m.apiDuration, m.proxyRequests, m.proxyBytes, m.templateBuilds, m.agentRTT,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// Register adds a collector (such as the one NewStateCollector makes).
func (m *Metrics) Register(c prometheus.Collector) error { return m.reg.Register(c) }

// Operation records one sandbox lifecycle operation.
func (m *Metrics) Operation(op string, took time.Duration, err error) {
	if m == nil {
		return
	}
	m.operations.WithLabelValues(op, Outcome(err)).Observe(took.Seconds())
}

// AgentRoundTrip records one round trip to a sandbox's agent.
func (m *Metrics) AgentRoundTrip(d time.Duration) {
	if m == nil {
		return
	}
	m.agentRTT.Observe(d.Seconds())
}

// APIRequest records one API request; route is the mux pattern that
// served it ("" when none did).
func (m *Metrics) APIRequest(route string, status int, took time.Duration) {
	if m == nil {
		return
	}
	if route == "" {
		route = "unmatched"
	}
	m.apiRequests.WithLabelValues(route, statusLabel(status)).Inc()
	m.apiDuration.WithLabelValues(route).Observe(took.Seconds())
}

// ProxyRequest records one preview proxy request and the bytes it moved.
func (m *Metrics) ProxyRequest(outcome string, in, out int64) {
	if m == nil {
		return
	}
	m.proxyRequests.WithLabelValues(outcome).Inc()
	m.proxyBytes.WithLabelValues("in").Add(float64(in))
	m.proxyBytes.WithLabelValues("out").Add(float64(out))
}

// EgressConnection counts a connection of the egress proxy by decision
// (egress.Recorder).
func (m *Metrics) EgressConnection(decision string) {
	if m != nil {
		m.egressConns.WithLabelValues(decision).Inc()
	}
}

// EgressRequest counts a request of a parsed egress connection by outcome.
func (m *Metrics) EgressRequest(outcome string) {
	if m != nil {
		m.egressRequests.WithLabelValues(outcome).Inc()
	}
}

// EgressBytes counts bytes through the egress proxy by direction (out, in).
func (m *Metrics) EgressBytes(direction string, n int64) {
	if m != nil && n > 0 {
		m.egressBytes.WithLabelValues(direction).Add(float64(n))
	}
}

// TemplateBuild records one template build.
func (m *Metrics) TemplateBuild(took time.Duration, err error) {
	if m == nil {
		return
	}
	m.templateBuilds.WithLabelValues(Outcome(err)).Observe(took.Seconds())
}

// statusLabel is the status code as text; codes outside 100–599 (which no
// handler writes) are one label, so that the label stays bounded.
func statusLabel(status int) string {
	if status < 100 || status > 599 {
		return "other"
	}
	return strconv.Itoa(status)
}

// outcomes names the error classes for the outcome label, in the order they
// are tested.
var outcomes = []struct {
	err  error
	name string
}{
	{errdefs.ErrInvalid, "invalid"},
	{errdefs.ErrNotFound, "not_found"},
	{errdefs.ErrConflict, "conflict"},
	{errdefs.ErrUnauthenticated, "unauthenticated"},
	{errdefs.ErrPermission, "permission"},
	{errdefs.ErrLimit, "limit"},
	{errdefs.ErrTimeout, "timeout"},
	{errdefs.ErrUnavailable, "unavailable"},
	{errdefs.ErrTooLarge, "too_large"},
}

// Outcome is the outcome label of an error: "ok" for nil, the errdefs
// class, "canceled" when the caller went away, else "error".
func Outcome(err error) string {
	if err == nil {
		return "ok"
	}
	for _, o := range outcomes {
		if errors.Is(err, o.err) {
			return o.name
		}
	}
	if errors.Is(err, context.Canceled) {
		return "canceled"
	}
	return "error"
}
