package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// volumeResult compares writing to /workspace (a volume) with writing to the
// sandbox's own disk (its overlay).
type volumeResult struct {
	mb               int
	volume, own      []time.Duration
	watch            []time.Duration
	watchUnsupported bool
}

// benchVolume writes mb MiB with dd (fsync at the end) n times to each, and
// measures file-watch latency: a write, then polls of the SDK's
// files/watch/events until the event shows.
func benchVolume(s *server, n, mb int) (volumeResult, error) {
	r := volumeResult{mb: mb}
	var vol struct {
		ID string `json:"id"`
	}
	if err := s.post("/api/projects/default/volumes", map[string]any{"name": "bench", "sizeGb": 5}, &vol); err != nil {
		return r, err
	}
	defer s.call("DELETE", "/api/projects/default/volumes/bench", nil, nil)
	var sb struct {
		SandboxID string `json:"sandboxId"`
	}
	if err := s.post("/api/sandboxes", map[string]any{"template": "base", "volumeId": vol.ID, "timeoutMs": 600000}, &sb); err != nil {
		return r, err
	}
	defer s.kill(sb.SandboxID)
	dd := func(path string) (time.Duration, error) {
		var out struct {
			ExitCode int    `json:"exitCode"`
			Stderr   string `json:"stderr"`
		}
		cmd := fmt.Sprintf("dd if=/dev/zero of=%s bs=1M count=%d conv=fsync 2>&1 >/dev/null; rm -f %s", path, mb, path)
		t := time.Now()
		if err := s.post("/api/sandboxes/"+sb.SandboxID+"/exec", map[string]any{"cmd": cmd}, &out); err != nil {
			return 0, err
		}
		if out.ExitCode != 0 {
			return 0, fmt.Errorf("dd: %s", out.Stderr)
		}
		return time.Since(t), nil
	}
	for range n {
		d, err := dd("/workspace/bench")
		if err != nil {
			return r, err
		}
		r.volume = append(r.volume, d)
		if d, err = dd("/root/bench"); err != nil {
			return r, err
		}
		r.own = append(r.own, d)
	}
	var w struct {
		WatcherID string `json:"watcherId"`
	}
	if err := s.post("/api/sandboxes/"+sb.SandboxID+"/files/watch", map[string]any{"path": "/workspace", "recursive": true}, &w); err != nil {
		r.watchUnsupported = true
		return r, nil
	}
	for i := range n * 3 {
		if err := s.post("/api/sandboxes/"+sb.SandboxID+"/files", map[string]any{"path": fmt.Sprintf("/workspace/w%d", i), "content": "x"}, nil); err != nil {
			return r, err
		}
		t := time.Now()
		for {
			var evs []map[string]any
			if err := s.call("GET", "/api/sandboxes/"+sb.SandboxID+"/files/watch/events?watcherId="+w.WatcherID, nil, &evs); err != nil {
				return r, err
			}
			if len(evs) > 0 {
				break
			}
			if time.Since(t) > 5*time.Second {
				return r, fmt.Errorf("no watch event within 5 s")
			}
		}
		r.watch = append(r.watch, time.Since(t))
	}
	return r, nil
}

func printVolumeTable(w io.Writer, r volumeResult) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "volume\tn\tp50\tMiB/s\t")
	rate := func(ds []time.Duration) string {
		if len(ds) == 0 {
			return "-"
		}
		return fmt.Sprintf("%.0f", float64(r.mb)/stats(ds)[1].Seconds())
	}
	fmt.Fprintf(tw, "%d MiB write + fsync to /workspace (volume)\t%d\t%s\t%s\t\n", r.mb, len(r.volume), ms(stats(r.volume)[1]), rate(r.volume))
	fmt.Fprintf(tw, "%d MiB write + fsync to the sandbox's own disk\t%d\t%s\t%s\t\n", r.mb, len(r.own), ms(stats(r.own)[1]), rate(r.own))
	if !r.watchUnsupported {
		st := stats(r.watch)
		fmt.Fprintf(tw, "watch: write → event seen by a poller (p95 %s)\t%d\t%s\t-\t\n", ms(st[2]), len(r.watch), ms(st[1]))
	}
	tw.Flush()
}
