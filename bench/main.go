// Command bench measures lizard against the floor of raw runsc doing the same
// work, and prints a table (min, median, p95 over N runs, and the ratio of
// medians). It starts its own `lizard serve` on a scratch data directory.
//
//	go run ./bench [-n 20] [-runsc PATH] [-template-dir DIR] [-only core,pool,checkpoints,restart,proxy,volume,desktop,templates,e2b,egress,durable,tmplfetch,cluster,tracing,createparts,sleep,density] [-sleepers 1000]
//
// With -slowness it measures only raw runsc's create → first exec and
// prints this machine's slowness factor for the tests (internal/slowness;
// scripts/test.sh runs it).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var cfg config
	flag.IntVar(&cfg.n, "n", 20, "runs per measurement")
	flag.StringVar(&cfg.runsc, "runsc", os.Getenv("LIZARD_RUNSC"), "runsc binary (default: runsc in PATH)")
	flag.StringVar(&cfg.templateDir, "template-dir", envOr("LIZARD_TEMPLATE_DIR", "/var/cache/lizard/templates"), "template cache")
	flag.StringVar(&cfg.only, "only", "", "measure only these sections, comma-separated: "+strings.Join(sections, ", "))
	flag.StringVar(&cfg.bridge, "bridge", "lizardb0", "the bench server's sandbox bridge")
	flag.StringVar(&cfg.subnet, "subnet", "10.254.0.0/16", "the bench server's sandbox subnet")
	flag.IntVar(&cfg.sleepers, "sleepers", 1000, "sandboxes the sleep section puts to sleep files-only at once")
	flag.BoolVar(&cfg.slowness, "slowness", false, "print only this machine's slowness factor for the tests: raw runsc create → first exec over the reference machine's (internal/slowness), at least 1")
	flag.Parse()
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
