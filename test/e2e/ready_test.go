package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// removeTemplate removes a test's template: its name and every version.
func removeTemplate(name string) {
	os.RemoveAll(filepath.Join(templateDir(), name))
	os.Remove(filepath.Join(templateDir(), ".lock-"+name))
	vs, _ := filepath.Glob(filepath.Join(templateDir(), ".v", name+"@*"))
	for _, v := range vs {
		os.RemoveAll(v)
	}
}

// buildAPI builds a template through POST /api/templates and fails the test
// unless it is built.
func (s *server) buildAPI(t *testing.T, body map[string]any) {
	t.Helper()
	if code, raw := s.do("POST", "/api/templates", body, nil); code != 201 {
		t.Fatalf("build %v: %d %s", body["name"], code, raw)
	}
}

// createdAt creates a sandbox of tpl at size and returns its id and the
// host's clock (ns) just before the create.
func (s *server) createdAt(t *testing.T, tpl, size string) (string, int64) {
	t.Helper()
	before := time.Now().UnixNano()
	var sb sandboxInfo
	if code, body := s.do("POST", "/api/sandboxes", map[string]any{"template": tpl, "size": size}, &sb); code >= 300 {
		t.Fatalf("create from %s: %d %s", tpl, code, body)
	}
	t.Cleanup(func() { s.do("DELETE", "/api/sandboxes/"+sb.SandboxID, nil, nil) })
	return sb.SandboxID, before
}

// startedNs reads the time (ns) the start command wrote when it started.
func (s *server) startedNs(t *testing.T, id string) int64 {
	t.Helper()
	out := strings.TrimSpace(s.sh(t, id, "cat /tmp/started"))
	n, err := strconv.ParseInt(out, 10, 64)
	if err != nil {
		t.Fatalf("/tmp/started in %s: %q", id, out)
	}
	return n
}

// slowWeb is a Dockerfile whose start command takes 2 s before it serves.
const slowWeb = `FROM python
RUN mkdir -p /srv && echo %s > /srv/index.html
WORKDIR /srv
CMD ["sh", "-c", "sleep 2; date +%%s%%N > /tmp/started; exec python3 -m http.server --bind 127.0.0.1 8000"]
`

// TestTemplateReadyState: a template's start command is started at build
// and kept as a checkpoint of its ready state, so a sandbox's server
// answers the moment the create returns, started before the create; other
// sizes get their own state after their first create; a HEALTHCHECK says
// when it is ready; a start command that exits fails the build and leaves
// the old template.
func TestTemplateReadyState(t *testing.T) {
	s := startServer(t, "")
	name := fmt.Sprintf("e2e-ready-%d", time.Now().UnixNano()%1e9)
	s.buildAPI(t, map[string]any{"name": name, "dockerfile": fmt.Sprintf(slowWeb, "first")})

	for range 2 {
		id, before := s.createdAt(t, name, "")
		// No waiting: the server is up when the create answers.
		if got := s.sh(t, id, "curl -sf http://127.0.0.1:8000/index.html"); got != "first\n" {
			t.Fatalf("server in a new sandbox: %q", got)
		}
		if started := s.startedNs(t, id); started >= before {
			t.Fatalf("start command started at %d, after the create began (%d): not from the build's ready state", started, before)
		}
	}

	// Another size: the first create starts the command itself; a ready
	// state of that size follows in the background.
	const waitServing = "for i in $(seq 1 100); do curl -sf -o /dev/null http://127.0.0.1:8000/ && exit 0; sleep 0.1; done; exit 1"
	id, before := s.createdAt(t, name, "small")
	s.sh(t, id, waitServing)
	if started := s.startedNs(t, id); started < before {
		t.Fatalf("first small sandbox: start command started before the create")
	}
	fromState := false
	for deadline := time.Now().Add(budget(60 * time.Second)); time.Now().Before(deadline) && !fromState; time.Sleep(500 * time.Millisecond) {
		id, before := s.createdAt(t, name, "small")
		s.sh(t, id, waitServing) // started by the create, while the state is being made
		fromState = s.startedNs(t, id) < before
		s.do("DELETE", "/api/sandboxes/"+id, nil, nil)
	}
	if !fromState {
		t.Fatalf("no small sandbox started from a ready state within %v", budget(60*time.Second))
	}

	// HEALTHCHECK: the port opens at once, the check passes only later; a
	// sandbox must see what the check waited for.
	hc := name + "-hc"
	s.buildAPI(t, map[string]any{"name": hc, "dockerfile": `FROM python
HEALTHCHECK CMD test -f /tmp/warm
CMD ["sh", "-c", "python3 -m http.server 8000 & sleep 1.5; touch /tmp/warm; wait"]
`})
	id, _ = s.createdAt(t, hc, "")
	s.sh(t, id, "test -f /tmp/warm")

	// A command that daemonizes (exits 0, its server in the background)
	// is waited for like one that runs on.
	daemon := name + "-daemon"
	s.buildAPI(t, map[string]any{"name": daemon, "dockerfile": `FROM python
CMD ["sh", "-c", "(sleep 1; exec python3 -m http.server --bind 127.0.0.1 8000) > /dev/null 2>&1 &"]
`})
	id, _ = s.createdAt(t, daemon, "")
	s.sh(t, id, "curl -sf -o /dev/null http://127.0.0.1:8000/")

	// A start command that exits fails the build with its status and
	// output; the template stays as it was.
	code, body := s.do("POST", "/api/templates", map[string]any{"name": name, "dockerfile": `FROM base
CMD ["sh", "-c", "echo about to fail; exit 3"]
`}, nil)
	if code < 400 || code >= 500 || !strings.Contains(string(body), "status 3") || !strings.Contains(string(body), "about to fail") {
		t.Fatalf("failing start command: %d %s, want a 4xx with its status and output", code, body)
	}
	id, _ = s.createdAt(t, name, "")
	if got := s.sh(t, id, "curl -sf http://127.0.0.1:8000/index.html"); got != "first\n" {
		t.Fatalf("after a failed rebuild the template serves %q, want the old one's", got)
	}
}

// TestTemplateVersions: rebuilding a template leaves sandboxes and
// snapshots of the old version working on the old files; new sandboxes get
// the new version; versions nothing uses are removed.
func TestTemplateVersions(t *testing.T) {
	s := startServer(t, "")
	name := fmt.Sprintf("e2e-ver-%d", time.Now().UnixNano()%1e9)
	dockerfile := func(v string) map[string]any {
		return map[string]any{"name": name, "dockerfile": "FROM base\nRUN echo " + v + " > /version.txt\n"}
	}
	s.buildAPI(t, dockerfile("one"))
	old, _ := s.createdAt(t, name, "")
	var snap struct {
		ID string `json:"id"`
	}
	if code, body := s.do("POST", "/api/sandboxes/"+old+"/snapshot", map[string]any{"name": "v1"}, &snap); code >= 300 {
		t.Fatalf("snapshot: %d %s", code, body)
	}

	s.buildAPI(t, dockerfile("two"))
	// The old sandbox still reads its template's files, also ones it never
	// opened before the rebuild.
	if got := s.sh(t, old, "cat /version.txt; ls /usr/share/doc | grep -c . >/dev/null && echo docs"); got != "one\ndocs\n" {
		t.Fatalf("old sandbox after the rebuild: %q", got)
	}
	fresh, _ := s.createdAt(t, name, "")
	if got := s.sh(t, fresh, "cat /version.txt"); got != "two\n" {
		t.Fatalf("new sandbox: %q, want the new version", got)
	}
	var restored sandboxInfo
	if code, body := s.do("POST", "/api/sandboxes", map[string]any{"snapshotId": snap.ID}, &restored); code >= 300 {
		t.Fatalf("restore: %d %s", code, body)
	}
	if got := s.sh(t, restored.SandboxID, "cat /version.txt; cat /etc/debian_version >/dev/null && echo ok"); got != "one\nok\n" {
		t.Fatalf("restored snapshot of the old version: %q", got)
	}

	versions := func() int {
		vs, _ := filepath.Glob(filepath.Join(s.templateDir, ".projects", "*", ".v", name+"@*"))
		return len(vs)
	}
	if n := versions(); n != 2 {
		t.Fatalf("%d versions kept while the old one is in use, want 2", n)
	}
	// Once nothing uses it, the next build prunes the old version.
	for _, id := range []string{old, restored.SandboxID} {
		s.do("DELETE", "/api/sandboxes/"+id, nil, nil)
	}
	s.do("DELETE", "/api/sandbox-snapshots/"+snap.ID, nil, nil)
	s.buildAPI(t, dockerfile("three"))
	if n := versions(); n != 2 {
		t.Fatalf("%d versions after the old one was let go and a third built, want 2 (two, in use, and three)", n)
	}
	s.do("DELETE", "/api/sandboxes/"+fresh, nil, nil)
}

// logTail returns what a sandbox's log holds now (its last 50 lines).
func (s *server) logTail(t *testing.T, id string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), budget(time.Second))
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", s.url+"/api/sandboxes/"+id+"/logs?tail=50", nil)
	req.Header.Set("X-API-Key", s.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("logs of %s: %v", id, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body) // ends with the deadline: the stream follows
	return string(b)
}

// waitReadyState creates sandboxes of tpl until one starts from its ready
// state (its log says so), for a template built by the CLI, whose state the
// server makes after the first create.
func (s *server) waitReadyState(t *testing.T, tpl string) {
	t.Helper()
	for deadline := time.Now().Add(budget(60 * time.Second)); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		id, _ := s.createdAt(t, tpl, "")
		log := s.logTail(t, id)
		s.do("DELETE", "/api/sandboxes/"+id, nil, nil)
		if strings.Contains(log, "started from the ready state") {
			return
		}
	}
	t.Fatalf("no sandbox of %s started from a ready state within %v", tpl, budget(60*time.Second))
}

// TestReadyStateCrash: a server killed while it makes a template's ready
// state leaves nothing behind once it is back — the half-made sandbox is
// destroyed, the half-written image removed — and makes the state again.
func TestReadyStateCrash(t *testing.T) {
	s := startServer(t, "")
	name := fmt.Sprintf("e2e-crash-%d", time.Now().UnixNano()%1e9)
	df := filepath.Join(t.TempDir(), "Dockerfile")
	// Slow to get ready, so that the kill lands during the preparation.
	os.WriteFile(df, []byte("FROM python\nCMD [\"sh\", \"-c\", \"sleep 4; exec python3 -m http.server --bind 127.0.0.1 8000\"]\n"), 0o644)
	cmd := exec.Command(filepath.Join(s.bin, "lizard"), append(append([]string{"template", "build", name, "-f", df, "--template-dir", s.templateDir},
		s.stateArgs()...), s.buildArgs()...)...)
	if r := os.Getenv("LIZARD_RUNSC"); r != "" {
		cmd.Args = append(cmd.Args, "--runsc", r)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	// The server finds the new template within 10 s and starts on it.
	// Ready states are kept by project and name.
	readyDir := filepath.Join(s.dataDir, "ready", "*~"+name)
	for deadline := time.Now().Add(budget(20 * time.Second)); ; time.Sleep(100 * time.Millisecond) {
		if ents, _ := os.ReadDir(filepath.Join(s.dataDir, "sandboxes")); len(ents) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server did not start making the ready state within %v", budget(20*time.Second))
		}
	}
	s.crash()
	s.start()
	if !strings.Contains(s.logs(), "removing sandbox without a record") {
		t.Fatal("the restarted server did not destroy the half-made ready-state sandbox")
	}
	s.waitReadyState(t, name)
	vers, _ := filepath.Glob(filepath.Join(readyDir, "*", "*"))
	for _, v := range vers {
		if strings.Contains(filepath.Base(v), ".tmp-") {
			t.Errorf("half-written image left: %s", v)
		}
	}
	if code, body := s.do("DELETE", "/api/templates/"+name, nil, nil); code != 204 {
		t.Fatalf("delete the template: %d %s", code, body)
	}
	s.waitNoLeaks(t)
}
