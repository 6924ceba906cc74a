package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape fetches url and parses it with Prometheus's text parser.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("scrape %s: %d %s", url, resp.StatusCode, b)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse %s: %v", url, err)
	}
	return fams
}

// find returns the metric of family name whose labels include want.
func find(fams map[string]*dto.MetricFamily, name string, want map[string]string) *dto.Metric {
	f := fams[name]
	if f == nil {
		return nil
	}
next:
	for _, m := range f.GetMetric() {
		for k, v := range want {
			found := false
			for _, l := range m.GetLabel() {
				if l.GetName() == k && l.GetValue() == v {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		return m
	}
	return nil
}

// histogramCount is the _count of a histogram series, 0 when absent.
func histogramCount(fams map[string]*dto.MetricFamily, name string, labels map[string]string) uint64 {
	m := find(fams, name, labels)
	if m == nil {
		return 0
	}
	return m.GetHistogram().GetSampleCount()
}

// value is a counter's or gauge's value, -1 when absent.
func value(fams map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	m := find(fams, name, labels)
	switch {
	case m == nil:
		return -1
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	default:
		return m.GetGauge().GetValue()
	}
}

type usagePoint struct {
	Timestamp     string  `json:"timestamp"`
	TimestampUnix int64   `json:"timestampUnix"`
	CPUCount      float64 `json:"cpuCount"`
	CPUUsedPct    float64 `json:"cpuUsedPct"`
	MemUsed       int64   `json:"memUsed"`
	MemTotal      int64   `json:"memTotal"`
	DiskUsed      int64   `json:"diskUsed"`
	DiskTotal     int64   `json:"diskTotal"`
	NetRxBytes    uint64  `json:"netRxBytes"`
	NetTxBytes    uint64  `json:"netTxBytes"`
}

// TestMetrics runs a scripted workload through HTTP, then scrapes
// --metrics-listen and checks that the counts and histogram totals are
// what was done, that no label carries an id, and that the sandboxes'
// usage samples saw a CPU burner.
func TestMetrics(t *testing.T) {
	metricsAddr := freeAddr(t)
	s := startServer(t, "", "--metrics-listen", metricsAddr, "--usage-interval", "1s")
	metricsURL := "http://" + metricsAddr + "/metrics"

	const creates, execs = 2, 3
	var ids []string
	for range creates {
		var info sandboxInfo
		if code, body := s.do("POST", "/api/sandboxes", map[string]any{"template": "base", "timeoutMs": 300000}, &info); code != http.StatusCreated {
			t.Fatalf("create: %d %s", code, body)
		}
		ids = append(ids, info.SandboxID)
		defer s.do("DELETE", "/api/sandboxes/"+info.SandboxID, nil, nil)
	}
	for i := range execs {
		var out execReply
		if code, body := s.do("POST", "/api/sandboxes/"+ids[i%creates]+"/exec", map[string]any{"cmd": fmt.Sprintf("echo %d", i)}, &out); code != 200 || out.Stdout != fmt.Sprintf("%d\n", i) {
			t.Fatalf("exec %d: %d %s", i, code, body)
		}
	}
	// A failed exec counts with its class: the sandbox is unknown.
	if code, body := s.do("POST", "/api/sandboxes/nosuchsandbox/exec", map[string]any{"cmd": "true"}, nil); code != http.StatusNotFound {
		t.Fatalf("exec in an unknown sandbox: %d %s, want 404", code, body)
	}
	if code, body := s.do("POST", "/api/sandboxes/"+ids[1]+"/pause", nil, nil); code >= 300 {
		t.Fatalf("pause: %d %s", code, body)
	}
	if code, body := s.do("POST", "/api/sandboxes/"+ids[1]+"/resume", nil, nil); code >= 300 {
		t.Fatalf("resume: %d %s", code, body)
	}

	// A CPU burner: the usage samples (every second here) must see it.
	var burn execReply
	if code, body := s.do("POST", "/api/sandboxes/"+ids[0]+"/exec", map[string]any{"cmd": "timeout 4 sh -c 'while :; do :; done'; echo burnt"}, &burn); code != 200 || burn.Stdout != "burnt\n" {
		t.Fatalf("burner: %d %s", code, body)
	}
	var points []usagePoint
	var busy *usagePoint
	for deadline := time.Now().Add(budget(20 * time.Second)); busy == nil && time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		if code, body := s.do("GET", "/api/sandboxes/"+ids[0]+"/metrics", nil, &points); code != 200 {
			t.Fatalf("sandbox metrics: %d %s", code, body)
		}
		for i, p := range points {
			if p.CPUUsedPct > 10 { // one busy thread is 25% of a medium sandbox
				busy = &points[i]
			}
		}
	}
	if busy == nil {
		t.Fatalf("no usage sample saw the CPU burner: %+v", points)
	}
	last := points[len(points)-1]
	t.Logf("busy sample %+v, last %+v", *busy, last)
	if last.MemUsed <= 0 || last.MemTotal != 8192<<20 || last.CPUCount != 4 || last.DiskTotal <= 0 || last.TimestampUnix <= 0 {
		t.Fatalf("last sample of a medium sandbox: %+v", last)
	}
	if ts, err := time.Parse(time.RFC3339, last.Timestamp); err != nil || ts.Unix() != last.TimestampUnix {
		t.Fatalf("timestamp %q does not match timestampUnix %d: %v", last.Timestamp, last.TimestampUnix, err)
	}
	// The window filters: one that ends before the sandbox was made is empty.
	var none []usagePoint
	if code, body := s.do("GET", fmt.Sprintf("/api/sandboxes/%s/metrics?start=0&end=%d", ids[0], busy.TimestampUnix-3600), nil, &none); code != 200 || len(none) != 0 {
		t.Fatalf("metrics of a window before the sandbox: %d %s", code, body)
	}
	var since []usagePoint
	if code, body := s.do("GET", fmt.Sprintf("/api/sandboxes/%s/metrics?start=%d", ids[0], busy.TimestampUnix), nil, &since); code != 200 || len(since) == 0 || since[0].TimestampUnix < busy.TimestampUnix {
		t.Fatalf("metrics since the busy sample: %d %s", code, body)
	}
	if code, body := s.do("GET", "/api/sandboxes/"+ids[0]+"/metrics?start=yesterday", nil, nil); code != http.StatusBadRequest || !strings.Contains(string(body), "start") {
		t.Fatalf("start=yesterday: %d %s, want 400 naming start", code, body)
	}
	if code, body := s.do("GET", "/api/sandboxes/"+ids[0]+"/metrics?start=20&end=10", nil, nil); code != http.StatusBadRequest {
		t.Fatalf("end before start: %d %s, want 400", code, body)
	}
	// Disk: what the sandbox writes lands in its overlay's file.
	if code, body := s.do("POST", "/api/sandboxes/"+ids[0]+"/exec", map[string]any{"cmd": "head -c 30000000 /dev/urandom > /root/big && sync"}, nil); code != 200 {
		t.Fatalf("write 30 MB: %d %s", code, body)
	}
	var disk int64
	for deadline := time.Now().Add(budget(20 * time.Second)); disk < 30e6 && time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		if code, body := s.do("GET", "/api/sandboxes/"+ids[0]+"/metrics", nil, &points); code != 200 || len(points) == 0 {
			t.Fatalf("sandbox metrics: %d %s", code, body)
		}
		disk = points[len(points)-1].DiskUsed
	}
	if disk < 30e6 {
		t.Fatalf("diskUsed %d after writing 30 MB", disk)
	}
	var info struct {
		Metrics *usagePoint `json:"metrics"`
	}
	if code, body := s.do("GET", "/api/sandboxes/"+ids[0], nil, &info); code != 200 || info.Metrics == nil || info.Metrics.MemUsed <= 0 {
		t.Fatalf("getInfo has no latest sample: %d %s", code, body)
	}

	// A request id is echoed; one that is not sane is replaced.
	req, _ := http.NewRequest("GET", s.url+"/api/sandboxes/"+ids[0], nil)
	req.Header.Set("X-API-Key", s.key)
	req.Header.Set("X-Request-Id", "e2e-req-42")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.Header.Get("X-Request-Id"); got != "e2e-req-42" {
		t.Fatalf("X-Request-Id echoed as %q", got)
	}
	req.Header.Set("X-Request-Id", "no spaces or \"quotes\" please")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.Header.Get("X-Request-Id"); len(got) != 32 || strings.Contains(got, " ") {
		t.Fatalf("an insane X-Request-Id came back as %q, want a fresh one", got)
	}

	// The preview proxy counts what it refuses (an unknown host is refused
	// like a wrong token).
	preq, _ := http.NewRequest("GET", "http://"+s.proxy+"/", nil)
	preq.Host = "not-a-preview.example"
	if presp, err := http.DefaultClient.Do(preq); err != nil {
		t.Fatal(err)
	} else {
		presp.Body.Close()
	}

	// Scrape while both run: state gauges and reservations.
	fams := scrape(t, metricsURL)
	if v := value(fams, "lizard_sandboxes", map[string]string{"state": "running", "template": "base"}); v != creates {
		t.Errorf("lizard_sandboxes{running,base} = %v, want %d", v, creates)
	}
	if v := value(fams, "lizard_node_reserved_cpus", nil); v != 4*creates {
		t.Errorf("lizard_node_reserved_cpus = %v, want %d (medium sandboxes)", v, 4*creates)
	}
	if v := value(fams, "lizard_node_reserved_memory_bytes", nil); v != float64(creates*8192<<20) {
		t.Errorf("lizard_node_reserved_memory_bytes = %v", v)
	}
	for _, name := range []string{"lizard_node_cpus", "lizard_node_memory_bytes", "lizard_data_dir_filesystem_available_bytes"} {
		if v := value(fams, name, nil); v <= 0 {
			t.Errorf("%s = %v", name, v)
		}
	}
	if v := value(fams, "lizard_data_dir_filesystem_bytes", map[string]string{"kind": "used"}); v <= 0 {
		t.Errorf("lizard_data_dir_filesystem_bytes{used} = %v", v)
	}
	if n := histogramCount(fams, "lizard_agent_round_trip_seconds", nil); n == 0 {
		t.Error("no agent round trip measured")
	}

	for _, id := range ids {
		if code, body := s.do("DELETE", "/api/sandboxes/"+id, nil, nil); code >= 300 {
			t.Fatalf("kill: %d %s", code, body)
		}
	}
	fams = scrape(t, metricsURL)
	const op = "lizard_sandbox_operation_duration_seconds"
	for _, c := range []struct {
		op, outcome string
		want        uint64
	}{
		{"create", "ok", creates},
		{"exec", "ok", execs + 2},
		{"exec", "not_found", 1},
		{"pause", "ok", 1},
		{"resume", "ok", 1},
		{"kill", "ok", creates},
		{"snapshot", "ok", 0},
	} {
		if n := histogramCount(fams, op, map[string]string{"operation": c.op, "outcome": c.outcome}); n != c.want {
			t.Errorf("%s{operation=%q,outcome=%q} count = %d, want %d", op, c.op, c.outcome, n, c.want)
		}
	}
	for _, c := range []struct {
		route, status string
		want          float64
	}{
		{"POST /api/sandboxes", "201", creates},
		{"POST /api/sandboxes/{id}/exec", "200", execs + 2},
		{"POST /api/sandboxes/{id}/exec", "404", 1},
		{"POST /api/sandboxes/{id}/pause", "200", 1},
		{"DELETE /api/sandboxes/{id}", "204", creates},
	} {
		if v := value(fams, "lizard_api_requests_total", map[string]string{"route": c.route, "status": c.status}); v != c.want {
			t.Errorf("lizard_api_requests_total{route=%q,status=%q} = %v, want %v", c.route, c.status, v, c.want)
		}
	}
	if n := histogramCount(fams, "lizard_api_request_duration_seconds", map[string]string{"route": "POST /api/sandboxes"}); n != creates {
		t.Errorf("lizard_api_request_duration_seconds{POST /api/sandboxes} count = %d, want %d", n, creates)
	}
	if v := value(fams, "lizard_proxy_requests_total", map[string]string{"outcome": "unauthorized"}); v != 1 {
		t.Errorf("lizard_proxy_requests_total{unauthorized} = %v, want 1", v)
	}
	if v := value(fams, "lizard_sandboxes", map[string]string{"state": "running"}); v != -1 {
		t.Errorf("lizard_sandboxes{running} = %v after every kill, want no series", v)
	}
	// Bounded labels: no series names a sandbox.
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				for _, id := range append(ids, "nosuchsandbox") {
					if strings.Contains(l.GetValue(), id) {
						t.Errorf("%s has label %s=%q naming a sandbox", name, l.GetName(), l.GetValue())
					}
				}
			}
		}
	}
	// With --metrics-listen the API listener does not serve them.
	if resp, err := http.Get(s.url + "/metrics"); err != nil {
		t.Fatal(err)
	} else if resp.Body.Close(); resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /metrics on the API listener with --metrics-listen: %d, want 404", resp.StatusCode)
	}

	// The request log: one line per request with the route, the project and
	// the request id, and never the key.
	// (The first start prints the key it created, once, before serving.)
	logs := s.logs()
	if _, served, ok := strings.Cut(logs, `msg="lizard serving"`); !ok || strings.Contains(served, s.key) {
		t.Error("the API key is in the server's log")
	}
	found := false
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, "msg=request") && strings.Contains(line, "request_id=e2e-req-42") {
			found = true
			for _, want := range []string{`method=GET`, `route="GET /api/sandboxes/{id}"`, "status=200", "bytes=", "duration_ms=", "project="} {
				if !strings.Contains(line, want) {
					t.Errorf("request log line %q lacks %s", line, want)
				}
			}
			if strings.Contains(line, "project= ") {
				t.Errorf("request log line %q has no project", line)
			}
		}
	}
	if !found {
		t.Errorf("no request log line with request_id=e2e-req-42 in:\n%s", logs)
	}
	s.waitNoLeaks(t)
}

// TestHealth checks /healthz and /readyz, and /readyz under a store whose
// database file was moved away underneath the server, and back.
func TestHealth(t *testing.T) {
	s := startServer(t, "")
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(s.url + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("/healthz: %d %q", code, body)
	}
	if code, body := get("/readyz"); code != 200 || body != "ok\n" {
		t.Fatalf("/readyz: %d %q", code, body)
	}
	// Without --metrics-listen the API listener serves the metrics, unauthenticated.
	fams := scrape(t, s.url+"/metrics")
	if _, ok := fams["lizard_node_cpus"]; !ok {
		t.Fatal("no lizard_node_cpus on the API listener's /metrics")
	}

	db := filepath.Join(s.dataDir, "lizard.db")
	if err := os.Rename(db, db+".away"); err != nil {
		t.Fatal(err)
	}
	moved := true
	defer func() {
		if moved {
			os.Rename(db+".away", db)
		}
	}()
	if code, body := get("/readyz"); code != http.StatusServiceUnavailable || body != "not ready\n" {
		t.Fatalf("/readyz with the database moved away: %d %q, want 503 \"not ready\"", code, body)
	}
	if code, body := get("/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("/healthz with the database moved away: %d %q, want 200", code, body)
	}
	if !strings.Contains(s.logs(), "not ready") || !strings.Contains(s.logs(), "store:") {
		t.Errorf("the log does not say why it is not ready:\n%s", s.logs())
	}
	if err := os.Rename(db+".away", db); err != nil {
		t.Fatal(err)
	}
	moved = false
	if code, body := get("/readyz"); code != 200 || body != "ok\n" {
		t.Fatalf("/readyz with the database back: %d %q", code, body)
	}
}
