package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// The sleep measurements (issue 27): a wake by traffic through the proxy
// beside a plain resume, and many sandboxes asleep files-only on one node —
// what the host holds for them, and the time to wake one.

// benchSleep runs both on a server of its own (no limit on the number of
// sandboxes), sleepers of them.
func benchSleep(ctx context.Context, cfg config, w io.Writer, n, sleepers int) error {
	s, err := startServer(ctx, cfg, "--max-sandboxes", strconv.Itoa(sleepers+100), "--default-max-sandboxes", "0")
	if err != nil {
		return err
	}
	defer s.stop()
	wake, err := benchWake(s, n)
	if err != nil {
		return fmt.Errorf("wake: %w", err)
	}
	printTable(w, []result{wake})
	fmt.Fprintln(w)
	return benchSleepers(s, w, sleepers)
}

// benchWake: a paused sandbox with autoResume and a server on port 8000,
// exposed; the first byte of a GET through the proxy, which wakes it,
// beside an API resume then the same GET.
func benchWake(s *server, n int) (result, error) {
	r := result{name: "wake on traffic → first byte (memory pause)", note: "floor: POST …/resume, then the same GET through the proxy"}
	var sb struct {
		SandboxID string `json:"sandboxId"`
	}
	if err := s.post("/api/sandboxes", map[string]any{"template": "base", "timeoutMs": 600000, "autoResume": true}, &sb); err != nil {
		return r, err
	}
	id := sb.SandboxID
	defer s.kill(id)
	var out struct {
		ExitCode int `json:"exitCode"`
	}
	start := `mkdir -p /tmp/www && echo hi > /tmp/www/index.html && cd /tmp/www && (nohup python3 -m http.server 8000 >/dev/null 2>&1 &); for i in $(seq 1 200); do curl -s -o /dev/null http://127.0.0.1:8000/ && exit 0; sleep 0.05; done; exit 1`
	if err := s.post("/api/sandboxes/"+id+"/exec", map[string]any{"cmd": start}, &out); err != nil || out.ExitCode != 0 {
		return r, fmt.Errorf("start the server: %v exit %d", err, out.ExitCode)
	}
	var ex struct {
		Hostname    string `json:"hostname"`
		AccessToken string `json:"accessToken"`
	}
	if err := s.post("/api/sandboxes/"+id+"/expose/8000", nil, &ex); err != nil {
		return r, err
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	get := func() error {
		req, _ := http.NewRequest("GET", "http://"+s.proxy+"/index.html", nil)
		req.Host = ex.Hostname
		req.Header.Set("X-Lizard-Access-Token", ex.AccessToken)
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if _, err := resp.Body.Read(make([]byte, 1)); err != nil && err != io.EOF {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET through the proxy: %s", resp.Status)
		}
		return nil
	}
	for range n {
		if err := s.post("/api/sandboxes/"+id+"/pause", nil, nil); err != nil {
			return r, err
		}
		t := time.Now()
		if err := get(); err != nil {
			return r, err
		}
		r.lizard = append(r.lizard, time.Since(t))
		if err := s.post("/api/sandboxes/"+id+"/pause", nil, nil); err != nil {
			return r, err
		}
		t = time.Now()
		if err := s.post("/api/sandboxes/"+id+"/resume", nil, nil); err != nil {
			return r, err
		}
		if err := get(); err != nil {
			return r, err
		}
		r.floor = append(r.floor, time.Since(t))
	}
	return r, nil
}

// benchSleepers creates count sandboxes, pauses each files-only, and
// reports the host's memory in use and its process count before and after,
// the runsc processes left, and the time to wake one (resume → first exec)
// beside a create → first exec.
func benchSleepers(s *server, w io.Writer, count int) error {
	memBefore, procsBefore := hostMemUsed(), hostProcs()
	ids := make([]string, count)
	var mu sync.Mutex
	var firstErr error
	jobs := make(chan int)
	var wg sync.WaitGroup
	began := time.Now()
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				id, err := s.create()
				if err == nil {
					ids[i] = id
					err = s.post("/api/sandboxes/"+id+"/pause", map[string]any{"memory": false}, nil)
				}
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("sandbox %d: %w", i, err)
					}
					mu.Unlock()
				}
			}
		}()
	}
	for i := range count {
		mu.Lock()
		failed := firstErr != nil
		mu.Unlock()
		if failed {
			break
		}
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	made := time.Since(began)
	defer func() {
		for _, id := range ids {
			if id != "" {
				s.kill(id)
			}
		}
	}()
	if firstErr != nil {
		return firstErr
	}
	time.Sleep(2 * time.Second) // the freed memory settles
	memAfter, procsAfter := hostMemUsed(), hostProcs()
	held := 0 // processes that name a sleeping sandbox (runsc's do)
	for _, cmd := range procCmdlines() {
		for _, id := range ids {
			if strings.Contains(cmd, id) {
				held++
				break
			}
		}
	}
	var wake, create []time.Duration
	for i := range 5 {
		id := ids[i*len(ids)/5]
		t := time.Now()
		if err := s.post("/api/sandboxes/"+id+"/resume", nil, nil); err != nil {
			return err
		}
		if err := s.execTrue(id); err != nil {
			return err
		}
		wake = append(wake, time.Since(t))
		t = time.Now()
		cid, err := s.create()
		if err == nil {
			err = s.execTrue(cid)
			s.kill(cid)
		}
		if err != nil {
			return err
		}
		create = append(create, time.Since(t))
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%d sandboxes asleep files-only\tbefore\tasleep\tper sandbox\t\n", count)
	fmt.Fprintf(tw, "host memory in use (MemTotal - MemAvailable)\t%d MiB\t%d MiB\t%.2f MiB\t\n", memBefore>>20, memAfter>>20, float64(memAfter-memBefore)/float64(count)/(1<<20))
	fmt.Fprintf(tw, "host processes\t%d\t%d\t%.3f\t\n", procsBefore, procsAfter, float64(procsAfter-procsBefore)/float64(count))
	fmt.Fprintf(tw, "processes of the sleeping sandboxes\t\t%d\t\t\n", held)
	fmt.Fprintf(tw, "create + files-only pause, 4 at a time (all)\t\t%s\t%s\t\n", made.Round(time.Millisecond), (made / time.Duration(count)).Round(time.Millisecond))
	wp, cp := stats(wake)[1], stats(create)[1]
	fmt.Fprintf(tw, "wake one (resume → first exec), p50 of 5\t\t%s\t%.2fx a create → first exec (%s)\t\n", ms(wp), float64(wp)/float64(cp), ms(cp))
	tw.Flush()
	return nil
}

// hostMemUsed is MemTotal - MemAvailable, in bytes.
func hostMemUsed() int64 {
	b, _ := os.ReadFile("/proc/meminfo")
	var total, avail int64
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "MemTotal:":
			total = v << 10
		case "MemAvailable:":
			avail = v << 10
		}
	}
	return total - avail
}

// hostProcs is the number of processes on the host.
func hostProcs() int { return len(procCmdlines()) }

// procCmdlines are the command lines of the host's processes.
func procCmdlines() []string {
	ents, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		out = append(out, strings.ReplaceAll(string(b), "\x00", " "))
	}
	return out
}
