package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// proxyResult compares requests through the preview proxy with the same
// requests sent straight to the sandbox's address.
type proxyResult struct {
	name                  string
	n                     int
	direct, proxied       []time.Duration
	directWall, proxyWall time.Duration
	bytes                 int64
}

// benchProxy runs the test app (test/e2e/testdata/app.py) in a sandbox and
// loads it with conc concurrent clients, direct and through the proxy.
func benchProxy(s *server) ([]proxyResult, error) {
	id, err := s.create()
	if err != nil {
		return nil, err
	}
	defer s.kill(id)
	app, err := os.ReadFile("test/e2e/testdata/app.py")
	if err != nil {
		return nil, err
	}
	if err := s.post("/api/sandboxes/"+id+"/files", map[string]any{"path": "/tmp/app.py", "content": string(app)}, nil); err != nil {
		return nil, err
	}
	start := `nohup python3 /tmp/app.py 8000 > /tmp/app.log 2>&1 & for i in $(seq 1 100); do curl -s -o /dev/null http://127.0.0.1:8000/ && break; sleep 0.05; done; hostname -I`
	stdout, err := s.output(id, map[string]any{"cmd": start})
	if err != nil {
		return nil, fmt.Errorf("start app: %w", err)
	}
	addr := strings.TrimSpace(stdout)
	var ex struct {
		Hostname    string `json:"hostname"`
		AccessToken string `json:"accessToken"`
	}
	if err := s.post("/api/sandboxes/"+id+"/expose/8000", nil, &ex); err != nil {
		return nil, err
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	var rs []proxyResult
	for _, c := range []struct {
		name, path string
		n          int
		size       int64
	}{{"small response", "/page", 1000, 0}, {"1 MiB response", "/mib", 200, 1 << 20}} {
		r := proxyResult{name: c.name, n: c.n, bytes: c.size}
		var err error
		if r.direct, r.directWall, err = load(client, "http://"+addr+":8000"+c.path, "", "", c.n); err != nil {
			return nil, err
		}
		if r.proxied, r.proxyWall, err = load(client, "http://"+s.proxy+c.path, ex.Hostname, ex.AccessToken, c.n); err != nil {
			return nil, err
		}
		rs = append(rs, r)
	}
	return rs, nil
}

// load sends n GETs from 8 concurrent clients and returns each latency and
// the wall time.
func load(c *http.Client, url, host, token string, n int) ([]time.Duration, time.Duration, error) {
	const conc = 8
	lat := make([]time.Duration, 0, n)
	var mu sync.Mutex
	var firstErr error
	jobs := make(chan struct{}, n)
	for range n {
		jobs <- struct{}{}
	}
	close(jobs)
	start := time.Now()
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range jobs {
				req, _ := http.NewRequest("GET", url, nil)
				if host != "" {
					req.Host = host
					req.Header.Set("X-Lizard-Access-Token", token)
				}
				t := time.Now()
				resp, err := c.Do(req)
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						err = fmt.Errorf("%s: %s", url, resp.Status)
					}
				}
				d := time.Since(t)
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				lat = append(lat, d)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return lat, time.Since(start), firstErr
}

func printProxyTable(w io.Writer, rs []proxyResult) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "preview proxy (8 clients)\tn\tdirect req/s\tproxy req/s\tthroughput ratio\tdirect p50\tproxy p50\tdirect p99\tproxy p99\tadded p99\t")
	for _, r := range rs {
		d, p := pct(r.direct), pct(r.proxied)
		dr := float64(r.n) / r.directWall.Seconds()
		pr := float64(r.n) / r.proxyWall.Seconds()
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%.0f\t%.2fx\t%s\t%s\t%s\t%s\t%s\t\n", r.name, r.n, dr, pr, pr/dr,
			ms(d[0]), ms(p[0]), ms(d[1]), ms(p[1]), ms(p[1]-d[1]))
	}
	tw.Flush()
}

// pct returns the median and the 99th percentile.
func pct(ds []time.Duration) [2]time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	if len(s) == 0 {
		return [2]time.Duration{}
	}
	return [2]time.Duration{s[len(s)/2], s[min(len(s)-1, len(s)*99/100)]}
}
