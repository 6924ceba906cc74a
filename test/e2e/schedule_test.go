package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSchedules runs the SDK's schedule calls (js/schedule/*.test.mjs):
// an every-minute schedule runs twice with nextRunAt advancing (two real
// minutes: every is at least one), a run of a paused sandbox wakes it and
// puts it back to sleep, failures switch a schedule off, bad input is a 400
// naming the field, the per-sandbox quota, a kill takes the schedules.
func TestSchedules(t *testing.T) {
	s := startServer(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), budget(6*time.Minute)+4*time.Minute)
	defer cancel()
	if err := s.runNode(ctx, jsFiles("js/schedule/*.test.mjs")...); err != nil {
		t.Fatalf("schedule SDK tests failed: %v", err)
	}
	s.waitNoLeaks(t)
}

// scheduleView and runView are what the API answers of a schedule and a
// run (the SDK's SandboxSchedule and SandboxScheduleRun).
type scheduleView struct {
	ID           string  `json:"id"`
	NextRunAt    *string `json:"nextRunAt"`
	Running      bool    `json:"running"`
	LastStatus   *string `json:"lastStatus"`
	SkippedCount int     `json:"skippedCount"`
	Agent        *string `json:"agent"`
	Kind         string  `json:"kind"`
}

type runView struct {
	ID       string  `json:"id"`
	Status   string  `json:"status"`
	DueAt    string  `json:"dueAt"`
	Woke     bool    `json:"woke"`
	Slept    bool    `json:"slept"`
	Finished bool    `json:"finished"`
	Output   *string `json:"output"`
	Error    *string `json:"error"`
	ExitCode *int    `json:"exitCode"`
}

func (s *server) schedule(t *testing.T, sandboxID string, body map[string]any) scheduleView {
	t.Helper()
	var v scheduleView
	if code, raw := s.do("POST", "/api/sandboxes/"+sandboxID+"/schedules", body, &v); code != http.StatusCreated {
		t.Fatalf("schedule %v: %d %s", body, code, raw)
	}
	return v
}

func (s *server) scheduleRuns(t *testing.T, id string) []runView {
	t.Helper()
	var out struct {
		Runs []runView `json:"runs"`
	}
	if code, raw := s.do("GET", "/api/sandbox-schedules/"+id+"/runs?limit=50", nil, &out); code != http.StatusOK {
		t.Fatalf("runs of %s: %d %s", id, code, raw)
	}
	return out.Runs
}

// waitRuns waits up to d until cond holds of the schedule's runs (newest
// first) and returns them.
func (s *server) waitRuns(t *testing.T, id string, d time.Duration, what string, cond func([]runView) bool) []runView {
	t.Helper()
	end := time.Now().Add(d)
	for {
		runs := s.scheduleRuns(t, id)
		if cond(runs) {
			return runs
		}
		if time.Now().After(end) {
			t.Fatalf("%s: runs of %s after %v: %+v\n%s", what, id, d, runs, s.logs())
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// TestScheduleCrash: a server killed with SIGKILL during a run records it
// interrupted at its next start and puts the sandbox the run woke back to
// sleep; a due time then runs once, also across another kill -9. The CLI
// changes and lists schedules and sets the project's limit of them.
func TestScheduleCrash(t *testing.T) {
	s := startServer(t, "")
	id := s.create(t)
	sc := s.schedule(t, id, map[string]any{"every": "1h", "command": "echo started; sleep 1000"})
	if code, raw := s.do("POST", "/api/sandboxes/"+id+"/pause", nil, nil); code >= 300 {
		t.Fatalf("pause: %d %s", code, raw)
	}
	if code, raw := s.do("POST", "/api/sandbox-schedules/"+sc.ID+"/run", nil, nil); code != http.StatusOK {
		t.Fatalf("run: %d %s", code, raw)
	}
	var v scheduleView
	for end := time.Now().Add(budget(60 * time.Second)); ; time.Sleep(200 * time.Millisecond) {
		s.do("GET", "/api/sandbox-schedules/"+sc.ID, nil, &v)
		var info sandboxInfo
		s.do("GET", "/api/sandboxes/"+id, nil, &info)
		if v.Running && info.Status == "running" {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the run did not start: %+v, sandbox %s\n%s", v, info.Status, s.logs())
		}
	}
	time.Sleep(time.Second) // the command is under way
	s.crash()
	s.start()
	runs := s.waitRuns(t, sc.ID, budget(30*time.Second), "the cut run recorded and the sandbox back asleep", func(rs []runView) bool {
		return len(rs) == 1 && rs[0].Status == "interrupted" && rs[0].Slept
	})
	if !runs[0].Woke || runs[0].Error == nil || !runs[0].Finished {
		t.Fatalf("the cut run: %+v", runs[0])
	}
	s.waitStatus(t, id, "paused")

	// A due time a minute from now (a quick command, set with the CLI).
	if out := s.scheduleCLI(t, "set", sc.ID, "--every", "1m", "--command", "echo next", "--json"); json.Unmarshal([]byte(out), &v) != nil || v.NextRunAt == nil {
		t.Fatalf("lizard sandbox schedule set: %s", out)
	}
	due := parseTime(t, *v.NextRunAt)
	if out := s.scheduleCLI(t, "ls", id); !strings.Contains(out, sc.ID) || !strings.Contains(out, "every 1m") || !strings.Contains(out, "interrupted") {
		t.Fatalf("lizard sandbox schedule ls %s:\n%s", id, out)
	}
	// The project's limit of schedules, set with the CLI.
	s.cli(t, "projects", "set", "default", "--max-schedules", "1")
	if out := s.cli(t, "projects", "ls"); !strings.Contains(out, "SCHEDULES") || !strings.Contains(out, "1/1*") {
		t.Fatalf("lizard projects ls:\n%s", out)
	}
	if code, raw := s.do("POST", "/api/sandboxes/"+id+"/schedules", map[string]any{"every": "1h", "command": "true"}, nil); code != http.StatusTooManyRequests ||
		!strings.Contains(string(raw), "schedules 1 of 1") {
		t.Fatalf("a second schedule over the project's limit of 1: %d %s", code, raw)
	}
	runs = s.waitRuns(t, sc.ID, budget(30*time.Second)+70*time.Second, "the due time's run", func(rs []runView) bool {
		return len(rs) >= 2 && rs[0].Finished
	})
	r := runs[0]
	if r.Status != "succeeded" || r.Output == nil || *r.Output != "next\n" || !r.Woke || !r.Slept || !parseTime(t, r.DueAt).Equal(due) {
		t.Fatalf("the due time's run: %+v, want due at %s, woke and slept", r, due)
	}
	// Killed again: the due time that ran does not run again.
	s.crash()
	s.start()
	time.Sleep(budget(2 * time.Second))
	n := 0
	for _, x := range s.scheduleRuns(t, sc.ID) {
		if parseTime(t, x.DueAt).Equal(due) {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d runs of the due time %s, want 1", n, due)
	}
	if out := s.scheduleCLI(t, "runs", sc.ID); !strings.Contains(out, "succeeded") || !strings.Contains(out, "interrupted") {
		t.Fatalf("lizard sandbox schedule runs:\n%s", out)
	}
	s.scheduleCLI(t, "rm", sc.ID)
	if code, _ := s.do("GET", "/api/sandbox-schedules/"+sc.ID, nil, nil); code != http.StatusNotFound {
		t.Fatalf("schedule after lizard sandbox schedule rm: %d", code)
	}
	if code, raw := s.do("DELETE", "/api/sandboxes/"+id, nil, nil); code >= 300 {
		t.Fatalf("kill: %d %s", code, raw)
	}
	s.waitNoLeaks(t)
}

// waitStatus waits until sandbox id has status.
func (s *server) waitStatus(t *testing.T, id, status string) {
	t.Helper()
	var info sandboxInfo
	for end := time.Now().Add(budget(30 * time.Second)); ; time.Sleep(200 * time.Millisecond) {
		if s.do("GET", "/api/sandboxes/"+id, nil, &info); info.Status == status {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("sandbox %s: %s, want %s", id, info.Status, status)
		}
	}
}

// scheduleCLI runs `lizard sandbox schedule ARGS` against the server and
// returns its output; a failure fails the test.
func (s *server) scheduleCLI(t *testing.T, args ...string) string {
	t.Helper()
	out, errOut, status := s.sandboxCLI(t, append([]string{"schedule"}, args...)...)
	if status != 0 {
		t.Fatalf("lizard sandbox schedule %s: exit %d\n%s%s", strings.Join(args, " "), status, out, errOut)
	}
	return out
}

func parseTime(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// fakeModel serves Anthropic's and OpenAI's APIs in the fake internet's
// namespace (testdata/fakemodel.py) on 10.99.0.2:port, answering answer to
// every request and logging each one.
type fakeModel struct {
	url string // http://10.99.0.2:PORT
	log string
}

func startFakeModel(t *testing.T, port int, answer string) *fakeModel {
	t.Helper()
	startFakeInternet(t)
	script, err := filepath.Abs("testdata/fakemodel.py")
	if err != nil {
		t.Fatal(err)
	}
	m := &fakeModel{url: fmt.Sprintf("http://10.99.0.2:%d", port), log: filepath.Join(t.TempDir(), "requests.jsonl")}
	cmd := exec.Command("ip", "netns", "exec", inetNS, "python3", script, fmt.Sprint(port), m.log, answer)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return m
}

// requests are the model requests logged so far.
func (m *fakeModel) requests(t *testing.T) []string {
	b, err := os.ReadFile(m.log)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// TestSchedulePrompt: prompt schedules run the coding agent of the claude
// and codex templates non-interactively, pointed by the sandbox's own envs
// (and codex's config) at a model endpoint of the test's own: the prompt
// arrives there, with the schedule's model and effort, and the run records
// the agent's answer. An agent the sandbox lacks is a 400 naming it.
func TestSchedulePrompt(t *testing.T) {
	for _, name := range []string{"claude", "codex"} {
		if _, err := os.Stat(filepath.Join(templateDir(), name)); err != nil {
			t.Skipf("template %s is not built in %s (lizard template build %s)", name, templateDir(), name)
		}
	}
	const answer = "the-answer-from-the-fake-model-4711"
	m := startFakeModel(t, 8090, answer)
	s := startServer(t, "", "--dns-upstream", "10.99.0.1:5353")
	for _, tc := range []struct {
		template, model, effort string
		envs                    map[string]string
		setup                   string // files the agent reads, written before the run
	}{
		{"claude", "claude-test-model", "high", map[string]string{"ANTHROPIC_BASE_URL": m.url, "ANTHROPIC_API_KEY": "sk-ant-test"}, ""},
		{"codex", "gpt-test-model", "low", map[string]string{"OPENAI_API_KEY": "sk-test"},
			fmt.Sprintf("mkdir -p /root/.codex && printf '%%s\\n' 'model_provider = \"fake\"' '[model_providers.fake]' 'name = \"fake\"' 'base_url = \"%s/v1\"' 'env_key = \"OPENAI_API_KEY\"' 'wire_api = \"responses\"' 'supports_websockets = false' > /root/.codex/config.toml", m.url)},
	} {
		t.Run(tc.template, func(t *testing.T) {
			var sb sandboxInfo
			if code, raw := s.do("POST", "/api/sandboxes", map[string]any{"template": tc.template, "timeoutMs": 900000, "envs": tc.envs}, &sb); code >= 300 {
				t.Fatalf("create %s: %d %s", tc.template, code, raw)
			}
			defer s.do("DELETE", "/api/sandboxes/"+sb.SandboxID, nil, nil)
			if tc.setup != "" {
				s.sh(t, sb.SandboxID, tc.setup)
			}
			// The other agent is not in this template.
			other := map[string]string{"claude": "codex", "codex": "claude"}[tc.template]
			if code, raw := s.do("POST", "/api/sandboxes/"+sb.SandboxID+"/schedules", map[string]any{"every": "1h", "prompt": "hi", "agent": other}, nil); code != http.StatusBadRequest ||
				!strings.Contains(string(raw), `agent`) || !strings.Contains(string(raw), other) {
				t.Fatalf("a prompt for %s in the %s template: %d %s, want a 400 naming it", other, tc.template, code, raw)
			}
			prompt := "Reply with the secret word. Marker " + tc.template + "-prompt-8231"
			sc := s.schedule(t, sb.SandboxID, map[string]any{"every": "1h", "prompt": prompt, "model": tc.model, "reasoningEffort": tc.effort, "timeoutSeconds": 300})
			if sc.Kind != "prompt" || sc.Agent == nil || *sc.Agent != tc.template {
				t.Fatalf("schedule: %+v, want a prompt for %s (the template's agent)", sc, tc.template)
			}
			if code, raw := s.do("POST", "/api/sandbox-schedules/"+sc.ID+"/run", nil, nil); code != http.StatusOK {
				t.Fatalf("run: %d %s", code, raw)
			}
			runs := s.waitRuns(t, sc.ID, budget(3*time.Minute), "the agent's run", func(rs []runView) bool { return len(rs) == 1 && rs[0].Finished })
			r := runs[0]
			if r.Status != "succeeded" || r.Output == nil || !strings.Contains(*r.Output, answer) {
				t.Fatalf("the agent's run: %+v (output %q)", r, deref(r.Output))
			}
			// The prompt arrived, with the model and effort asked for.
			var seen bool
			for _, line := range m.requests(t) {
				var req struct {
					Path string          `json:"path"`
					Body json.RawMessage `json:"body"`
				}
				if json.Unmarshal([]byte(line), &req) != nil || !strings.Contains(string(req.Body), "-prompt-8231") || !strings.Contains(string(req.Body), tc.template) {
					continue
				}
				if strings.Contains(string(req.Body), `"`+tc.model+`"`) && strings.Contains(string(req.Body), `"`+tc.effort+`"`) {
					seen = true
				}
			}
			if !seen {
				t.Fatalf("no request with the prompt, model %s and effort %s reached the model endpoint; it saw:\n%s",
					tc.model, tc.effort, strings.Join(m.requests(t), "\n"))
			}
		})
	}
	s.waitNoLeaks(t)
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}
