package e2e

import (
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// The slowest tests of a run, printed at its end (TestMain): what
// scripts/test.sh weighs when it shares the tests between its streams.
var times struct {
	mu    sync.Mutex
	start map[string]time.Time     // top-level test → its first server
	took  map[string]time.Duration // top-level test → from then to its end
}

// timeTest times t's top-level test from its first server to its end.
func timeTest(t *testing.T) {
	name, _, _ := strings.Cut(t.Name(), "/")
	times.mu.Lock()
	defer times.mu.Unlock()
	if times.start == nil {
		times.start, times.took = map[string]time.Time{}, map[string]time.Duration{}
	}
	start, ok := times.start[name]
	if !ok {
		start = time.Now()
		times.start[name] = start
	}
	t.Cleanup(func() {
		times.mu.Lock()
		defer times.mu.Unlock()
		times.took[name] = max(times.took[name], time.Since(start))
	})
}

// slowest is the n slowest tests timed, with their times; "" when none
// was.
func slowest(n int) string {
	times.mu.Lock()
	defer times.mu.Unlock()
	names := make([]string, 0, len(times.took))
	for name := range times.took {
		names = append(names, name)
	}
	sort.Slice(names, func(i, j int) bool { return times.took[names[i]] > times.took[names[j]] })
	var total time.Duration
	for _, d := range times.took {
		total += d
	}
	if len(names) == 0 {
		return ""
	}
	parts := make([]string, 0, n)
	for _, name := range names[:min(n, len(names))] {
		parts = append(parts, fmt.Sprintf("%s %.0fs", name, times.took[name].Seconds()))
	}
	return fmt.Sprintf("e2e: slowest tests (of %d, %.0fs in all): %s", len(names), total.Seconds(), strings.Join(parts, ", "))
}

// appendLine appends line to file.
func appendLine(file, line string) error {
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintln(f, line); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
