package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"text/tabwriter"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/lizard-build/lizard/internal/tracing/otlptest"
)

// The create breakdown (issue 24 part 2: where does a cold create's time
// over raw runsc go?): n creates on a server exporting every span over
// OTLP/HTTP to a receiver of the bench's own, which decodes them; each
// create request's trace gives the time of each of its spans, by name.
// The table has the p50 of the create request and of each span under it,
// with raw runsc's create → first exec beside them, measured in the run.

// createRoute is the create request's server span, execRoute the first
// exec's.
const (
	createRoute = "POST /api/sandboxes"
	execRoute   = "POST /api/sandboxes/{id}/exec"
	killRoute   = "DELETE /api/sandboxes/{id}"
)

// partsOf returns, for every request of route among the spans, the
// request's duration and the summed duration of each span name under it
// (children and their children).
func partsOf(spans []*tracepb.Span, route string) (requests []time.Duration, parts map[string][]time.Duration) {
	byTrace := map[string][]*tracepb.Span{}
	for _, s := range spans {
		byTrace[string(s.TraceId)] = append(byTrace[string(s.TraceId)], s)
	}
	parts = map[string][]time.Duration{}
	for _, trace := range byTrace {
		i := slices.IndexFunc(trace, func(s *tracepb.Span) bool {
			return s.Name == route && len(s.ParentSpanId) == 0
		})
		if i < 0 {
			continue
		}
		requests = append(requests, spanTime(trace[i]))
		sum := map[string]time.Duration{}
		for _, s := range trace {
			if s != trace[i] {
				sum[s.Name] += spanTime(s)
			}
		}
		for name, d := range sum {
			parts[name] = append(parts[name], d)
		}
	}
	return requests, parts
}

func spanTime(s *tracepb.Span) time.Duration {
	return time.Duration(s.EndTimeUnixNano - s.StartTimeUnixNano)
}

func benchCreateParts(ctx context.Context, cfg config, w io.Writer, n int) error {
	rcv, rcvURL, stopRcv, err := otlptest.Start("127.0.0.1:0")
	if err != nil {
		return err
	}
	defer stopRcv()

	srv, err := startServer(ctx, cfg, "--otlp-endpoint", rcvURL)
	if err != nil {
		return err
	}
	defer srv.stop()
	raw, err := newRawRunsc(cfg)
	if err != nil {
		return err
	}
	defer raw.cleanup()
	r, err := benchCreate(ctx, srv, raw, n)
	if err != nil {
		return err
	}
	fmt.Fprintln(os.Stderr, "measured the create breakdown")
	// The batch exporter sends within seconds; the server's stop flushes
	// what is left.
	srv.stop()
	spans, _ := rcv.Snapshot()
	creates, parts := partsOf(spans, createRoute)
	execs, _ := partsOf(spans, execRoute)
	kills, killParts := partsOf(spans, killRoute)
	if len(creates) == 0 {
		return fmt.Errorf("no %q span among the %d the server exported", createRoute, len(spans))
	}
	floor := stats(r.floor)[1]
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "create breakdown (spans of POST /api/sandboxes)\tn\tp50\tshare of the create\tvs raw create → exec\t")
	row := func(name string, ds []time.Duration, create time.Duration) {
		p50 := stats(ds)[1]
		fmt.Fprintf(tw, "%s\t%d\t%s\t%.0f%%\t%.2f×\t\n", name, len(ds), ms(p50), 100*float64(p50)/float64(create), float64(p50)/float64(floor))
	}
	create := stats(creates)[1]
	fmt.Fprintf(tw, "raw runsc run → first exec (floor)\t%d\t%s\t\t1.00×\t\n", len(r.floor), ms(floor))
	row("lizard create → first exec (client)", r.lizard, create)
	row(createRoute+" (server)", creates, create)
	under := func(parts map[string][]time.Duration) {
		names := make([]string, 0, len(parts))
		for name := range parts {
			names = append(names, name)
		}
		slices.SortFunc(names, func(a, b string) int { return cmp.Compare(stats(parts[b])[1], stats(parts[a])[1]) })
		for _, name := range names {
			row("  "+name, parts[name], create)
		}
	}
	under(parts)
	if len(execs) > 0 {
		row(execRoute+" (server, the first exec)", execs, create)
	}
	// The client's time holds the kill, as the floor holds runsc's delete.
	if len(kills) > 0 {
		row(killRoute+" (server, the kill)", kills, create)
		under(killParts)
	}
	return tw.Flush()
}
