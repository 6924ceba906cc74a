package main

import (
	"context"
	"fmt"
	"io"

	"github.com/lizard-build/lizard/internal/slowness"
)

// slownessRuns is how many raw creates the slowness factor's median is
// of.
const slownessRuns = 7

// printSlowness measures this machine for the tests (scripts/test.sh
// exports the factor as LIZARD_TEST_SLOWNESS): the median of raw runsc
// create → first exec of the base template (a runsc create, then a runsc
// start, as slowness.Reference was measured; benchCreate's floor is one
// runsc run), after one run that warms the caches, over
// slowness.Reference. The factor
// goes to stdout, what was measured to stderr.
func printSlowness(ctx context.Context, cfg config, stdout, stderr io.Writer) error {
	raw, err := newRawRunsc(cfg)
	if err != nil {
		return err
	}
	defer raw.cleanup()
	once := func() error {
		id, err := raw.launch(ctx, true)
		if id != "" {
			defer raw.destroy(id)
		}
		if err != nil {
			return err
		}
		return raw.exec(ctx, id, nil, "true")
	}
	if err := once(); err != nil {
		return err
	}
	samples, err := timeit(slownessRuns, once)
	if err != nil {
		return err
	}
	st := stats(samples)
	f := slowness.Of(st[1])
	fmt.Fprintf(stderr, "raw runsc create → first exec: median %s of %d (min %s), reference %s: slowness %.2f\n",
		ms(st[1]), len(samples), ms(st[0]), ms(slowness.Reference), f)
	fmt.Fprintf(stdout, "%.2f\n", f)
	return nil
}
