package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/template/ocitest"
)

// TestDockerfileTemplate builds a template from testdata/custom/Dockerfile
// with the CLI, rebuilds it with the last line changed (only that step
// runs), and checks a sandbox from it: RUN, COPY, ENV, WORKDIR, USER and the
// start command already running.
func TestDockerfileTemplate(t *testing.T) {
	s := startServer(t, "")
	name := fmt.Sprintf("e2e-df-%d", time.Now().UnixNano()%1e9)
	build := func(dockerfile string) string {
		t.Helper()
		cmd := exec.Command(filepath.Join(s.bin, "lizard"), append(append([]string{"template", "build", name, "-f", dockerfile, "testdata/custom",
			"--template-dir", s.templateDir}, s.stateArgs()...), s.buildArgs()...)...)
		if r := os.Getenv("LIZARD_RUNSC"); r != "" {
			cmd.Args = append(cmd.Args, "--runsc", r)
		}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("build: %v\n%s", err, out)
		}
		return string(out)
	}
	build("testdata/custom/Dockerfile")

	// The same file with its last line changed.
	b, _ := os.ReadFile("testdata/custom/Dockerfile")
	edited := filepath.Join(t.TempDir(), "Dockerfile")
	os.WriteFile(edited, []byte(strings.Replace(string(b), `"8000"`, `"8001"`, 1)), 0o644)
	out := build(edited)
	if n := strings.Count(out, "CACHED"); n < 3 {
		t.Fatalf("rebuild after a one-line change reused %d steps, want every step before CMD:\n%s", n, out)
	}

	var sb sandboxInfo
	if code, body := s.do("POST", "/api/sandboxes", map[string]any{"template": name}, &sb); code >= 300 {
		t.Fatalf("create from %s: %d %s", name, code, body)
	}
	defer s.do("DELETE", "/api/sandboxes/"+sb.SandboxID, nil, nil)
	got := s.sh(t, sb.SandboxID, `cat run.txt app.txt who.txt; echo "$APP_MODE $(pwd) $(id -un)"; stat -c %U app.txt
for i in $(seq 1 50); do curl -s -o /dev/null http://127.0.0.1:8001/ && echo start-command-up && break; sleep 0.1; done`)
	want := "hello from RUN\ncopied from the context\nbuilt as user\ne2e /app user\nuser\nstart-command-up\n"
	if got != want {
		t.Fatalf("sandbox from the custom template:\n%q\nwant\n%q", got, want)
	}
	// The CLI cannot checkpoint for the server: the server makes the ready
	// state after this first create, and the next sandboxes start from it
	// with the same effects.
	s.waitReadyState(t, name)
	id, _ := s.createdAt(t, name, "")
	if got := s.sh(t, id, "cat run.txt; curl -s -o /dev/null -w '%{http_code}\\n' http://127.0.0.1:8001/"); got != "hello from RUN\n200\n" {
		t.Fatalf("sandbox from the ready state: %q", got)
	}
}

// TestTemplateBuildAPI: POST /api/templates builds a Dockerfile template
// for API clients; a bad Dockerfile or a failing RUN is a clear 4xx.
func TestTemplateBuildAPI(t *testing.T) {
	s := startServer(t, "")
	name := fmt.Sprintf("e2e-api-%d", time.Now().UnixNano()%1e9)
	var tpl struct {
		Name   string `json:"name"`
		Status string `json:"status"`
	}
	code, body := s.do("POST", "/api/templates", map[string]any{
		"name":       name,
		"dockerfile": "FROM base\nCOPY note.txt /note.txt\nRUN cat /note.txt > /api.txt\n",
		"files":      map[string]string{"note.txt": "ZnJvbSB0aGUgQVBJCg=="}, // "from the API\n"
	}, &tpl)
	if code != 201 || tpl.Name != name || tpl.Status != "ready" {
		t.Fatalf("build: %d %s", code, body)
	}
	var sb sandboxInfo
	if code, body := s.do("POST", "/api/sandboxes", map[string]any{"template": name}, &sb); code >= 300 {
		t.Fatalf("create: %d %s", code, body)
	}
	if got := s.sh(t, sb.SandboxID, "cat /api.txt"); got != "from the API\n" {
		t.Fatalf("sandbox: %q", got)
	}
	s.do("DELETE", "/api/sandboxes/"+sb.SandboxID, nil, nil)
	for _, c := range []struct {
		dockerfile string
		want       string
	}{
		{"FROM base\nFROBNICATE now\n", "FROBNICATE"},
		{"FROM base\nRUN echo boom >&2; exit 3\n", "exit code 3"},
		{"FROM 127.0.0.1:9/lizard/none:1\n", "registry 127.0.0.1:9 is refused"}, // before any connection
	} {
		code, body := s.do("POST", "/api/templates", map[string]any{"name": name + "-bad", "dockerfile": c.dockerfile}, nil)
		if code < 400 || code >= 500 || !strings.Contains(string(body), c.want) {
			t.Fatalf("%q: %d %s, want a 4xx naming %q", c.dockerfile, code, body, c.want)
		}
	}
	if ms, _ := filepath.Glob(filepath.Join(s.templateDir, ".projects", "*", name+"-bad")); len(ms) > 0 {
		t.Fatalf("a failed build left a template: %v", ms)
	}
	s.waitNoLeaks(t)
}

// TestTemplateFromImage: POST /api/templates builds FROM an image in a
// registry (a real one, on the loopback address); the image's CMD is the
// start command, kept running in the ready state, and a sandbox of the
// template serves at once, with the image's files and configuration.
func TestTemplateFromImage(t *testing.T) {
	host := ocitest.Registry(t)
	// The registry is on the loopback address: only the operator's
	// --registry-allow lets pulls reach it.
	s := startServer(t, "", "--registry-allow", host)
	ref := host + "/lizard/busybox:1"
	ocitest.PushBusybox(t, ref)
	name := fmt.Sprintf("e2e-img-%d", time.Now().UnixNano()%1e9)
	s.buildAPI(t, map[string]any{"name": name, "dockerfile": "FROM " + ref + "\nRUN echo \"$FOO\" > /www/env.txt\n"})
	id, _ := s.createdAt(t, name, "")
	got := s.sh(t, id, "wget -qO- http://127.0.0.1:8080/index.html; wget -qO- http://127.0.0.1:8080/env.txt; cat /etc/greeting; pwd")
	if want := "served from the image\nfrom-image\nfrom layer two\n/work\n"; got != want {
		t.Fatalf("sandbox of an image template:\n%q\nwant\n%q", got, want)
	}
}
