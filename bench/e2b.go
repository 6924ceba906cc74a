package main

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// e2bOps are the operations bench/e2b.mjs times through each SDK, in the
// order of the table.
var e2bOps = []string{"create → first command", "commands.run('true')", "'true' as E2B runs it (bash -l -c)", "1 MiB write + read", "runCode('1+1')"}

// e2bResult is the samples of each operation through E2B's SDKs and
// through @lizard-build/sdk.
type e2bResult struct {
	e2b, lizard map[string][]time.Duration
}

// benchE2B runs bench/e2b.mjs: the same work through E2B's JS SDKs
// (pointed at this server as the README tells E2B users) and through
// @lizard-build/sdk.
func benchE2B(s *server, n int) (e2bResult, error) {
	out, err := runNode("e2b.mjs", n,
		"E2B_API_URL="+s.url, "E2B_API_KEY="+s.key, "E2B_SANDBOX_URL=http://"+s.proxy,
		"LIZARD_API_URL="+s.url, "LIZARD_API_KEY="+s.key)
	if err != nil {
		return e2bResult{}, err
	}
	var res struct{ E2B, Lizard map[string][]float64 }
	if err := json.Unmarshal(out, &res); err != nil {
		return e2bResult{}, fmt.Errorf("bench/e2b.mjs said %q: %v", out, err)
	}
	durations := func(m map[string][]float64) map[string][]time.Duration {
		d := map[string][]time.Duration{}
		for op, mss := range m {
			for _, v := range mss {
				d[op] = append(d[op], time.Duration(v*float64(time.Millisecond)))
			}
		}
		return d
	}
	r := e2bResult{e2b: durations(res.E2B), lizard: durations(res.Lizard)}
	for _, op := range e2bOps {
		if len(r.e2b[op]) == 0 || len(r.lizard[op]) == 0 {
			return r, fmt.Errorf("bench/e2b.mjs measured no %q", op)
		}
	}
	return r, nil
}

// printE2BTable prints each operation through both SDKs and the ratio of
// their medians (the target: E2B's within 1.2× of lizard's).
func printE2BTable(w io.Writer, r e2bResult) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "E2B SDK vs @lizard-build/sdk\tn\te2b min\tp50\tp95\tlizard min\tp50\tp95\tratio p50\t")
	for _, op := range e2bOps {
		e, l := stats(r.e2b[op]), stats(r.lizard[op])
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%.2fx\t\n", op, len(r.e2b[op]),
			ms(e[0]), ms(e[1]), ms(e[2]), ms(l[0]), ms(l[1]), ms(l[2]), float64(e[1])/float64(l[1]))
	}
	tw.Flush()
}
