package e2e

import (
	"bytes"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

type sandboxInfo struct {
	SandboxID string  `json:"sandboxId"`
	Template  string  `json:"template"`
	StartedAt string  `json:"startedAt"`
	EndAt     *string `json:"endAt"`
	Status    string  `json:"status"`
}

type execReply struct {
	Stdout    string `json:"stdout"`
	Stderr    string `json:"stderr"`
	ExitCode  int    `json:"exitCode"`
	Truncated bool   `json:"truncated"`
}

// TestPythonClient speaks the requests of the Python lizard-sdk 0.1.1: no
// project id anywhere (the key's default project), connect() as a resume of
// a running sandbox that must answer 200, and list entries that carry
// sandboxId, template, startedAt and endAt.
func TestPythonClient(t *testing.T) {
	s := startServer(t, "")
	var created sandboxInfo
	code, body := s.do("POST", "/api/sandboxes", map[string]any{"template": "base", "timeoutMs": 300000, "metadata": map[string]string{"k": "v"}, "envs": map[string]string{"A": "1"}}, &created)
	if code != http.StatusCreated && code != http.StatusOK {
		t.Fatalf("create: %d %s", code, body)
	}
	id := created.SandboxID
	defer s.do("DELETE", "/api/sandboxes/"+id, nil, nil)

	if code, body := s.do("POST", "/api/sandboxes/"+id+"/resume", nil, nil); code != http.StatusOK {
		t.Fatalf("connect (resume of a running sandbox): %d %s, want 200", code, body)
	}
	var out execReply
	if code, body := s.do("POST", "/api/sandboxes/"+id+"/exec", map[string]any{"cmd": "echo $A; mkdir -p \"/app\""}, &out); code != 200 || out.Stdout != "1\n" {
		t.Fatalf("exec: %d %s", code, body)
	}
	if code, body := s.do("POST", "/api/sandboxes/"+id+"/files", map[string]any{"path": "/app/x.txt", "content": "hi"}, nil); code >= 300 {
		t.Fatalf("write: %d %s", code, body)
	}
	if code, body := s.do("GET", "/api/sandboxes/"+id+"/files?path=/app/x.txt", nil, nil); code != 200 || string(body) != "hi" {
		t.Fatalf("read: %d %q", code, body)
	}
	var list []map[string]any
	if code, body := s.do("GET", "/api/sandboxes", nil, &list); code != 200 {
		t.Fatalf("list: %d %s", code, body)
	}
	found := false
	for _, e := range list {
		for _, k := range []string{"sandboxId", "template", "startedAt", "endAt"} {
			if _, ok := e[k]; !ok {
				t.Fatalf("list entry lacks %q: %v", k, e)
			}
		}
		found = found || e["sandboxId"] == id
	}
	if !found {
		t.Fatalf("list lacks %s", id)
	}
	var files []map[string]any
	s.do("GET", "/api/sandboxes/"+id+"/files/list?path=/app", nil, &files)
	if len(files) != 1 || len(files[0]) != 4 {
		t.Fatalf("files/list entries must have exactly name, path, type, size: %v", files)
	}
	if code, _ := s.do("DELETE", "/api/sandboxes/"+id, nil, nil); code >= 300 {
		t.Fatalf("kill: %d", code)
	}
	if code, _ := s.do("DELETE", "/api/sandboxes/"+id, nil, nil); code != 404 {
		t.Fatalf("second kill: %d, want 404", code)
	}
	if code, _ := s.do("POST", "/api/sandboxes/"+id+"/resume", nil, nil); code != 404 {
		t.Fatalf("connect to a killed sandbox: %d, want 404", code)
	}
	s.waitNoLeaks(t)
}

// TestBadInput sends what a careless or hostile client might: each answer
// is a 4xx JSON error naming the problem, never a 500, and nothing leaks.
func TestBadInput(t *testing.T) {
	s := startServer(t, "")
	var sb sandboxInfo
	if code, body := s.do("POST", "/api/sandboxes", map[string]any{"template": "base"}, &sb); code >= 300 {
		t.Fatalf("create: %d %s", code, body)
	}
	id := sb.SandboxID
	huge := bytes.Repeat([]byte("a"), 100<<20)
	cases := []struct {
		name, method, path string
		body               any
		want               int
	}{
		{"malformed JSON", "POST", "/api/sandboxes", "{not json", 400},
		{"wrong type", "POST", "/api/sandboxes", `{"template": 5}`, 400},
		{"negative timeout", "POST", "/api/sandboxes", `{"template":"base","timeoutMs":-1}`, 400},
		{"huge timeout", "POST", "/api/sandboxes", `{"template":"base","timeoutMs":99999999999999}`, 400},
		{"unknown template", "POST", "/api/sandboxes", `{"template":"nope"}`, 404},
		{"bad size", "POST", "/api/sandboxes", `{"template":"base","size":"xxl"}`, 400},
		{"another project", "POST", "/api/sandboxes", `{"template":"base","projectId":"prj_other"}`, 404},
		{"unknown sandbox", "GET", "/api/sandboxes/doesnotexist", nil, 404},
		{"unknown sandbox exec", "POST", "/api/sandboxes/doesnotexist/exec", `{"cmd":"true"}`, 404},
		{"exec without cmd", "POST", "/api/sandboxes/" + id + "/exec", `{}`, 400},
		{"exec cmd wrong type", "POST", "/api/sandboxes/" + id + "/exec", `{"cmd": 42}`, 400},
		{"exec negative timeout", "POST", "/api/sandboxes/" + id + "/exec", `{"cmd":"true","timeoutMs":-5}`, 400},
		{"exec huge timeout", "POST", "/api/sandboxes/" + id + "/exec", `{"cmd":"true","timeoutMs":100000000}`, 400},
		{"timeout too small", "POST", "/api/sandboxes/" + id + "/timeout", `{"timeoutMs":5}`, 400},
		{"timeout too large", "POST", "/api/sandboxes/" + id + "/timeout", `{"timeoutMs":2147483648}`, 400},
		{"timeout missing", "POST", "/api/sandboxes/" + id + "/timeout", `{}`, 400},
		{"relative path", "GET", "/api/sandboxes/" + id + "/files?path=etc/passwd", nil, 400},
		{"missing path", "GET", "/api/sandboxes/" + id + "/files", nil, 400},
		{"read a directory", "GET", "/api/sandboxes/" + id + "/files?path=/etc", nil, 400},
		{"bad base64", "POST", "/api/sandboxes/" + id + "/files", `{"path":"/tmp/x","content":"!!!","encoding":"base64"}`, 400},
		{"bad encoding", "POST", "/api/sandboxes/" + id + "/files", `{"path":"/tmp/x","content":"x","encoding":"rot13"}`, 400},
		{"100 MB body", "POST", "/api/sandboxes/" + id + "/files", huge, 413},
		{"100 MB exec", "POST", "/api/sandboxes/" + id + "/exec", huge, 413},
		{"bad signal", "POST", "/api/sandboxes/" + id + "/processes/signal", `{"pid":1,"signal":"SIGNOPE"}`, 400},
		{"signal unknown pid", "POST", "/api/sandboxes/" + id + "/processes/signal", `{"pid":999999,"signal":"SIGTERM"}`, 404},
		{"stat missing", "GET", "/api/sandboxes/" + id + "/files/stat?path=/nope", nil, 404},
		{"move missing", "POST", "/api/sandboxes/" + id + "/files/move", `{"from":"/nope","to":"/tmp/y"}`, 404},
		{"unknown user", "POST", "/api/sandboxes/" + id + "/exec", `{"cmd":"true","user":"nobody-here"}`, 400},
		{"fork count too big", "POST", "/api/sandboxes/" + id + "/fork", `{"count":11}`, 400},
		{"fork count zero", "POST", "/api/sandboxes/" + id + "/fork", `{"count":0}`, 400},
		{"fork negative timeout", "POST", "/api/sandboxes/" + id + "/fork", `{"count":1,"timeoutMs":-1}`, 400},
		{"snapshot pool too big", "POST", "/api/sandboxes/" + id + "/snapshot", `{"name":"x","poolSize":99}`, 400},
		{"unknown snapshot", "GET", "/api/sandbox-snapshots/nope", nil, 404},
		{"restore unknown snapshot", "POST", "/api/sandboxes", `{"snapshotId":"nope"}`, 404},
		{"pause unknown sandbox", "POST", "/api/sandboxes/nope/pause", nil, 404},
		{"no such route", "GET", "/api/nothing", nil, 404},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, body := s.do(c.method, c.path, c.body, nil)
			if code != c.want {
				t.Fatalf("%s %s: %d %s, want %d", c.method, c.path, code, body, c.want)
			}
			if !bytes.Contains(body, []byte(`"error"`)) || !bytes.Contains(body, []byte(`"code"`)) {
				t.Fatalf("error body is not the JSON error shape: %s", body)
			}
		})
	}
	// Traversal stays inside the sandbox: ../ resolves within its root, and
	// a symlink pointing "out" points at the sandbox's own files.
	var out execReply
	s.do("POST", "/api/sandboxes/"+id+"/exec", map[string]any{"cmd": "echo inside > /tmp/marker; ln -s / /tmp/root-link"}, &out)
	if code, body := s.do("GET", "/api/sandboxes/"+id+"/files?path=/tmp/../../../tmp/marker", nil, nil); code != 200 || string(body) != "inside\n" {
		t.Fatalf("../ read: %d %q", code, body)
	}
	if code, body := s.do("GET", "/api/sandboxes/"+id+"/files?path=/tmp/root-link/tmp/marker", nil, nil); code != 200 || string(body) != "inside\n" {
		t.Fatalf("symlink read: %d %q", code, body)
	}
	hostMarker := filepath.Join(t.TempDir(), "host-secret")
	exec.Command("sh", "-c", "echo host > "+hostMarker).Run()
	if code, _ := s.do("GET", "/api/sandboxes/"+id+"/files?path="+hostMarker, nil, nil); code != 404 {
		t.Fatalf("a host path is visible in the sandbox: %d", code)
	}
	// Without a key, or with a wrong one: 401.
	if code, _ := s.doKey("", "GET", "/api/sandboxes", nil, nil); code != 401 {
		t.Fatalf("no key: %d", code)
	}
	if code, _ := s.doKey("lz_wrong_key_000000000000", "GET", "/api/sandboxes", nil, nil); code != 401 {
		t.Fatalf("wrong key: %d", code)
	}
	// The sandbox is still fine after all that.
	if code, body := s.do("POST", "/api/sandboxes/"+id+"/exec", map[string]any{"cmd": "echo ok"}, &out); code != 200 || out.Stdout != "ok\n" {
		t.Fatalf("exec after bad input: %d %s", code, body)
	}
	s.do("DELETE", "/api/sandboxes/"+id, nil, nil)
	s.waitNoLeaks(t)
	if strings.Contains(s.logs(), "panic") {
		t.Fatalf("the server panicked:\n%s", s.logs())
	}
}

// TestProjectIsolation: a key of one project sees, changes and uses no
// sandbox, snapshot or volume of another.
func TestProjectIsolation(t *testing.T) {
	s := startServer(t, "")
	s.cli(t, "projects", "create", "Other Team")
	other := s.newKey(t, "other-team")
	var projects []map[string]string
	s.doKey(other, "GET", "/api/projects", nil, &projects)
	if len(projects) != 1 || projects[0]["slug"] != "other-team" {
		t.Fatalf("other key's projects: %v", projects)
	}
	var sb sandboxInfo
	if code, body := s.do("POST", "/api/sandboxes", map[string]any{"template": "base"}, &sb); code >= 300 {
		t.Fatalf("create: %d %s", code, body)
	}
	defer s.do("DELETE", "/api/sandboxes/"+sb.SandboxID, nil, nil)
	for _, p := range []string{"", "/exec", "/files?path=/etc/hostname", "/processes"} {
		method := "GET"
		var body any
		if p == "/exec" {
			method, body = "POST", `{"cmd":"true"}`
		}
		if code, _ := s.doKey(other, method, "/api/sandboxes/"+sb.SandboxID+p, body, nil); code != 404 {
			t.Fatalf("other project's key on %s: %d, want 404", p, code)
		}
	}
	var list []sandboxInfo
	s.doKey(other, "GET", "/api/sandboxes", nil, &list)
	if len(list) != 0 {
		t.Fatalf("other project sees %v", list)
	}
	if code, _ := s.doKey(other, "DELETE", "/api/sandboxes/"+sb.SandboxID, nil, nil); code != 404 {
		t.Fatalf("other project could kill: %d", code)
	}
	if code, _ := s.do("GET", fmt.Sprintf("/api/projects/%s/sandboxes", projects[0]["id"]), nil, nil); code != 404 {
		t.Fatalf("listing another project's sandboxes: %d, want 404", code)
	}

	// Snapshots: the other key neither sees, changes, deletes nor restores
	// them.
	var snap struct {
		ID string `json:"id"`
	}
	if code, body := s.do("POST", "/api/sandboxes/"+sb.SandboxID+"/snapshot", map[string]any{"name": "mine"}, &snap); code != 201 {
		t.Fatalf("snapshot: %d %s", code, body)
	}
	defer s.do("DELETE", "/api/sandbox-snapshots/"+snap.ID, nil, nil)
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/api/sandbox-snapshots/" + snap.ID, ""},
		{"PATCH", "/api/sandbox-snapshots/" + snap.ID, `{"poolSize":1}`},
		{"POST", "/api/sandbox-snapshots/" + snap.ID + "/resume", ""},
		{"DELETE", "/api/sandbox-snapshots/" + snap.ID, ""},
		{"POST", "/api/sandboxes", `{"snapshotId":"` + snap.ID + `"}`},
	} {
		var body any
		if c.body != "" {
			body = c.body
		}
		if code, out := s.doKey(other, c.method, c.path, body, nil); code != 404 {
			t.Fatalf("other project's key on %s %s: %d %s, want 404", c.method, c.path, code, out)
		}
	}
	var snaps []map[string]any
	s.doKey(other, "GET", "/api/sandbox-snapshots", nil, &snaps)
	if len(snaps) != 0 {
		t.Fatalf("other project sees snapshots %v", snaps)
	}

	// Volumes live under their project's path: another project's id there
	// is a 404 whatever the volume.
	if code, body := s.do("POST", "/api/projects/default/volumes", map[string]any{"name": "mine", "sizeGb": 1}, nil); code != 201 {
		t.Fatalf("create volume: %d %s", code, body)
	}
	defer s.do("DELETE", "/api/projects/default/volumes/mine", nil, nil)
	for _, c := range []struct{ method, path string }{
		{"GET", "/api/projects/default/volumes"},
		{"GET", "/api/projects/default/volumes/mine"},
		{"DELETE", "/api/projects/default/volumes/mine"},
	} {
		if code, out := s.doKey(other, c.method, c.path, nil, nil); code != 404 {
			t.Fatalf("other project's key on %s %s: %d %s, want 404", c.method, c.path, code, out)
		}
	}
	if code, out := s.doKey(other, "POST", "/api/sandboxes", map[string]any{"template": "base", "volumeName": "mine"}, nil); code != 404 {
		t.Fatalf("other project mounts the volume: %d %s, want 404", code, out)
	}
	var vols []map[string]any
	s.doKey(other, "GET", "/api/projects/other-team/volumes", nil, &vols)
	if len(vols) != 0 {
		t.Fatalf("other project sees volumes %v", vols)
	}
}
