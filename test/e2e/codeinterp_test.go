package e2e

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// ansi matches the color codes of IPython's tracebacks.
var ansi = regexp.MustCompile("\x1b\\[[0-9;]*m")

// ciEvent is one NDJSON line of the code interpreter's /execute.
type ciEvent struct {
	Type           string `json:"type"`
	Text           string `json:"text"`
	IsMainResult   bool   `json:"is_main_result"`
	PNG            string `json:"png"`
	Data           any    `json:"data"`
	Name           string `json:"name"`
	Value          string `json:"value"`
	Traceback      string `json:"traceback"`
	ExecutionCount int    `json:"execution_count"`
}

type ciContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

// codeInterp reaches port 49999 of a code-interpreter-v1 sandbox through
// the preview proxy.
type codeInterp struct {
	s    *server
	host string
	tok  string
}

func (c codeInterp) call(t *testing.T, method, path string, body any) (*http.Response, string) {
	t.Helper()
	var r *strings.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = strings.NewReader(string(b))
	} else {
		r = strings.NewReader("")
	}
	resp := c.s.preview(t, method, c.host, path, http.Header{"X-Lizard-Access-Token": {c.tok}, "Content-Type": {"application/json"}}, r)
	return resp, resp.Header.Get("Content-Type")
}

// execute runs code and returns the events, which must end with
// end_of_execution.
func (c codeInterp) execute(t *testing.T, body map[string]any) []ciEvent {
	t.Helper()
	resp, ctype := c.call(t, "POST", "/execute", body)
	defer resp.Body.Close()
	if resp.StatusCode != 200 || ctype != "application/x-ndjson" {
		t.Fatalf("execute %v: %d %s %s", body, resp.StatusCode, ctype, readAll(t, resp))
	}
	var evs []ciEvent
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var ev ciEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		evs = append(evs, ev)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(evs) == 0 || evs[len(evs)-1].Type != "end_of_execution" {
		t.Fatalf("execute %v: %+v, want it to end with end_of_execution", body, evs)
	}
	return evs
}

// mainText is the text of the main result.
func mainText(evs []ciEvent) (string, bool) {
	for _, e := range evs {
		if e.Type == "result" && e.IsMainResult {
			return e.Text, true
		}
	}
	return "", false
}

func (c codeInterp) contexts(t *testing.T) []ciContext {
	t.Helper()
	resp, _ := c.call(t, "GET", "/contexts", nil)
	var out []ciContext
	if body := readAll(t, resp); resp.StatusCode != 200 || json.Unmarshal([]byte(body), &out) != nil {
		t.Fatalf("list contexts: %d %s", resp.StatusCode, body)
	}
	return out
}

// TestCodeInterpreter: a code-interpreter-v1 sandbox serves E2B's
// code-interpreter API on 49999 from the moment the create answers, on a
// real Jupyter kernel: state across calls, streams, a matplotlib chart as
// PNG, an error with its traceback, environment per call, contexts, and
// 4xx answers for bad input.
func TestCodeInterpreter(t *testing.T) {
	s := startServer(t, "")
	id, _ := s.createdAt(t, "code-interpreter-v1", "")
	var ex exposed
	if code, body := s.do("POST", "/api/sandboxes/"+id+"/expose/49999", nil, &ex); code != 200 {
		t.Fatalf("expose: %d %s", code, body)
	}
	c := codeInterp{s: s, host: ex.Hostname, tok: ex.AccessToken}

	// Ready when the create answered: no waiting.
	if resp, _ := c.call(t, "GET", "/health", nil); resp.StatusCode != 200 {
		t.Fatalf("health right after create: %d %s", resp.StatusCode, readAll(t, resp))
	}

	t.Run("state, streams and the execution count", func(t *testing.T) {
		c.execute(t, map[string]any{"code": "x = 41"})
		evs := c.execute(t, map[string]any{"code": "import sys\nprint('out')\nprint('err', file=sys.stderr)\nx + 1"})
		var stdout, stderr string
		count := 0
		for _, e := range evs {
			switch e.Type {
			case "stdout":
				stdout += e.Text
			case "stderr":
				stderr += e.Text
			case "number_of_executions":
				count = e.ExecutionCount
			}
		}
		if txt, ok := mainText(evs); !ok || txt != "42" || stdout != "out\n" || stderr != "err\n" || count < 2 {
			t.Fatalf("events %+v", evs)
		}
	})

	t.Run("a matplotlib chart is a PNG result", func(t *testing.T) {
		evs := c.execute(t, map[string]any{"code": "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.title('squares')\nplt.show()"})
		for _, e := range evs {
			if e.Type == "result" && e.PNG != "" {
				png, err := base64.StdEncoding.DecodeString(strings.TrimSpace(e.PNG))
				if err != nil || !strings.HasPrefix(string(png), "\x89PNG") || e.IsMainResult {
					t.Fatalf("png result: main %v, %d bytes, %v", e.IsMainResult, len(png), err)
				}
				return
			}
		}
		t.Fatalf("no PNG in %+v", evs)
	})

	t.Run("a DataFrame has its data", func(t *testing.T) {
		evs := c.execute(t, map[string]any{"code": "import pandas as pd\npd.DataFrame({'a': [1, 2]})"})
		for _, e := range evs {
			if e.Type == "result" && e.IsMainResult {
				if b, _ := json.Marshal(e.Data); !strings.Contains(string(b), `"columns":["a"]`) {
					t.Fatalf("data %s", b)
				}
				return
			}
		}
		t.Fatalf("no main result in %+v", evs)
	})

	t.Run("an error has name, value and traceback, and the context lives on", func(t *testing.T) {
		evs := c.execute(t, map[string]any{"code": "def f():\n    return 1 / 0\nf()"})
		var e *ciEvent
		for i := range evs {
			if evs[i].Type == "error" {
				e = &evs[i]
			}
		}
		if e == nil || e.Name != "ZeroDivisionError" || e.Value != "division by zero" || !strings.Contains(ansi.ReplaceAllString(e.Traceback, ""), "return 1 / 0") {
			t.Fatalf("events %+v", evs)
		}
		if txt, _ := mainText(c.execute(t, map[string]any{"code": "x"})); txt != "41" {
			t.Fatalf("x after the error: %q", txt)
		}
	})

	t.Run("env_vars hold for one execution", func(t *testing.T) {
		code := "import os; os.environ.get('LIZARD_CI_VAR', 'unset')"
		if txt, _ := mainText(c.execute(t, map[string]any{"code": code, "env_vars": map[string]string{"LIZARD_CI_VAR": "set"}})); txt != "set" {
			t.Fatalf("with env_vars: %q", txt)
		}
		if txt, _ := mainText(c.execute(t, map[string]any{"code": code})); txt != "unset" {
			t.Fatalf("after: %q", txt)
		}
	})

	t.Run("contexts: create, list, own state, restart, remove", func(t *testing.T) {
		// A default context per language from the start.
		var langs []string
		for _, ctx := range c.contexts(t) {
			langs = append(langs, ctx.Language)
		}
		if slices.Sort(langs); !slices.Equal(langs, []string{"bash", "javascript", "python"}) {
			t.Fatalf("contexts at first: %q, want the default one of each language", langs)
		}
		resp, _ := c.call(t, "POST", "/contexts", map[string]any{"language": "python", "cwd": "/tmp"})
		var ctx ciContext
		if body := readAll(t, resp); resp.StatusCode != 200 || json.Unmarshal([]byte(body), &ctx) != nil || ctx.ID == "" || ctx.Cwd != "/tmp" || ctx.Language != "python" {
			t.Fatalf("create context: %d %s", resp.StatusCode, body)
		}
		if txt, _ := mainText(c.execute(t, map[string]any{"code": "import os; os.getcwd()", "context_id": ctx.ID})); txt != "/tmp" {
			t.Fatalf("cwd in the context: %q", txt)
		}
		if evs := c.execute(t, map[string]any{"code": "x", "context_id": ctx.ID}); evs[len(evs)-2].Name != "NameError" {
			t.Fatalf("the new context sees the default's x: %+v", evs)
		}
		c.execute(t, map[string]any{"code": "y = 7", "context_id": ctx.ID})
		if got := c.contexts(t); len(got) != 4 {
			t.Fatalf("contexts %+v, want 4", got)
		}
		if resp, _ := c.call(t, "POST", "/contexts/"+ctx.ID+"/restart", nil); resp.StatusCode/100 != 2 {
			t.Fatalf("restart: %d %s", resp.StatusCode, readAll(t, resp))
		}
		if evs := c.execute(t, map[string]any{"code": "y", "context_id": ctx.ID}); evs[len(evs)-2].Name != "NameError" {
			t.Fatalf("y survived the restart: %+v", evs)
		}
		if resp, _ := c.call(t, "DELETE", "/contexts/"+ctx.ID, nil); resp.StatusCode/100 != 2 {
			t.Fatalf("remove: %d %s", resp.StatusCode, readAll(t, resp))
		}
		if got := c.contexts(t); len(got) != 3 {
			t.Fatalf("contexts after remove %+v", got)
		}
		if resp, _ := c.call(t, "POST", "/execute", map[string]any{"code": "1", "context_id": ctx.ID}); resp.StatusCode != 404 {
			t.Fatalf("execute in a removed context: %d %s", resp.StatusCode, readAll(t, resp))
		}
	})

	// The program is mounted only where the template runs it, and a
	// snapshot's restore has the same mounts (runsc refuses one that has
	// not): the copy's server answers with the source's state.
	t.Run("only code-interpreter-v1 has the program; its snapshot restores", func(t *testing.T) {
		// Not mere existence: runsc leaves an empty mount point file in
		// a rootfs that had none.
		const prog = "test -s /.lizard/code-interpreter.py && echo mounted || echo none"
		if got := s.sh(t, id, prog); got != "mounted\n" {
			t.Fatalf("in code-interpreter-v1: %q", got)
		}
		base := s.create(t)
		defer s.do("DELETE", "/api/sandboxes/"+base, nil, nil)
		if got := s.sh(t, base, prog); got != "none\n" {
			t.Fatalf("in base: %q", got)
		}
		var snap struct {
			ID string `json:"id"`
		}
		if code, body := s.do("POST", "/api/sandboxes/"+id+"/snapshot", map[string]any{"poolSize": 0}, &snap); code != http.StatusCreated {
			t.Fatalf("snapshot: %d %s", code, body)
		}
		defer s.do("DELETE", "/api/sandbox-snapshots/"+snap.ID, nil, nil)
		var cp sandboxInfo
		if code, body := s.do("POST", "/api/sandboxes", map[string]any{"snapshotId": snap.ID}, &cp); code >= 300 {
			t.Fatalf("restore: %d %s", code, body)
		}
		defer s.do("DELETE", "/api/sandboxes/"+cp.SandboxID, nil, nil)
		var cex exposed
		if code, body := s.do("POST", "/api/sandboxes/"+cp.SandboxID+"/expose/49999", nil, &cex); code != 200 {
			t.Fatalf("expose the copy: %d %s", code, body)
		}
		copyCI := codeInterp{s: s, host: cex.Hostname, tok: cex.AccessToken}
		if txt, _ := mainText(copyCI.execute(t, map[string]any{"code": "x"})); txt != "41" {
			t.Fatalf("x in the restored copy: %q", txt)
		}
	})

	t.Run("bad input is a 4xx with code and message", func(t *testing.T) {
		for _, b := range []any{
			map[string]any{"code": 1},
			map[string]any{"code": "1", "language": "cobol"},
			map[string]any{"code": "1", "language": "python", "context_id": "x"},
			map[string]any{"code": "1", "env_vars": map[string]any{"A": 1}},
			map[string]any{"code": "1", "language": "bash", "env_vars": map[string]any{"A-B": "x"}},
			[]int{1},
		} {
			resp, _ := c.call(t, "POST", "/execute", b)
			var e struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			}
			if body := readAll(t, resp); resp.StatusCode != 400 || json.Unmarshal([]byte(body), &e) != nil || e.Code != 400 || e.Message == "" {
				t.Errorf("execute %v: %d %s", b, resp.StatusCode, body)
			}
			// A language without a kernel names the ones there are.
			if m, ok := b.(map[string]any); ok && m["language"] == "cobol" &&
				!strings.Contains(e.Message, "supported: bash, java, javascript, python, r, typescript") {
				t.Errorf("execute %v: message %q does not name the supported languages", b, e.Message)
			}
		}
		resp, _ := c.call(t, "POST", "/contexts", map[string]any{"cwd": "/nonexistent"})
		if body := readAll(t, resp); resp.StatusCode != 400 {
			t.Errorf("context in a missing cwd: %d %s", resp.StatusCode, body)
		}
		resp, _ = c.call(t, "POST", "/contexts/nope/restart", nil)
		if body := readAll(t, resp); resp.StatusCode != 404 {
			t.Errorf("restart of an unknown context: %d %s", resp.StatusCode, body)
		}
	})

	t.Run("a token file makes /execute require X-Access-Token, /contexts not", func(t *testing.T) {
		s.sh(t, id, "mkdir -p /run/lizard && printf secret > /run/lizard/envd-token")
		defer s.sh(t, id, "rm -f /run/lizard/envd-token")
		if resp, _ := c.call(t, "POST", "/execute", map[string]any{"code": "1"}); resp.StatusCode != 401 {
			t.Fatalf("execute without the token: %d %s", resp.StatusCode, readAll(t, resp))
		}
		resp := c.s.preview(t, "POST", c.host, "/execute", http.Header{"X-Lizard-Access-Token": {c.tok}, "X-Access-Token": {"secret"}}, strings.NewReader(`{"code":"2+2"}`))
		if body := readAll(t, resp); resp.StatusCode != 200 || !strings.Contains(body, `"text": "4"`) {
			t.Fatalf("execute with the token: %d %s", resp.StatusCode, body)
		}
		if got := c.contexts(t); len(got) != 3 {
			t.Fatalf("contexts %+v", got)
		}
	})

	// A second sandbox starts from the ready state the first create made.
	id2, _ := s.createdAt(t, "code-interpreter-v1", "")
	out := s.sh(t, id2, fmt.Sprintf(`curl -sf -X POST http://127.0.0.1:%d/execute -d '{"code":"1+1"}'`, 49999))
	if !strings.Contains(out, `"text": "2"`) || !strings.Contains(out, "end_of_execution") {
		t.Fatalf("second sandbox: %s", out)
	}
}
