package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/lizard-build/lizard/internal/api"
)

// sandboxCLI runs `lizard sandbox ARGS` against s and returns stdout, stderr and
// the exit status.
func (s *server) sandboxCLI(t *testing.T, args ...string) (stdout, stderr string, status int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), budget(2*time.Minute))
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(s.bin, "lizard"), append([]string{"sandbox"}, args...)...)
	cmd.Env = append(os.Environ(), "LIZARD_API_URL="+s.url, "LIZARD_API_KEY="+s.key)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		status = ee.ExitCode()
	case err != nil:
		t.Fatalf("lizard sandbox %q: %v", args, err)
	}
	return o.String(), e.String(), status
}

// sandboxCLIJSON runs the CLI, wants status 0, and decodes its stdout into out.
func (s *server) sandboxCLIJSON(t *testing.T, out any, args ...string) {
	t.Helper()
	stdout, stderr, status := s.sandboxCLI(t, args...)
	if status != 0 {
		t.Fatalf("lizard sandbox %q: status %d\n%s%s", args, status, stdout, stderr)
	}
	if err := json.Unmarshal([]byte(stdout), out); err != nil {
		t.Fatalf("lizard sandbox %q: decoding %q: %v", args, stdout, err)
	}
}

func TestSandboxCLI(t *testing.T) {
	s := startServer(t, "")

	var sb sandboxInfo
	s.sandboxCLIJSON(t, &sb, "create", "--template", "base", "--timeout", "10m", "--json")
	if sb.SandboxID == "" || sb.Status != "running" {
		t.Fatalf("create --json: %+v", sb)
	}
	id := sb.SandboxID
	defer s.do("DELETE", "/api/sandboxes/"+id, nil, nil)

	var list []sandboxInfo
	s.sandboxCLIJSON(t, &list, "ls", "--json")
	if !slices.ContainsFunc(list, func(x sandboxInfo) bool { return x.SandboxID == id }) {
		t.Fatalf("ls --json misses %s: %+v", id, list)
	}
	if out, _, st := s.sandboxCLI(t, "ls"); st != 0 || !strings.Contains(out, id) || !strings.HasPrefix(out, "ID") {
		t.Fatalf("ls table: status %d\n%s", st, out)
	}

	var rep execReply
	s.sandboxCLIJSON(t, &rep, "exec", id, "--json", "echo hi; echo there >&2")
	if rep.Stdout != "hi\n" || rep.Stderr != "there\n" || rep.ExitCode != 0 {
		t.Fatalf("exec --json: %+v", rep)
	}
	// Streamed, with the command's status; argv after --.
	out, errOut, st := s.sandboxCLI(t, "exec", id, "echo out; echo err >&2; exit 4")
	if out != "out\n" || errOut != "err\n" || st != 4 {
		t.Fatalf("exec: status %d, stdout %q, stderr %q; want 4, out, err", st, out, errOut)
	}
	if out, _, st := s.sandboxCLI(t, "exec", id, "--env", "A=b c", "--", "printenv", "A"); out != "b c\n" || st != 0 {
		t.Fatalf("exec -- argv: status %d, %q", st, out)
	}

	// cp there and back, byte for byte.
	seed := make([]byte, 8)
	rand.Read(seed)
	t.Logf("random content seed %s", hex.EncodeToString(seed))
	content := bytes.Repeat(append(seed, 0, 255, '\n'), 50000)
	dir := t.TempDir()
	local := filepath.Join(dir, "in.bin")
	if err := os.WriteFile(local, content, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, e, st := s.sandboxCLI(t, "cp", local, id+":/tmp/sub/copy.bin"); st != 0 {
		t.Fatalf("cp up: status %d %s", st, e)
	}
	if _, e, st := s.sandboxCLI(t, "cp", id+":/tmp/sub/copy.bin", filepath.Join(dir, "back.bin")); st != 0 {
		t.Fatalf("cp down: status %d %s", st, e)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "back.bin")); !bytes.Equal(got, content) {
		t.Fatalf("cp round trip: %d bytes back, want %d equal bytes", len(got), len(content))
	}
	if out, _, _ := s.sandboxCLI(t, "exec", id, "sha256sum < /tmp/sub/copy.bin"); len(out) < 64 {
		t.Fatalf("sha256sum in the sandbox: %q", out)
	}
	if _, e, st := s.sandboxCLI(t, "cp", id+":/tmp/missing", filepath.Join(dir, "x")); st == 0 || !strings.Contains(e, "404") {
		t.Fatalf("cp of a missing file: status %d %q, want a 404 error", st, e)
	}

	// logs without -f ends, and holds the exec.
	if out, _, st := s.sandboxCLI(t, "logs", id); st != 0 || !strings.Contains(out, "printenv A") {
		t.Fatalf("logs: status %d\n%s", st, out)
	}

	var killed []struct {
		SandboxID string `json:"sandboxId"`
		Killed    bool   `json:"killed"`
	}
	s.sandboxCLIJSON(t, &killed, "kill", id, "--json")
	if len(killed) != 1 || killed[0].SandboxID != id || !killed[0].Killed {
		t.Fatalf("kill --json: %+v", killed)
	}
	list = nil
	s.sandboxCLIJSON(t, &list, "ls", "--json")
	if slices.ContainsFunc(list, func(x sandboxInfo) bool { return x.SandboxID == id }) {
		t.Fatalf("ls --json still lists killed %s", id)
	}
	if _, e, st := s.sandboxCLI(t, "info", id); st != 1 || !strings.Contains(e, "404") {
		t.Fatalf("info of a killed sandbox: status %d %q", st, e)
	}
}

// dialTerminal opens the terminal route with the key as a subprotocol,
// as a browser would.
func dialTerminal(ctx context.Context, s *server, key, id string, q url.Values) (*websocket.Conn, *http.Response, error) {
	u := "ws" + strings.TrimPrefix(s.url, "http") + "/api/sandboxes/" + id + "/terminal?" + q.Encode()
	return websocket.Dial(ctx, u, &websocket.DialOptions{
		Subprotocols: []string{api.TerminalProtocol, api.TerminalKeyProtocol + key},
	})
}

func TestTerminalRoute(t *testing.T) {
	s := startServer(t, "")
	id := s.create(t)
	defer s.do("DELETE", "/api/sandboxes/"+id, nil, nil)
	s.cli(t, "projects", "create", "terminal-other")
	other := s.newKey(t, "terminal-other")
	ctx, cancel := context.WithTimeout(context.Background(), budget(2*time.Minute))
	defer cancel()

	// Refusals are the API's JSON errors, before any upgrade.
	refusals := []struct {
		name, key, id, query string
		status               int
	}{
		{"no key", "", id, "", 401},
		{"wrong key", "lz_not_a_key", id, "", 401},
		{"another project's key", other, id, "", 404},
		{"unknown sandbox", s.key, "nosuchsandbox", "", 404},
		{"bad cols", s.key, id, "cols=0", 400},
		{"bad rows", s.key, id, "rows=x", 400},
	}
	for _, r := range refusals {
		t.Run(r.name, func(t *testing.T) {
			q, _ := url.ParseQuery(r.query)
			_, resp, err := dialTerminal(ctx, s, r.key, r.id, q)
			if err == nil || resp == nil || resp.StatusCode != r.status {
				t.Fatalf("dial: %v, response %v; want status %d", err, resp, r.status)
			}
			code, body := s.doKey(r.key, "GET", "/api/sandboxes/"+r.id+"/terminal?"+r.query, nil, nil)
			var e struct{ Code, Message string }
			if code != r.status || json.Unmarshal(body, &e) != nil || e.Code == "" {
				t.Fatalf("plain GET: %d %s; want %d with a JSON error", code, body, r.status)
			}
		})
	}
	if code, body := s.do("GET", "/api/sandboxes/"+id+"/terminal", nil, nil); code != 400 || !strings.Contains(string(body), "websocket_required") {
		t.Fatalf("GET without upgrade: %d %s", code, body)
	}

	// A command on the terminal, with the key in the subprotocol: its
	// output as binary messages, then the exit message, then a normal close.
	q := url.Values{"cols": {"91"}, "rows": {"17"}, "cmd": {"stty size; echo TERM=$TERM; read x; echo got $x; exit 7"}}
	c, _, err := dialTerminal(ctx, s, s.key, id, q)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer c.CloseNow()
	if c.Subprotocol() != api.TerminalProtocol {
		t.Fatalf("subprotocol %q, want %q", c.Subprotocol(), api.TerminalProtocol)
	}
	var out strings.Builder
	sent := false
	for {
		typ, data, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("read: %v; output so far %q", err, out.String())
		}
		if typ == websocket.MessageBinary {
			out.Write(data)
			if !sent && strings.Contains(out.String(), "TERM=xterm-256color") {
				sent = true
				if err := c.Write(ctx, websocket.MessageBinary, []byte("yes\r")); err != nil {
					t.Fatal(err)
				}
			}
			continue
		}
		var m api.TerminalControl
		if err := json.Unmarshal(data, &m); err != nil || m.Type != "exit" || m.ExitCode == nil {
			t.Fatalf("text message %q", data)
		}
		if *m.ExitCode != 7 {
			t.Fatalf("exit code %d, want 7; output %q", *m.ExitCode, out.String())
		}
		break
	}
	for _, want := range []string{"17 91", "TERM=xterm-256color", "got yes"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("terminal output %q lacks %q", out.String(), want)
		}
	}
	if _, _, err := c.Read(ctx); websocket.CloseStatus(err) != websocket.StatusNormalClosure {
		t.Fatalf("after the exit: %v, want a normal close", err)
	}

	// The key may come as ?api_key= too.
	u := "ws" + strings.TrimPrefix(s.url, "http") + "/api/sandboxes/" + id + "/terminal?" +
		url.Values{"api_key": {s.key}, "cmd": {"exit 0"}}.Encode()
	qc, _, err := websocket.Dial(ctx, u, nil)
	if err != nil {
		t.Fatalf("dial with ?api_key=: %v", err)
	}
	for {
		typ, data, err := qc.Read(ctx)
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		if typ == websocket.MessageText {
			if string(data) != `{"type":"exit","exitCode":0}` {
				t.Fatalf("exit message %s", data)
			}
			break
		}
	}
	qc.CloseNow()

	// A client that goes away hangs the terminal's processes up.
	c, _, err = dialTerminal(ctx, s, s.key, id, url.Values{"cmd": {"sleep 1000"}})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	waitSandbox(t, s, id, "sleep 1000 runs", func(ps string) bool { return ps != "" })
	c.CloseNow()
	waitSandbox(t, s, id, "sleep 1000 is gone after the client left", func(ps string) bool { return ps == "" })
}

// waitSandbox polls `pgrep -f 'sleep 1000'` in the sandbox until ok
// accepts its output.
func waitSandbox(t *testing.T, s *server, id, what string, ok func(string) bool) {
	t.Helper()
	deadline := time.Now().Add(budget(30 * time.Second))
	for {
		ps := s.sh(t, id, "pgrep -x -f 'sleep 1000' || true")
		if ok(ps) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting until %s: pgrep says %q", what, ps)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// tmux drives a real terminal on a private tmux server.
type tmux struct {
	t      *testing.T
	socket string
}

func newTmux(t *testing.T) *tmux {
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Skip("tmux not installed (scripts/install-deps.sh installs it)")
	}
	// A socket of its own in the test's directory, which goes with it.
	x := &tmux{t: t, socket: filepath.Join(t.TempDir(), "tmux")}
	t.Cleanup(func() { exec.Command("tmux", "-S", x.socket, "kill-server").Run() })
	return x
}

func (x *tmux) run(args ...string) string {
	x.t.Helper()
	out, err := exec.Command("tmux", append([]string{"-S", x.socket}, args...)...).CombinedOutput()
	if err != nil {
		x.t.Fatalf("tmux %q: %v %s", args, err, out)
	}
	return string(out)
}

func (x *tmux) screen() string {
	x.t.Helper()
	return x.run("capture-pane", "-p", "-t", "term", "-S", "-200")
}

// waitScreen waits until the pane shows want, typing keys (when any) again
// every second meanwhile.
func (x *tmux) waitScreen(want string, keys ...string) {
	x.t.Helper()
	deadline := time.Now().Add(budget(60 * time.Second))
	for i := 0; ; i++ {
		if len(keys) > 0 && i%10 == 0 {
			x.run(append([]string{"send-keys", "-t", "term"}, keys...)...)
		}
		if strings.Contains(x.screen(), want) {
			return
		}
		if time.Now().After(deadline) {
			x.t.Fatalf("the terminal never showed %q:\n%s", want, x.screen())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestSandboxShell(t *testing.T) {
	s := startServer(t, "")
	id := s.create(t)
	defer s.do("DELETE", "/api/sandboxes/"+id, nil, nil)
	x := newTmux(t)
	status := filepath.Join(t.TempDir(), "status")
	shell := fmt.Sprintf("LIZARD_API_URL=%s LIZARD_API_KEY=%s %s sandbox shell %s; echo $? > %s",
		s.url, s.key, filepath.Join(s.bin, "lizard"), id, status)
	x.run("new-session", "-d", "-s", "term", "-x", "100", "-y", "30", shell)

	x.waitScreen("ready 42", "echo ready $((40+2))", "Enter")
	x.run("send-keys", "-t", "term", "echo hel''lo", "Enter")
	x.waitScreen("hello")
	x.waitScreen("$USER@$(pwd)=root@/root", "echo '$USER@$(pwd)'=$USER@$(pwd)", "Enter")

	// The pane is the window less tmux's status line: ask tmux.
	size := func() string {
		return strings.TrimSpace(x.run("display", "-p", "-t", "term", "#{pane_height} #{pane_width}"))
	}
	x.waitScreen(size(), "stty size", "Enter")
	x.run("resize-window", "-t", "term", "-x", "120", "-y", "40")
	if got := size(); !strings.HasSuffix(got, " 120") {
		t.Fatalf("tmux pane after resize-window: %s", got)
	}
	x.waitScreen(size(), "stty size", "Enter")

	// Ctrl-C reaches the sandbox's foreground job, not the CLI.
	x.run("send-keys", "-t", "term", "sleep 100", "Enter")
	deadline := time.Now().Add(budget(30 * time.Second))
	for s.sh(t, id, "pgrep -x sleep || true") == "" {
		if time.Now().After(deadline) {
			t.Fatalf("sleep never ran:\n%s", x.screen())
		}
		time.Sleep(100 * time.Millisecond)
	}
	x.run("send-keys", "-t", "term", "C-c")
	x.run("send-keys", "-t", "term", "echo rc=$?", "Enter")
	x.waitScreen("rc=130")

	x.run("send-keys", "-t", "term", "exit 3", "Enter")
	deadline = time.Now().Add(budget(30 * time.Second))
	for {
		b, err := os.ReadFile(status)
		if err == nil && strings.TrimSpace(string(b)) != "" {
			if got := strings.TrimSpace(string(b)); got != "3" {
				t.Fatalf("lizard sandbox shell exited %s, want 3", got)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the CLI did not exit after `exit 3`:\n%s", x.screen())
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The shell is gone from the sandbox.
	if out := s.sh(t, id, "pgrep -x bash || true"); out != "" {
		t.Fatalf("bash still runs after exit: %q", out)
	}
}
