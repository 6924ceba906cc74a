package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"text/tabwriter"
	"time"
)

// codeResult is CodeSandbox on the interpreter template, through the
// official SDK (bench/code.mjs), and a Dockerfile rebuild with a warm cache.
type codeResult struct {
	created, roundTrips []time.Duration
	rebuild             []time.Duration
}

func benchCode(s *server, cfg config, n int) (codeResult, error) {
	var r codeResult
	// Node resolves the SDK's bare import from the script's directory up:
	// run a copy of the script beside the end-to-end tests' node_modules.
	b, err := os.ReadFile("bench/code.mjs")
	if err != nil {
		return r, err
	}
	local, err := filepath.Abs("test/e2e/.bench-code.mjs")
	if err != nil {
		return r, err
	}
	if err := os.WriteFile(local, b, 0o644); err != nil {
		return r, err
	}
	defer os.Remove(local)
	cmd := exec.Command("node", local, fmt.Sprint(n))
	cmd.Env = append(os.Environ(), "LIZARD_API_URL="+s.url, "LIZARD_API_KEY="+s.key)
	out, err := cmd.Output()
	if err != nil {
		return r, fmt.Errorf("bench/code.mjs: %v (run `npm install` in test/e2e)", err)
	}
	var res struct{ Created, RoundTrips []float64 }
	if err := json.Unmarshal(out, &res); err != nil {
		return r, fmt.Errorf("bench/code.mjs said %q: %v", out, err)
	}
	for _, ms := range res.Created {
		r.created = append(r.created, time.Duration(ms*float64(time.Millisecond)))
	}
	for _, ms := range res.RoundTrips {
		r.roundTrips = append(r.roundTrips, time.Duration(ms*float64(time.Millisecond)))
	}
	// A Dockerfile rebuild with every step cached.
	name := fmt.Sprintf("bench-df-%d", time.Now().UnixNano()%1e6)
	defer os.RemoveAll(filepath.Join(cfg.templateDir, name))
	for i := range 4 {
		t := time.Now()
		b := exec.Command(filepath.Join(s.dir, "lizard"), "template", "build", name, "-f", "test/e2e/testdata/custom/Dockerfile",
			"test/e2e/testdata/custom", "--template-dir", cfg.templateDir, "--runsc", cfg.runsc)
		if out, err := b.CombinedOutput(); err != nil {
			return r, fmt.Errorf("template build: %v %s", err, out)
		}
		if i > 0 {
			r.rebuild = append(r.rebuild, time.Since(t))
		}
	}
	return r, nil
}

func printCodeTable(w io.Writer, r codeResult) {
	printStatsTable(w, "templates", []statsRow{
		{"CodeSandbox.create → first runCode (interpreter)", r.created},
		{"runCode('1+1') round trip", r.roundTrips},
		{"Dockerfile rebuild, every step cached", r.rebuild},
	})
}

// statsRow is one measured operation of a min/p50/p95 table.
type statsRow struct {
	name string
	ds   []time.Duration
}

// printStatsTable prints rows as n, min, p50 and p95 under title.
func printStatsTable(w io.Writer, title string, rows []statsRow) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%s\tn\tmin\tp50\tp95\t\n", title)
	for _, row := range rows {
		st := stats(row.ds)
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t\n", row.name, len(row.ds), ms(st[0]), ms(st[1]), ms(st[2]))
	}
	return tw.Flush()
}
