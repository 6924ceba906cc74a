package mcp

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/lizard-build/lizard/internal/api"
	"github.com/lizard-build/lizard/internal/apikey"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/sandbox/desktop"
	"github.com/lizard-build/lizard/internal/sandbox/preview"
	"github.com/lizard-build/lizard/internal/sandbox/sandboxtest"
	"github.com/lizard-build/lizard/internal/sandbox/snapshot"
	"github.com/lizard-build/lizard/internal/sandbox/usage"
)

// These tests run the MCP server as `lizard serve` wires it: the real API
// handler (api.Handler, with /mcp) over the real sandbox service, on the
// fake runtime (sandboxtest: no root; a sandbox's commands run on the host
// as the test's user, its "filesystem" is the host's). Only what needs a
// real sandbox (the code interpreter, a desktop) is left to the e2e tests.

const (
	testKey  = "lz_mcp_test_key_0123456789abcdef"
	otherKey = "lz_mcp_other_key_0123456789abcdef"
)

// stack is an API server with MCP at /mcp.
type stack struct {
	url string
	// shutDown is the server's shutdown beginning (HandlerConfig.Serving
	// ends).
	shutDown context.CancelFunc
}

func newStack(t *testing.T) *stack {
	t.Helper()
	env := sandboxtest.NewEnv(t)
	ctx := context.Background()
	if _, err := env.Store.CreateKey(ctx, env.Project.ID, testKey); err != nil {
		t.Fatal(err)
	}
	other, err := env.Store.CreateProject(ctx, "other", "other")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.Store.CreateKey(ctx, other.ID, otherKey); err != nil {
		t.Fatal(err)
	}
	log := sandboxtest.Logger(t)
	keys, err := apikey.Open(ctx, apikey.Config{Store: env.Store, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { keys.Close() })
	svc := sandbox.New(sandbox.Config{Runtime: env.Runtime, Store: env.Store, Templates: env.Templates,
		SnapshotDir: env.SnapshotDir, LogDir: t.TempDir(), Logger: log})
	if err := svc.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	snaps := snapshot.New(snapshot.Config{Core: svc, Runtime: env.Runtime, Store: env.Store, Dir: env.SnapshotDir, Logger: log})
	if err := snaps.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(snaps.Close)
	ports := preview.New(svc)
	var apiHandler http.Handler
	serving, shutDown := context.WithCancel(ctx)
	t.Cleanup(shutDown)
	mcpHTTP := Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { apiHandler.ServeHTTP(w, r) }),
		HandlerConfig{Version: "test", Logger: log, Serving: serving})
	apiHandler = api.Handler(api.Config{Keys: keys, Sandboxes: svc, Snapshots: snaps, Copies: snaps, Usage: usage.New(svc, env.Runtime, log), Ports: ports,
		Desktops: desktop.New(svc, ports), Previews: api.PreviewURLs{Domain: "sandbox.localhost", Scheme: "http", Port: "8081"},
		MCP: mcpHTTP, Logger: log})
	srv := httptest.NewServer(apiHandler)
	t.Cleanup(srv.Close)
	return &stack{url: srv.URL, shutDown: shutDown}
}

// keyed adds an API key to every request.
type keyed struct {
	key    string
	bearer bool
}

func (k keyed) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if k.bearer {
		r.Header.Set("Authorization", "Bearer "+k.key)
	} else {
		r.Header.Set("X-API-Key", k.key)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// connect is an official Go SDK client of the stack's /mcp with key.
func (s *stack) connect(t *testing.T, key string, opts *sdk.ClientOptions) *sdk.ClientSession {
	t.Helper()
	tr := &sdk.StreamableClientTransport{Endpoint: s.url + "/mcp", HTTPClient: &http.Client{Transport: keyed{key: key, bearer: key == otherKey}}}
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "test", Version: "1"}, opts).Connect(context.Background(), tr, nil)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// call calls a tool that must succeed and returns its result.
func call(t *testing.T, cs *sdk.ClientSession, tool string, args map[string]any) *sdk.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &sdk.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	if res.IsError {
		t.Fatalf("%s %v: tool error %q", tool, args, resultText(res))
	}
	return res
}

// structured decodes a result's structured content.
func structured(t *testing.T, res *sdk.CallToolResult, v any) {
	t.Helper()
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("structured content %s: %v", b, err)
	}
}

// toolError calls a tool that must fail with a tool error mentioning want.
func toolError(t *testing.T, cs *sdk.ClientSession, tool string, args map[string]any, want string) {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &sdk.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: a protocol error %v, want a tool error", tool, err)
	}
	if !res.IsError || !strings.Contains(resultText(res), want) {
		t.Fatalf("%s %v: isError %v %q, want a tool error mentioning %q", tool, args, res.IsError, resultText(res), want)
	}
}

func createSandbox(t *testing.T, cs *sdk.ClientSession) string {
	t.Helper()
	var info struct {
		SandboxID string `json:"sandboxId"`
		Template  string `json:"template"`
		TimeoutMs int64  `json:"timeoutMs"`
	}
	structured(t, call(t, cs, "create_sandbox", map[string]any{"envs": map[string]string{"GREETING": "hi"}}), &info)
	if info.SandboxID == "" || info.Template != "base" || info.TimeoutMs != defaultLifetime*1000 {
		t.Fatalf("create_sandbox: %+v", info)
	}
	return info.SandboxID
}

// TestHTTP drives the tools over Streamable HTTP with the Go SDK's client
// (which speaks the current revision, without sessions): a sandbox's
// lifecycle, commands, background commands, files and resources, each
// answer the API's.
func TestHTTP(t *testing.T) {
	s := newStack(t)
	cs := s.connect(t, testKey, nil)
	if v := cs.InitializeResult().ProtocolVersion; v != statelessVersion {
		t.Errorf("negotiated protocol %q, want the current revision %q", v, statelessVersion)
	}
	id := createSandbox(t, cs)

	var list struct {
		Sandboxes []struct {
			SandboxID string `json:"sandboxId"`
		} `json:"sandboxes"`
	}
	structured(t, call(t, cs, "list_sandboxes", nil), &list)
	if len(list.Sandboxes) != 1 || list.Sandboxes[0].SandboxID != id {
		t.Fatalf("list_sandboxes: %+v", list)
	}

	// A command: exit code, both streams, the sandbox's envs.
	var run struct {
		ExitCode  int    `json:"exitCode"`
		Stdout    string `json:"stdout"`
		Stderr    string `json:"stderr"`
		Truncated bool   `json:"truncated"`
	}
	res := call(t, cs, "run_command", map[string]any{"sandboxId": id, "command": `echo "$GREETING $X"; echo oops >&2; exit 3`, "envs": map[string]string{"X": "there"}})
	structured(t, res, &run)
	if run.ExitCode != 3 || run.Stdout != "hi there\n" || run.Stderr != "oops\n" || run.Truncated {
		t.Fatalf("run_command: %+v", run)
	}
	if text := resultText(res); !strings.Contains(text, "exit code 3") || !strings.Contains(text, "--- stdout ---\nhi there") {
		t.Fatalf("run_command's text: %q", text)
	}
	// Output over the cap: the first and last halves, and the cap said.
	structured(t, call(t, cs, "run_command", map[string]any{"sandboxId": id, "command": `printf 'start'; head -c 100000 /dev/zero | tr '\0' x; printf 'end'`}), &run)
	if !run.Truncated || len(run.Stdout) > outputCap+200 || !strings.HasPrefix(run.Stdout, "startxx") || !strings.HasSuffix(run.Stdout, "xxend\n") ||
		!strings.Contains(run.Stdout, fmt.Sprintf("the output was 100009 bytes, more than the cap of %d", outputCap)) {
		t.Fatalf("a long output: truncated %v, %d bytes: %.100q…", run.Truncated, len(run.Stdout), run.Stdout)
	}

	// Files: text and base64, a listing, the file as a resource.
	dir := t.TempDir()
	call(t, cs, "write_file", map[string]any{"sandboxId": id, "path": dir + "/hello.py", "content": "print('hello from python')\n"})
	bin := []byte{0, 1, 2, 0xff, 'x'}
	call(t, cs, "write_file", map[string]any{"sandboxId": id, "path": dir + "/bin.dat", "content": base64.StdEncoding.EncodeToString(bin), "encoding": "base64"})
	if got := resultText(call(t, cs, "read_file", map[string]any{"sandboxId": id, "path": dir + "/hello.py"})); got != "print('hello from python')\n" {
		t.Fatalf("read_file text: %q", got)
	}
	if got := resultText(call(t, cs, "read_file", map[string]any{"sandboxId": id, "path": dir + "/bin.dat", "encoding": "base64"})); got != base64.StdEncoding.EncodeToString(bin) {
		t.Fatalf("read_file base64: %q", got)
	}
	toolError(t, cs, "read_file", map[string]any{"sandboxId": id, "path": dir + "/bin.dat"}, "not UTF-8 text")
	toolError(t, cs, "read_file", map[string]any{"sandboxId": id, "path": dir + "/missing"}, "404")
	var ls struct {
		Entries []struct {
			Name string `json:"name"`
			Type string `json:"type"`
			Size int64  `json:"size"`
		} `json:"entries"`
	}
	structured(t, call(t, cs, "list_directory", map[string]any{"sandboxId": id, "path": dir}), &ls)
	if len(ls.Entries) != 2 || ls.Entries[0].Name != "bin.dat" || ls.Entries[0].Size != 5 || ls.Entries[1].Name != "hello.py" {
		t.Fatalf("list_directory: %+v", ls)
	}
	rr, err := cs.ReadResource(context.Background(), &sdk.ReadResourceParams{URI: "lizard://sandboxes/" + id + "/files" + dir + "/hello.py"})
	if err != nil || len(rr.Contents) != 1 || rr.Contents[0].Text != "print('hello from python')\n" || rr.Contents[0].MIMEType != "text/x-python; charset=utf-8" && rr.Contents[0].MIMEType != "text/plain" {
		t.Fatalf("file resource: %v %+v", err, rr)
	}
	rr, err = cs.ReadResource(context.Background(), &sdk.ReadResourceParams{URI: "lizard://sandboxes/" + id + "/files" + dir + "/bin.dat"})
	if err != nil || len(rr.Contents) != 1 || string(rr.Contents[0].Blob) != string(bin) {
		t.Fatalf("binary file resource: %v %+v", err, rr)
	}
	if _, err := cs.ReadResource(context.Background(), &sdk.ReadResourceParams{URI: "lizard://sandboxes/" + id + "/files" + dir + "/missing"}); err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("a missing file's resource: %v, want the API's 404", err)
	}
	rr, err = cs.ReadResource(context.Background(), &sdk.ReadResourceParams{URI: "lizard://sandboxes/" + id + "/logs"})
	if err != nil || !strings.Contains(rr.Contents[0].Text, "stdout") || !strings.Contains(rr.Contents[0].Text, "hi there") {
		t.Fatalf("log resource: %v %+v", err, rr)
	}

	// A background command: started at once, its output read later.
	var started struct {
		CommandID string `json:"commandId"`
		Pid       int    `json:"pid"`
	}
	structured(t, call(t, cs, "start_command", map[string]any{"sandboxId": id, "command": "echo one; sleep 1; echo two; exit 7"}), &started)
	if len(started.CommandID) != 16 || started.Pid <= 0 {
		t.Fatalf("start_command: %+v", started)
	}
	type readOut struct {
		Running    bool   `json:"running"`
		ExitCode   *int   `json:"exitCode"`
		Output     string `json:"output"`
		NextOffset int64  `json:"nextOffset"`
		TotalBytes int64  `json:"totalBytes"`
	}
	var out readOut
	structured(t, call(t, cs, "read_command_output", map[string]any{"sandboxId": id, "commandId": started.CommandID, "waitSeconds": 20}), &out)
	if out.Running || out.ExitCode == nil || *out.ExitCode != 7 || out.Output != "one\ntwo\n" || out.NextOffset != 8 || out.TotalBytes != 8 {
		t.Fatalf("read_command_output: %+v", out)
	}
	out = readOut{}
	structured(t, call(t, cs, "read_command_output", map[string]any{"sandboxId": id, "commandId": started.CommandID, "offset": 4}), &out)
	if out.Output != "two\n" || out.NextOffset != 8 {
		t.Fatalf("read_command_output from 4: %+v", out)
	}
	// One that runs on until stopped.
	structured(t, call(t, cs, "start_command", map[string]any{"sandboxId": id, "command": "echo up; exec sleep 300"}), &started)
	out = readOut{}
	structured(t, call(t, cs, "read_command_output", map[string]any{"sandboxId": id, "commandId": started.CommandID}), &out)
	if !out.Running || out.ExitCode != nil {
		t.Fatalf("a running command: %+v", out)
	}
	call(t, cs, "stop_command", map[string]any{"sandboxId": id, "commandId": started.CommandID, "signal": "SIGKILL"})
	out = readOut{}
	structured(t, call(t, cs, "read_command_output", map[string]any{"sandboxId": id, "commandId": started.CommandID, "waitSeconds": 10}), &out)
	if out.Running || out.ExitCode != nil || out.Output != "up\n" {
		t.Fatalf("a stopped command: %+v", out)
	}
	toolError(t, cs, "read_command_output", map[string]any{"sandboxId": id, "commandId": "0123456789abcdef"}, "no command 0123456789abcdef")

	// What needs a template the fake has not: the API's or the tool's
	// clear refusal.
	toolError(t, cs, "run_code", map[string]any{"sandboxId": id, "code": "print(1)"}, "runs no code interpreter")
	toolError(t, cs, "desktop_screenshot", map[string]any{"sandboxId": id}, "desktop")

	// Ports: the URL and the token.
	var port struct {
		URL         string `json:"url"`
		Hostname    string `json:"hostname"`
		AccessToken string `json:"accessToken"`
	}
	structured(t, call(t, cs, "expose_port", map[string]any{"sandboxId": id, "port": 3000}), &port)
	if port.Hostname != id+"-3000.sandbox.localhost:8081" || port.AccessToken == "" || !strings.Contains(port.URL, port.AccessToken) {
		t.Fatalf("expose_port: %+v", port)
	}

	call(t, cs, "kill_sandbox", map[string]any{"sandboxId": id})
	toolError(t, cs, "get_sandbox", map[string]any{"sandboxId": id}, "not found")
}

// TestHTTPCheckpoints: pause and resume, a snapshot restored, a fork, a
// timeout, each the API's answer (the fake runtime keeps a sandbox's home
// directory across them, not its processes).
func TestHTTPCheckpoints(t *testing.T) {
	s := newStack(t)
	cs := s.connect(t, testKey, nil)
	id := createSandbox(t, cs)
	type info struct {
		SandboxID string `json:"sandboxId"`
		Status    string `json:"status"`
		TimeoutMs int64  `json:"timeoutMs"`
	}
	status := func(res *sdk.CallToolResult) string {
		var i info
		structured(t, res, &i)
		return i.Status
	}
	call(t, cs, "run_command", map[string]any{"sandboxId": id, "command": "echo kept > $HOME/state"})
	if st := status(call(t, cs, "pause_sandbox", map[string]any{"sandboxId": id})); st != "paused" {
		t.Fatalf("pause_sandbox: status %q", st)
	}
	toolError(t, cs, "run_command", map[string]any{"sandboxId": id, "command": "true"}, "paused")
	if st := status(call(t, cs, "resume_sandbox", map[string]any{"sandboxId": id})); st != "running" {
		t.Fatalf("resume_sandbox: status %q", st)
	}
	var paused struct {
		Status      string `json:"status"`
		PauseMemory *bool  `json:"pauseMemory"`
	}
	structured(t, call(t, cs, "pause_sandbox", map[string]any{"sandboxId": id, "filesOnly": true}), &paused)
	if paused.Status != "paused" || paused.PauseMemory == nil || *paused.PauseMemory {
		t.Fatalf("pause_sandbox filesOnly: %+v", paused)
	}
	if st := status(call(t, cs, "resume_sandbox", map[string]any{"sandboxId": id})); st != "running" {
		t.Fatalf("resume_sandbox after a files-only pause: status %q", st)
	}
	var snap struct {
		ID   string `json:"id"`
		Name string `json:"name"`
	}
	structured(t, call(t, cs, "snapshot_sandbox", map[string]any{"sandboxId": id, "name": "before"}), &snap)
	if snap.ID == "" || snap.Name != "before" {
		t.Fatalf("snapshot_sandbox: %+v", snap)
	}
	var restored info
	structured(t, call(t, cs, "restore_snapshot", map[string]any{"snapshotId": snap.ID, "timeoutSeconds": 120}), &restored)
	if restored.SandboxID == "" || restored.SandboxID == id || restored.Status != "running" || restored.TimeoutMs != 120_000 {
		t.Fatalf("restore_snapshot: %+v", restored)
	}
	var r struct {
		Stdout string `json:"stdout"`
	}
	structured(t, call(t, cs, "run_command", map[string]any{"sandboxId": restored.SandboxID, "command": "cat $HOME/state"}), &r)
	if r.Stdout != "kept\n" {
		t.Fatalf("the restored sandbox's file: %q", r.Stdout)
	}
	var forks struct {
		Forks []struct {
			Sandbox *info  `json:"sandbox"`
			Error   string `json:"error"`
		} `json:"forks"`
	}
	structured(t, call(t, cs, "fork_sandbox", map[string]any{"sandboxId": id, "count": 2}), &forks)
	if len(forks.Forks) != 2 || forks.Forks[0].Sandbox == nil || forks.Forks[1].Sandbox == nil || forks.Forks[0].Sandbox.SandboxID == forks.Forks[1].Sandbox.SandboxID {
		t.Fatalf("fork_sandbox: %+v", forks)
	}
	call(t, cs, "set_sandbox_timeout", map[string]any{"sandboxId": id, "timeoutSeconds": 60})
	var after info
	structured(t, call(t, cs, "get_sandbox", map[string]any{"sandboxId": id}), &after)
	if after.TimeoutMs != 60_000 {
		t.Fatalf("set_sandbox_timeout: %+v", after)
	}
}

// TestHTTPIsolation: a key sees only its project's sandboxes, through
// MCP as through the API; a wrong key gets no session.
func TestHTTPIsolation(t *testing.T) {
	s := newStack(t)
	id := createSandbox(t, s.connect(t, testKey, nil))
	other := s.connect(t, otherKey, nil) // with Authorization: Bearer
	for _, tool := range []string{"get_sandbox", "kill_sandbox", "pause_sandbox"} {
		toolError(t, other, tool, map[string]any{"sandboxId": id}, "not found (404")
	}
	toolError(t, other, "run_command", map[string]any{"sandboxId": id, "command": "true"}, "not found (404")
	var list struct {
		Sandboxes []any `json:"sandboxes"`
	}
	structured(t, call(t, other, "list_sandboxes", nil), &list)
	if len(list.Sandboxes) != 0 {
		t.Fatalf("the other project sees %v", list.Sandboxes)
	}
	if _, err := other.ReadResource(context.Background(), &sdk.ReadResourceParams{URI: "lizard://sandboxes/" + id + "/logs"}); err == nil {
		t.Fatal("the other project reads the sandbox's log")
	}

	for _, key := range []string{"", "lz_not_a_key"} {
		req, _ := http.NewRequest("POST", s.url+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 401 || !strings.Contains(string(body), "api_key") {
			t.Fatalf("key %q: %d %s, want the API's 401", key, resp.StatusCode, body)
		}
	}
	tr := &sdk.StreamableClientTransport{Endpoint: s.url + "/mcp", HTTPClient: &http.Client{Transport: keyed{key: "lz_not_a_key"}}}
	if _, err := sdk.NewClient(&sdk.Implementation{Name: "test", Version: "1"}, nil).Connect(context.Background(), tr, nil); err == nil {
		t.Fatal("a client with a wrong key connected")
	}
}

// TestHTTPSessions: a client of an earlier revision (2025-11-25, as the
// TypeScript SDK speaks it) gets a session, bound to its key.
func TestHTTPSessions(t *testing.T) {
	s := newStack(t)
	post := func(key, session, body string) (*http.Response, string) {
		req, _ := http.NewRequest("POST", s.url+"/mcp", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("X-API-Key", key)
		if session != "" {
			req.Header.Set("Mcp-Session-Id", session)
			req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	resp, body := post(testKey, "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
	session := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != 200 || session == "" || !strings.Contains(body, `"protocolVersion":"2025-11-25"`) {
		t.Fatalf("initialize: %d session %q %s", resp.StatusCode, session, body)
	}
	if resp, body := post(testKey, session, `{"jsonrpc":"2.0","method":"notifications/initialized"}`); resp.StatusCode != 202 {
		t.Fatalf("initialized: %d %s", resp.StatusCode, body)
	}
	list := `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`
	if resp, body := post(otherKey, session, list); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("another key on the session: %d %s, want 403", resp.StatusCode, body)
	}
	if resp, body := post(testKey, session, list); resp.StatusCode != 200 || !strings.Contains(body, "run_command") {
		t.Fatalf("tools/list on the session: %d %.200s", resp.StatusCode, body)
	}

	// The session's stream of server messages stays open while the
	// client is there, and ends when the server shuts down.
	req, _ := http.NewRequest("GET", s.url+"/mcp", nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("X-API-Key", testKey)
	req.Header.Set("Mcp-Session-Id", session)
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("the session's stream: %v %v", err, resp)
	}
	defer resp.Body.Close() // before the server's Close, which waits for it
	ended := make(chan struct{})
	go func() {
		io.Copy(io.Discard, resp.Body)
		close(ended)
	}()
	select {
	case <-ended:
		t.Fatal("the session's stream ended by itself")
	case <-time.After(200 * time.Millisecond):
	}
	s.shutDown()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the session's stream is still open after the shutdown began")
	}
}

// TestHTTPCancelAndProgress: a long command reports progress, and a call
// cancelled by its client kills the command in the sandbox.
func TestHTTPCancelAndProgress(t *testing.T) {
	s := newStack(t)
	var mu sync.Mutex
	var notes []string
	cs := s.connect(t, testKey, &sdk.ClientOptions{ProgressNotificationHandler: func(_ context.Context, req *sdk.ProgressNotificationClientRequest) {
		mu.Lock()
		notes = append(notes, req.Params.Message)
		mu.Unlock()
	}})
	id := createSandbox(t, cs)
	res, err := cs.CallTool(context.Background(), &sdk.CallToolParams{Name: "run_command", Meta: sdk.Meta{"progressToken": "p1"},
		Arguments: map[string]any{"sandboxId": id, "command": "for i in 1 2 3; do echo line $i; sleep 1; done"}})
	if err != nil || res.IsError {
		t.Fatalf("run_command: %v %q", err, resultText(res))
	}
	mu.Lock()
	got := append([]string(nil), notes...)
	mu.Unlock()
	if len(got) < 2 || !strings.HasPrefix(got[0], "running: for i in") || !strings.Contains(strings.Join(got, "|"), "line ") {
		t.Fatalf("progress notifications %q, want several, saying the command and its latest line", got)
	}

	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(ctx, &sdk.CallToolParams{Name: "run_command",
			Arguments: map[string]any{"sandboxId": id, "command": "echo $$ > " + dir + "/pid; exec sleep 300", "timeoutSeconds": 600}})
		done <- err
	}()
	var pid string
	sandboxtest.Eventually(t, "the command starts", func() bool {
		res := call(t, cs, "run_command", map[string]any{"sandboxId": id, "command": "cat " + dir + "/pid"})
		var r struct {
			Stdout string `json:"stdout"`
		}
		structured(t, res, &r)
		pid = strings.TrimSpace(r.Stdout)
		return pid != ""
	})
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the cancelled call answered")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the cancelled call did not return")
	}
	sandboxtest.Eventually(t, "the cancelled command is killed in the sandbox", func() bool {
		var r struct {
			ExitCode int `json:"exitCode"`
		}
		structured(t, call(t, cs, "run_command", map[string]any{"sandboxId": id, "command": "kill -0 " + pid}), &r)
		return r.ExitCode != 0
	})
}
