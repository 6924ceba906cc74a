package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/lizard-build/lizard/internal/tracing/otlptest"
)

// The tracing measurement: the exec round trip (POST …/exec of `true`)
// on a server with tracing off, then on one exporting every span over
// OTLP/HTTP to a receiver of the bench's own on loopback (otlptest, which
// decodes what it gets), and the ratio of their medians.

func benchTracing(ctx context.Context, cfg config, w io.Writer, n int) error {
	rcv, rcvURL, stopRcv, err := otlptest.Start("127.0.0.1:0")
	if err != nil {
		return err
	}
	defer stopRcv()

	measure := func(extra ...string) ([]time.Duration, error) {
		srv, err := startServer(ctx, cfg, extra...)
		if err != nil {
			return nil, err
		}
		defer srv.stop()
		id, err := srv.create()
		if err != nil {
			return nil, err
		}
		defer srv.kill(id)
		// A few first: connections and the agent warm.
		if _, err := timeit(5, func() error { return srv.execTrue(id) }); err != nil {
			return nil, err
		}
		return timeit(n, func() error { return srv.execTrue(id) })
	}
	off, err := measure()
	if err != nil {
		return fmt.Errorf("tracing off: %w", err)
	}
	fmt.Fprintln(os.Stderr, "measured exec with tracing off")
	on, err := measure("--otlp-endpoint", rcvURL)
	if err != nil {
		return fmt.Errorf("tracing on: %w", err)
	}
	fmt.Fprintln(os.Stderr, "measured exec with tracing on")
	so, sn := stats(off), stats(on)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "exec true round trip\tn\tmin\tp50\tp95\t")
	fmt.Fprintf(tw, "tracing off\t%d\t%s\t%s\t%s\t\n", len(off), ms(so[0]), ms(so[1]), ms(so[2]))
	fmt.Fprintf(tw, "tracing on (OTLP/HTTP, loopback)\t%d\t%s\t%s\t%s\t\n", len(on), ms(sn[0]), ms(sn[1]), ms(sn[2]))
	tw.Flush()
	_, exports := rcv.Snapshot()
	bytes := 0
	for _, b := range exports {
		bytes += len(b)
	}
	fmt.Fprintf(w, "on/off (p50): %.3f; the receiver got %d exports, %d bytes\n", float64(sn[1])/float64(so[1]), len(exports), bytes)
	return nil
}
