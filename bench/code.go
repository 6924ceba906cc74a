package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"
)

// codeResult is CodeSandbox on the interpreter template, through the
// official SDK (bench/code.mjs), and a Dockerfile rebuild with a warm cache.
type codeResult struct {
	created, roundTrips []time.Duration
	rebuild             []time.Duration
	// readyServe: create from a template whose start command (1 s to start
	// serving) has a ready state → it answers; coldServe: the same server
	// started by an exec in a new python sandbox → it answers.
	readyServe, coldServe []time.Duration
	// ciCreated: create of a code-interpreter-v1 sandbox → its first
	// /execute answered on 49999 through the preview proxy; ciRoundTrips:
	// POST /execute {"code": "1+1"} through the proxy (what the E2B SDK's
	// runCode sends).
	ciCreated, ciRoundTrips []time.Duration
}

func benchCode(s *server, cfg config, n int) (codeResult, error) {
	var r codeResult
	out, err := runNode("code.mjs", n, "LIZARD_API_URL="+s.url, "LIZARD_API_KEY="+s.key)
	if err != nil {
		return r, err
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
	defer s.removeTemplate(name)
	for i := range 4 {
		t := time.Now()
		b := exec.Command(filepath.Join(s.dir, "lizard"), "template", "build", name, "-f", "test/e2e/testdata/custom/Dockerfile",
			"test/e2e/testdata/custom", "--template-dir", cfg.templateDir, "--runsc", cfg.runsc,
			"--project", "default", "--data-dir", s.dataDir)
		if out, err := b.CombinedOutput(); err != nil {
			return r, fmt.Errorf("template build: %v %s", err, out)
		}
		if i > 0 {
			r.rebuild = append(r.rebuild, time.Since(t))
		}
	}
	if err := benchStartCommand(s, n, &r); err != nil {
		return r, err
	}
	return r, benchCodeInterpreter(s, n, &r)
}

// benchCodeInterpreter times the code-interpreter-v1 template's server on
// 49999 through the preview proxy. The first create makes the template's
// ready state and is not counted.
func benchCodeInterpreter(s *server, n int, r *codeResult) error {
	client := &http.Client{Timeout: time.Minute}
	execute := func(host, token string) error {
		req, err := http.NewRequest("POST", "http://"+s.proxy+"/execute", strings.NewReader(`{"code":"1+1"}`))
		if err != nil {
			return err
		}
		req.Host = host
		req.Header.Set("X-Lizard-Access-Token", token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		if resp.StatusCode != 200 || !strings.Contains(string(b), `"text": "2"`) || !strings.Contains(string(b), "end_of_execution") {
			return fmt.Errorf("execute: %d %s", resp.StatusCode, b)
		}
		return nil
	}
	for i := range max(2, n/4) + 1 {
		t := time.Now()
		var sb struct {
			SandboxID string `json:"sandboxId"`
		}
		if err := s.call("POST", "/api/sandboxes", map[string]any{"template": "code-interpreter-v1"}, &sb); err != nil {
			return fmt.Errorf("create code-interpreter-v1: %w", err)
		}
		var ex struct {
			Hostname    string `json:"hostname"`
			AccessToken string `json:"accessToken"`
		}
		err := s.call("POST", "/api/sandboxes/"+sb.SandboxID+"/expose/49999", nil, &ex)
		if err == nil {
			err = execute(ex.Hostname, ex.AccessToken)
		}
		if err == nil && i > 0 {
			r.ciCreated = append(r.ciCreated, time.Since(t))
		}
		for j := 0; err == nil && i == 1 && j < n; j++ {
			t := time.Now()
			if err = execute(ex.Hostname, ex.AccessToken); err == nil {
				r.ciRoundTrips = append(r.ciRoundTrips, time.Since(t))
			}
		}
		s.kill(sb.SandboxID)
		if err != nil {
			return fmt.Errorf("code-interpreter-v1: %w", err)
		}
	}
	return nil
}

// serverCmd starts a web server after a second, as slow services do.
const serverCmd = "sleep 1; exec python3 -m http.server --bind 127.0.0.1 8000"

// benchStartCommand times how long a sandbox takes to answer on its
// server's port when the server is a template's start command (kept
// running in its ready state) and when an exec starts it after the create.
func benchStartCommand(s *server, n int, r *codeResult) error {
	name := fmt.Sprintf("bench-start-%d", time.Now().UnixNano()%1e6)
	defer s.removeTemplate(name)
	df := fmt.Sprintf("FROM python\nCMD [\"sh\", \"-c\", %q]\n", serverCmd)
	if err := s.call("POST", "/api/templates", map[string]any{"name": name, "dockerfile": df}, nil); err != nil {
		return fmt.Errorf("build the start-command template: %w", err)
	}
	const waitServing = "until curl -sf -o /dev/null http://127.0.0.1:8000/; do sleep 0.02; done"
	serve := func(tpl, script string) (time.Duration, error) {
		t := time.Now()
		var sb struct {
			SandboxID string `json:"sandboxId"`
		}
		if err := s.call("POST", "/api/sandboxes", map[string]any{"template": tpl}, &sb); err != nil {
			return 0, err
		}
		defer s.kill(sb.SandboxID)
		var out struct {
			ExitCode int `json:"exitCode"`
		}
		if err := s.call("POST", "/api/sandboxes/"+sb.SandboxID+"/exec", map[string]any{"cmd": script, "timeoutMs": 30000}, &out); err != nil {
			return 0, err
		}
		if out.ExitCode != 0 {
			return 0, fmt.Errorf("%s: exit %d", script, out.ExitCode)
		}
		return time.Since(t), nil
	}
	for range n {
		d, err := serve(name, waitServing)
		if err != nil {
			return err
		}
		r.readyServe = append(r.readyServe, d)
		d, err = serve("python", "(setsid sh -c '"+serverCmd+"' >/dev/null 2>&1 &); "+waitServing)
		if err != nil {
			return err
		}
		r.coldServe = append(r.coldServe, d)
	}
	return nil
}

// runNode runs bench/<script> with argument n and env added, and returns
// its stdout. Node resolves the SDKs' bare imports from the script's
// directory up: it runs a copy of the script beside the end-to-end tests'
// node_modules.
func runNode(script string, n int, env ...string) ([]byte, error) {
	b, err := os.ReadFile(filepath.Join("bench", script))
	if err != nil {
		return nil, err
	}
	local, err := filepath.Abs(filepath.Join("test/e2e", ".bench-"+script))
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(local, b, 0o644); err != nil {
		return nil, err
	}
	defer os.Remove(local)
	cmd := exec.Command("node", local, fmt.Sprint(n))
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("bench/%s: %v (run `npm install` in test/e2e)", script, err)
	}
	return out, nil
}

// removeTemplate removes a bench template: its name and every version.
// (templates belong to the bench server's project, whose directory in the
// template cache only the server knows).
func (s *server) removeTemplate(name string) {
	if err := s.call("DELETE", "/api/templates/"+name, nil, nil); err != nil {
		fmt.Fprintln(os.Stderr, "bench: remove template:", err)
	}
}

func printCodeTable(w io.Writer, r codeResult) {
	printStatsTable(w, "templates", []statsRow{
		{"CodeSandbox.create → first runCode (interpreter)", r.created},
		{"runCode('1+1') round trip", r.roundTrips},
		{"Dockerfile rebuild, every step cached", r.rebuild},
		{"create → start command serving (ready state)", r.readyServe},
		{"create → exec starts the same server → serving", r.coldServe},
		{"code-interpreter-v1 create → first /execute via proxy", r.ciCreated},
		{"code-interpreter-v1 runCode('1+1') via proxy", r.ciRoundTrips},
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
