package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lizard-build/lizard/internal/network"
	"github.com/lizard-build/lizard/internal/objstore"
	"github.com/lizard-build/lizard/internal/runtime/gvisor"
)

type config struct {
	n           int
	runsc       string
	templateDir string
	// only names the sections to run (comma-separated); "" runs them all.
	only string
	// bridge and subnet are the bench server's sandbox network, apart from
	// any other server's on the host.
	bridge, subnet string
	// slowness: measure only the tests' slowness factor (printSlowness).
	slowness bool
	// sleepers is how many sandboxes the sleep section puts to sleep.
	sleepers int
}

// sections are what -only chooses from.
var sections = []string{"core", "pool", "checkpoints", "restart", "proxy", "volume", "desktop", "templates", "e2b", "egress", "durable", "tmplfetch", "cluster", "tracing", "createparts", "sleep", "density"}

// runs reports whether section is to be measured.
func (c config) runs(section string) bool {
	if c.only == "" {
		return true
	}
	for _, s := range strings.Split(c.only, ",") {
		if strings.TrimSpace(s) == section {
			return true
		}
	}
	return false
}

// result is one measured operation: lizard's samples and raw runsc's.
type result struct {
	name          string
	lizard, floor []time.Duration
	note          string
}

func run(ctx context.Context, cfg config) error {
	if cfg.runsc == "" {
		p, err := exec.LookPath("runsc")
		if err != nil {
			return fmt.Errorf("runsc not found: %w", err)
		}
		cfg.runsc = p
	}
	if cfg.slowness {
		return printSlowness(ctx, cfg, os.Stdout, os.Stderr)
	}
	if cfg.only == "cluster" {
		// A cluster of its own: no single-node server beside it.
		return benchClusterSection(ctx, cfg, os.Stdout, cfg.n)
	}
	if cfg.only == "tracing" {
		// Servers of its own, one with tracing off, one on.
		return benchTracing(ctx, cfg, os.Stdout, cfg.n*5)
	}
	srv, err := startServer(ctx, cfg)
	if err != nil {
		return err
	}
	defer srv.stop()
	raw, err := newRawRunsc(cfg)
	if err != nil {
		return err
	}
	defer raw.cleanup()

	var results []result
	add := func(r result, err error) error {
		if err != nil {
			return fmt.Errorf("%s: %w", r.name, err)
		}
		results = append(results, r)
		fmt.Fprintf(os.Stderr, "measured %s\n", r.name)
		return nil
	}
	if cfg.runs("core") {
		if err := add(benchCreate(ctx, srv, raw, cfg.n)); err != nil {
			return err
		}
		if err := add(benchExec(ctx, srv, raw, cfg.n*5)); err != nil {
			return err
		}
		if err := add(benchFiles(ctx, srv, raw, cfg.n)); err != nil {
			return err
		}
		if err := add(benchConcurrent(ctx, srv, raw, 20)); err != nil {
			return err
		}
	}
	if cfg.runs("pool") {
		rs, err := benchPool(ctx, srv, raw, cfg.n)
		if err != nil {
			return fmt.Errorf("pool: %w", err)
		}
		results = append(results, rs...)
		fmt.Fprintln(os.Stderr, "measured the template pool")
	}
	for _, big := range []bool{false, true} {
		if !cfg.runs("checkpoints") {
			break
		}
		n := cfg.n / 2
		if big {
			n = max(3, cfg.n/5)
		}
		rs, err := benchCheckpoints(ctx, srv, raw, n, big)
		if err != nil {
			return fmt.Errorf("checkpoints: %w", err)
		}
		for _, r := range rs {
			fmt.Fprintf(os.Stderr, "measured %s\n", r.name)
		}
		results = append(results, rs...)
	}
	if cfg.runs("restart") {
		if err := add(benchRestart(srv, max(3, cfg.n/5), 30)); err != nil {
			return err
		}
	}
	if len(results) > 0 {
		printTable(os.Stdout, results)
	}
	if cfg.runs("density") {
		fmt.Println()
		if err := benchDensity(ctx, os.Stdout, srv, raw, max(3, cfg.n/4)); err != nil {
			return fmt.Errorf("density: %w", err)
		}
	}
	if cfg.runs("proxy") {
		prs, err := benchProxy(srv)
		if err != nil {
			return fmt.Errorf("proxy: %w", err)
		}
		fmt.Println()
		printProxyTable(os.Stdout, prs)
	}
	if cfg.runs("volume") {
		vr, err := benchVolume(srv, 3, 256)
		if err != nil {
			return fmt.Errorf("volume: %w", err)
		}
		fmt.Println()
		printVolumeTable(os.Stdout, vr)
	}
	if cfg.runs("desktop") {
		fmt.Println()
		if err := benchDesktopTable(os.Stdout, srv, max(2, cfg.n/4)); err != nil {
			return fmt.Errorf("desktop: %w", err)
		}
	}
	if cfg.runs("templates") {
		cr, err := benchCode(srv, cfg, cfg.n)
		if err != nil {
			return fmt.Errorf("templates: %w", err)
		}
		fmt.Println()
		printCodeTable(os.Stdout, cr)
	}
	if cfg.runs("e2b") {
		er, err := benchE2B(srv, cfg.n)
		if err != nil {
			return fmt.Errorf("e2b: %w", err)
		}
		fmt.Println()
		printE2BTable(os.Stdout, er)
	}
	if cfg.runs("egress") {
		// A server of its own, told of the bench's fake internet.
		srv.stop()
		fmt.Println()
		if err := benchEgress(ctx, cfg, os.Stdout, cfg.n); err != nil {
			return fmt.Errorf("egress: %w", err)
		}
	}
	if cfg.runs("durable") {
		// A server of its own, with an object store, on the same bridge:
		// the first one goes first.
		srv.stop()
		fmt.Println()
		if err := benchDurable(ctx, cfg, os.Stdout, max(3, cfg.n/4)); err != nil {
			return fmt.Errorf("durable: %w", err)
		}
	}
	if cfg.runs("tmplfetch") {
		srv.stop()
		fmt.Println()
		err := withObjectStore(ctx, cfg, func(srv *server, st objstore.Store) error {
			return benchTemplateFetch(os.Stdout, srv, st, max(3, cfg.n/4))
		})
		if err != nil {
			return fmt.Errorf("tmplfetch: %w", err)
		}
	}
	if cfg.runs("tracing") {
		srv.stop()
		fmt.Println()
		if err := benchTracing(ctx, cfg, os.Stdout, cfg.n*5); err != nil {
			return fmt.Errorf("tracing: %w", err)
		}
	}
	if cfg.runs("createparts") {
		// A server of its own, exporting its spans to the bench.
		srv.stop()
		fmt.Println()
		if err := benchCreateParts(ctx, cfg, os.Stdout, cfg.n); err != nil {
			return fmt.Errorf("createparts: %w", err)
		}
	}
	if cfg.runs("sleep") {
		srv.stop()
		fmt.Println()
		if err := benchSleep(ctx, cfg, os.Stdout, max(3, cfg.n/2), cfg.sleepers); err != nil {
			return fmt.Errorf("sleep: %w", err)
		}
	}
	if cfg.runs("cluster") {
		srv.stop()
		fmt.Println()
		if err := benchClusterSection(ctx, cfg, os.Stdout, cfg.n); err != nil {
			return fmt.Errorf("cluster: %w", err)
		}
	}
	return nil
}

func printTable(w io.Writer, rs []result) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "operation\tn\tlizard min\tp50\tp95\trunsc min\tp50\tp95\tratio p50\t")
	for _, r := range rs {
		l, f := stats(r.lizard), stats(r.floor)
		ratio := float64(l[1]) / float64(f[1])
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%.2fx\t\n", r.name, len(r.lizard),
			ms(l[0]), ms(l[1]), ms(l[2]), ms(f[0]), ms(f[1]), ms(f[2]), ratio)
	}
	tw.Flush()
	for _, r := range rs {
		if r.note != "" {
			fmt.Fprintf(w, "%s: %s\n", r.name, r.note)
		}
	}
}

// stats returns min, median and p95 (of durations, or of byte counts).
func stats[T ~int64](ds []T) [3]T {
	s := append([]T(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	if len(s) == 0 {
		return [3]T{}
	}
	p := func(q float64) T { return s[int(q*float64(len(s)-1)+0.5)] }
	return [3]T{s[0], p(0.5), p(0.95)}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000) }

// --- lizard side ---

type server struct {
	dir     string
	proxy   string // host:port of the preview proxy
	cmd     *exec.Cmd
	args    []string      // of lizard, for restarts
	exited  chan struct{} // closed once cmd is waited for
	url     string
	key     string
	dataDir string
	bridge  string // its sandboxes' bridge, removed by stop
	client  *http.Client

	templateDir string
}

func startServer(ctx context.Context, cfg config, extra ...string) (*server, error) {
	dir, err := os.MkdirTemp("", "lizard-bench-")
	if err != nil {
		return nil, err
	}
	if err := buildLizard(dir); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	proxyAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	s := &server{dir: dir, proxy: proxyAddr, url: "http://" + addr, key: "lz_bench_key_0123456789abcdef", dataDir: filepath.Join(dir, "data"), templateDir: cfg.templateDir, bridge: cfg.bridge,
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
	// A subnet and bridge of the bench's own: the tests' servers use
	// 10.250-10.253 (and may leave their bridges behind). No admission
	// limits: 20 concurrent creates of the default size (8 GiB each)
	// reserve more than this node and the default project may; the bench
	// measures speed, not policy.
	s.args = append([]string{"serve", "--listen", addr, "--proxy-listen", proxyAddr, "--data-dir", s.dataDir,
		"--template-dir", cfg.templateDir, "--runsc", cfg.runsc, "--bridge", cfg.bridge, "--subnet", cfg.subnet, "--log-level", "warn",
		"--cpu-overcommit", "0", "--memory-overcommit", "0", "--default-max-vcpus", "0", "--default-max-memory-gb", "0"}, extra...)
	if err := s.launch(); err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

// buildLizard builds lizard and lizard-agent into dir.
func buildLizard(dir string) error {
	for _, c := range []string{"lizard", "lizard-agent"} {
		b := exec.Command("go", "build", "-o", filepath.Join(dir, c), "./cmd/"+c)
		b.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := b.CombinedOutput(); err != nil {
			return fmt.Errorf("build %s: %v %s", c, err, out)
		}
	}
	return nil
}

// launch starts lizard serve and returns once it answers.
func (s *server) launch() error {
	s.cmd = exec.Command(filepath.Join(s.dir, "lizard"), s.args...)
	s.cmd.Env = append(os.Environ(), "LIZARD_API_KEY="+s.key)
	s.cmd.Stderr = os.Stderr
	if err := s.cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	s.exited = exited
	go func(cmd *exec.Cmd) { cmd.Wait(); close(exited) }(s.cmd)
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); {
		select {
		case <-exited:
			return errors.New("lizard serve exited")
		default:
		}
		if resp, err := http.Get(s.url + "/api/projects"); err == nil {
			resp.Body.Close()
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return errors.New("lizard serve did not answer within 60 s")
}

// crash ends the server with SIGKILL; its sandboxes keep running.
func (s *server) crash() {
	s.cmd.Process.Kill()
	<-s.exited
}

// stop ends the server (its sandboxes are killed by then) and removes its
// scratch directory.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func (s *server) stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		s.cmd.Process.Signal(syscall.SIGTERM)
		<-s.exited
	}
	for unix.Unmount(gvisor.RunscRootFor(s.dataDir)+"/null-netns", unix.MNT_DETACH) == nil {
	}
	os.RemoveAll(gvisor.RunscRootFor(s.dataDir))
	os.RemoveAll(s.dir)
	// The server leaves its bridge for sandboxes that outlive it; the
	// bench's are gone with it.
	if s.bridge != "" {
		if err := network.RemoveBridge(s.bridge); err != nil {
			fmt.Fprintln(os.Stderr, "bench: remove the server's network:", err)
		}
	}
}

func (s *server) call(method, path string, body any, out any) error {
	var r io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, s.url+path, r)
	req.Header.Set("X-API-Key", s.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 300 {
		return fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, b)
	}
	if out != nil {
		if p, ok := out.(*[]byte); ok {
			*p = b
			return nil
		}
		return json.Unmarshal(b, out)
	}
	return nil
}

func (s *server) create() (string, error) {
	var sb struct {
		SandboxID string `json:"sandboxId"`
	}
	err := s.call("POST", "/api/sandboxes", map[string]any{"template": "base", "timeoutMs": 600000}, &sb)
	return sb.SandboxID, err
}

func (s *server) execTrue(id string) error {
	var out struct {
		ExitCode int `json:"exitCode"`
	}
	if err := s.call("POST", "/api/sandboxes/"+id+"/exec", map[string]any{"cmd": []string{"true"}}, &out); err != nil {
		return err
	}
	if out.ExitCode != 0 {
		return fmt.Errorf("true exited %d", out.ExitCode)
	}
	return nil
}

// output runs req (an exec request: cmd, timeout) in sandbox id through
// the API and returns its stdout; a non-zero exit is an error with its
// stderr.
func (s *server) output(id string, req map[string]any) (string, error) {
	var out struct {
		Stdout   string `json:"stdout"`
		Stderr   string `json:"stderr"`
		ExitCode int    `json:"exitCode"`
	}
	if err := s.call("POST", "/api/sandboxes/"+id+"/exec", req, &out); err != nil {
		return "", err
	}
	if out.ExitCode != 0 {
		return "", fmt.Errorf("%v: exit %d: %s", req["cmd"], out.ExitCode, out.Stderr)
	}
	return out.Stdout, nil
}

// createExecTrue creates a base sandbox, runs `true` in it and kills it.
func (s *server) createExecTrue() error {
	id, err := s.create()
	if err != nil {
		return err
	}
	defer s.kill(id)
	return s.execTrue(id)
}

func (s *server) kill(id string) { s.call("DELETE", "/api/sandboxes/"+id, nil, nil) }

// --- the measurements ---

func timeit(n int, f func() error) ([]time.Duration, error) {
	out := make([]time.Duration, 0, n)
	for range n {
		t := time.Now()
		if err := f(); err != nil {
			return nil, err
		}
		out = append(out, time.Since(t))
	}
	return out, nil
}

func benchCreate(ctx context.Context, s *server, raw *rawRunsc, n int) (r result, err error) {
	r.name = "create → first exec"
	r.lizard, err = timeit(n, s.createExecTrue)
	if err != nil {
		return r, err
	}
	r.floor, err = timeit(n, func() error {
		id, err := raw.start(ctx)
		if err != nil {
			return err
		}
		defer raw.destroy(id)
		return raw.exec(ctx, id, nil, "true")
	})
	r.note = "lizard: API create (netns, veth, cgroup, overlay, agent up) + exec `true` through the agent; runsc: run --detach (a create and a start in one runsc run, as lizard does) of the same bundle without a network + runsc exec true"
	return r, err
}

func benchExec(ctx context.Context, s *server, raw *rawRunsc, n int) (r result, err error) {
	r.name = "exec true"
	id, err := s.create()
	if err != nil {
		return r, err
	}
	defer s.kill(id)
	if r.lizard, err = timeit(n, func() error { return s.execTrue(id) }); err != nil {
		return r, err
	}
	rid, err := raw.start(ctx)
	if err != nil {
		return r, err
	}
	defer raw.destroy(rid)
	r.floor, err = timeit(n, func() error { return raw.exec(ctx, rid, nil, "true") })
	return r, err
}

func benchFiles(ctx context.Context, s *server, raw *rawRunsc, n int) (r result, err error) {
	r.name = "1 MiB write + read"
	data := make([]byte, 1<<20)
	rand.Read(data)
	b64 := base64.StdEncoding.EncodeToString(data)
	id, err := s.create()
	if err != nil {
		return r, err
	}
	defer s.kill(id)
	r.lizard, err = timeit(n, func() error {
		if err := s.call("POST", "/api/sandboxes/"+id+"/files", map[string]any{"path": "/tmp/blob", "content": b64, "encoding": "base64"}, nil); err != nil {
			return err
		}
		var back []byte
		if err := s.call("GET", "/api/sandboxes/"+id+"/files?path=/tmp/blob", nil, &back); err != nil {
			return err
		}
		if !bytes.Equal(back, data) {
			return fmt.Errorf("read back %d bytes, not the ones written", len(back))
		}
		return nil
	})
	if err != nil {
		return r, err
	}
	rid, err := raw.start(ctx)
	if err != nil {
		return r, err
	}
	defer raw.destroy(rid)
	r.floor, err = timeit(n, func() error {
		if err := raw.exec(ctx, rid, bytes.NewReader(data), "/bin/sh", "-c", "cat > /tmp/blob"); err != nil {
			return err
		}
		var out bytes.Buffer
		if err := raw.execOut(ctx, rid, &out, "cat", "/tmp/blob"); err != nil {
			return err
		}
		if !bytes.Equal(out.Bytes(), data) {
			return fmt.Errorf("runsc read back %d bytes", out.Len())
		}
		return nil
	})
	r.note = "runsc: `runsc exec sh -c 'cat > f'` with the bytes on stdin, then `runsc exec cat f`"
	return r, err
}

func benchConcurrent(ctx context.Context, s *server, raw *rawRunsc, n int) (r result, err error) {
	r.name = fmt.Sprintf("%d concurrent creates (each)", n)
	var mu sync.Mutex
	var wg sync.WaitGroup
	var errs []string
	ids := []string{}
	start := time.Now()
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.Now()
			id, err := s.create()
			if err == nil {
				err = s.execTrue(id)
			}
			mu.Lock()
			defer mu.Unlock()
			if id != "" {
				ids = append(ids, id)
			}
			if err != nil {
				errs = append(errs, err.Error())
				return
			}
			r.lizard = append(r.lizard, time.Since(t))
		}()
	}
	wg.Wait()
	lizWall := time.Since(start)
	for _, id := range ids {
		s.kill(id)
	}
	if len(errs) > 0 {
		return r, fmt.Errorf("%d of %d creates failed: %s", len(errs), n, strings.Join(errs, "; "))
	}
	rids := []string{}
	start = time.Now()
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.Now()
			id, err := raw.start(ctx)
			if err == nil {
				err = raw.exec(ctx, id, nil, "true")
			}
			mu.Lock()
			defer mu.Unlock()
			if id != "" {
				rids = append(rids, id)
			}
			if err != nil {
				errs = append(errs, err.Error())
				return
			}
			r.floor = append(r.floor, time.Since(t))
		}()
	}
	wg.Wait()
	rawWall := time.Since(start)
	for _, id := range rids {
		raw.destroy(id)
	}
	if len(errs) > 0 {
		return r, fmt.Errorf("raw runsc: %s", strings.Join(errs, "; "))
	}
	r.note = fmt.Sprintf("all %d succeeded; wall time for all: lizard %s, runsc %s", n, ms(lizWall), ms(rawWall))
	return r, nil
}

// benchRestart measures a restart after kill -9 until the API answers,
// with busy sandboxes burning CPU and, as the floor, with none.
func benchRestart(s *server, n, busy int) (r result, err error) {
	r.name = fmt.Sprintf("restart → listening, %d busy", busy)
	for range n {
		d, err := s.restart()
		if err != nil {
			return r, err
		}
		r.floor = append(r.floor, d)
	}
	var ids []string
	defer func() {
		for _, id := range ids {
			s.kill(id)
		}
	}()
	for range busy {
		// Nano, as TestRestartBusy's: each burner takes half a CPU.
		var sb struct {
			SandboxID string `json:"sandboxId"`
		}
		if err := s.call("POST", "/api/sandboxes", map[string]any{"template": "base", "size": "nano", "timeoutMs": 600000}, &sb); err != nil {
			return r, err
		}
		id := sb.SandboxID
		ids = append(ids, id)
		var out struct {
			ExitCode int `json:"exitCode"`
		}
		if err := s.call("POST", "/api/sandboxes/"+id+"/exec", map[string]any{"cmd": "nohup sh -c 'while :; do :; done' > /dev/null 2>&1 &"}, &out); err != nil {
			return r, err
		}
	}
	for range n {
		d, err := s.restart()
		if err != nil {
			return r, err
		}
		r.lizard = append(r.lizard, d)
		// The next restart starts from sandboxes all reattached.
		for _, id := range ids {
			if err := s.waitRecovered(id); err != nil {
				return r, err
			}
		}
	}
	r.note = fmt.Sprintf("lizard: after a kill -9, from the start of a new server until GET /api/projects answers, with %d sandboxes each burning its CPU (reattached in the background); floor: the same with no sandbox", busy)
	return r, nil
}

// restart kills the server with SIGKILL, waits until it is gone, and
// returns how long a new one takes from its start until it answers.
func (s *server) restart() (time.Duration, error) {
	s.crash()
	t := time.Now()
	err := s.launch()
	return time.Since(t), err
}

// waitRecovered waits until sandbox id answers an exec again after a
// restart (503 recovering until then).
func (s *server) waitRecovered(id string) error {
	deadline := time.Now().Add(3 * time.Minute)
	for {
		err := s.execTrue(id)
		if err == nil {
			return nil
		}
		if !strings.Contains(err.Error(), ": 503 ") || time.Now().After(deadline) {
			return fmt.Errorf("sandbox %s after a restart: %w", id, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
