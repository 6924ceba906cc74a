package e2e

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/lizard-build/lizard/internal/template/ocitest"
)

// projectKey creates project name and a key of it with the CLI against
// the server's data dir, and returns the key once the server admits it.
func (s *server) projectKey(t *testing.T, name string) string {
	t.Helper()
	s.cli(t, "projects", "create", name)
	return s.newKey(t, name)
}

// listedTemplates returns the names GET /api/templates gives key.
func (s *server) listedTemplates(t *testing.T, key string) []string {
	t.Helper()
	var list []struct {
		Name string `json:"name"`
	}
	if code, body := s.doKey(key, "GET", "/api/templates", nil, &list); code != 200 {
		t.Fatalf("list templates: %d %s", code, body)
	}
	var out []string
	for _, e := range list {
		out = append(out, e.Name)
	}
	return out
}

// createFrom creates a sandbox of tpl with key and returns its id, or ""
// and the status when the create fails.
func (s *server) createFrom(t *testing.T, key, tpl string) (string, int, []byte) {
	t.Helper()
	var sb sandboxInfo
	code, body := s.doKey(key, "POST", "/api/sandboxes", map[string]any{"template": tpl}, &sb)
	if code >= 300 {
		return "", code, body
	}
	t.Cleanup(func() { s.doKey(key, "DELETE", "/api/sandboxes/"+sb.SandboxID, nil, nil) })
	return sb.SandboxID, code, body
}

// shKey runs a script in a sandbox of key's project and returns its stdout.
func (s *server) shKey(t *testing.T, key, id, script string) string {
	t.Helper()
	var out execReply
	code, body := s.doKey(key, "POST", "/api/sandboxes/"+id+"/exec", map[string]any{"cmd": script}, &out)
	if code != 200 || out.ExitCode != 0 {
		t.Fatalf("exec %q in %s: %d %s", script, id, code, body)
	}
	return out.Stdout
}

func contains(list []string, s string) bool {
	for _, e := range list {
		if e == s {
			return true
		}
	}
	return false
}

// TestTemplatesBelongToProjects: a project's template is visible, usable,
// rebuildable and deletable only in its project; another project may own
// the same name; built-in templates are everybody's and nobody can build
// over or delete them; a deleted template's sandboxes keep running.
func TestTemplatesBelongToProjects(t *testing.T) {
	s := startServer(t, "")
	a := s.key
	b := s.projectKey(t, "team-b")
	dockerfile := func(who string) string { return "FROM base\nRUN echo " + who + " > /who.txt\n" }

	if code, body := s.doKey(a, "POST", "/api/templates", map[string]any{"name": "myapp", "dockerfile": dockerfile("a")}, nil); code != 201 {
		t.Fatalf("a builds myapp: %d %s", code, body)
	}
	if got := s.listedTemplates(t, a); !contains(got, "myapp") || !contains(got, "base") {
		t.Fatalf("a's templates: %v", got)
	}
	if got := s.listedTemplates(t, b); contains(got, "myapp") || !contains(got, "base") {
		t.Fatalf("b's templates before b builds: %v (want base, not a's myapp)", got)
	}
	if id, code, body := s.createFrom(t, b, "myapp"); id != "" || code != 404 {
		t.Fatalf("b creates from a's template: %d %s, want 404", code, body)
	}
	if code, body := s.doKey(b, "DELETE", "/api/templates/myapp", nil, nil); code != 404 {
		t.Fatalf("b deletes a's template: %d %s, want 404", code, body)
	}
	// b's build of the same name is b's own: a's stays as it was.
	if code, body := s.doKey(b, "POST", "/api/templates", map[string]any{"name": "myapp", "dockerfile": dockerfile("b")}, nil); code != 201 {
		t.Fatalf("b builds its own myapp: %d %s", code, body)
	}
	idA, code, body := s.createFrom(t, a, "myapp")
	if idA == "" {
		t.Fatalf("a creates from myapp: %d %s", code, body)
	}
	if got := s.shKey(t, a, idA, "cat /who.txt"); got != "a\n" {
		t.Fatalf("a's sandbox of myapp after b built its own: %q, want a's", got)
	}
	idB, code, body := s.createFrom(t, b, "myapp")
	if idB == "" {
		t.Fatalf("b creates from myapp: %d %s", code, body)
	}
	if got := s.shKey(t, b, idB, "cat /who.txt"); got != "b\n" {
		t.Fatalf("b's sandbox of myapp: %q", got)
	}

	// Built-in templates: nobody builds over or deletes them.
	for _, name := range []string{"base", "python312"} {
		code, body := s.doKey(b, "POST", "/api/templates", map[string]any{"name": name, "dockerfile": dockerfile("b")}, nil)
		if code != 409 || !strings.Contains(string(body), "built-in") {
			t.Fatalf("b builds over %s: %d %s, want 409 naming it a built-in", name, code, body)
		}
	}
	if code, body := s.doKey(b, "DELETE", "/api/templates/base", nil, nil); code != 403 {
		t.Fatalf("b deletes base: %d %s, want 403", code, body)
	}

	// The CLI works on a project's templates too.
	if out := s.cli(t, "template", "ls", "--project", "team-b", "--template-dir", s.templateDir); !strings.Contains(out, "myapp") {
		t.Fatalf("lizard template ls --project team-b:\n%s", out)
	}

	// a deletes its myapp: its running sandbox keeps the files, new
	// creates fail, b's is untouched.
	if code, body := s.doKey(a, "DELETE", "/api/templates/myapp", nil, nil); code != 204 {
		t.Fatalf("a deletes myapp: %d %s", code, body)
	}
	if got := s.shKey(t, a, idA, "cat /who.txt; ls /usr/bin | grep -c . > /dev/null && echo files"); got != "a\nfiles\n" {
		t.Fatalf("a's sandbox after the delete: %q", got)
	}
	if id, code, body := s.createFrom(t, a, "myapp"); id != "" || code != 404 {
		t.Fatalf("a creates from its deleted template: %d %s, want 404", code, body)
	}
	if got := s.listedTemplates(t, a); contains(got, "myapp") {
		t.Fatalf("a still lists myapp: %v", got)
	}
	idB2, code, body := s.createFrom(t, b, "myapp")
	if idB2 == "" || s.shKey(t, b, idB2, "cat /who.txt") != "b\n" {
		t.Fatalf("b's myapp after a's delete: %d %s", code, body)
	}
	s.cli(t, "template", "rm", "myapp", "--project", "team-b", "--template-dir", s.templateDir)
	if got := s.listedTemplates(t, b); contains(got, "myapp") {
		t.Fatalf("b lists myapp after lizard template rm: %v", got)
	}
}

// hostAddr returns an IPv4 address of the host that is not loopback and
// not on a bridge or veth of lizard's or of the tests' (lizard*, lz*).
func hostAddr(t *testing.T) netip.Addr {
	t.Helper()
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 || strings.HasPrefix(ifc.Name, "lizard") || strings.HasPrefix(ifc.Name, "lz") {
			continue
		}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() {
				return p.Addr()
			}
		}
	}
	t.Skip("the host has no IPv4 address besides loopback")
	return netip.Addr{}
}

// TestTemplateBuildNetwork: RUN steps, on a build network of the flags'
// bridge and subnet, get the sandboxes' egress rules: a host listener (at
// the build network's gateway and at the host's own address), the API, a
// sandbox's port and 169.254.169.254 are all out of reach, while the
// build's other steps work.
func TestTemplateBuildNetwork(t *testing.T) {
	s := startServer(t, "", "--build-bridge", "lizardbe0", "--build-subnet", "10.246.0.0/16")
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "host") }))
	t.Cleanup(func() { ln.Close() })
	lport := ln.Addr().(*net.TCPAddr).Port
	host := hostAddr(t)
	_, apiPort, _ := net.SplitHostPort(strings.TrimPrefix(s.url, "http://"))

	// A sandbox serving on a port, which the host reaches.
	sb, code, body := s.createFrom(t, s.key, "base")
	if sb == "" {
		t.Fatalf("create: %d %s", code, body)
	}
	sbAddr := strings.TrimSpace(s.sh(t, sb, "setsid python3 -m http.server 8000 >/dev/null 2>&1 < /dev/null & "+
		"for i in $(seq 50); do grep -q ':1F40 ' /proc/net/tcp && break; sleep 0.1; done; hostname -I | cut -d' ' -f1"))
	// The targets answer the host: the refusals below are the firewall's.
	for _, u := range []string{fmt.Sprintf("http://%s:%d/", host, lport), "http://" + sbAddr + ":8000/"} {
		resp, err := http.Get(u)
		if err != nil {
			t.Fatalf("the host cannot reach %s itself: %v", u, err)
		}
		resp.Body.Close()
	}

	targets := []string{
		fmt.Sprintf("http://10.246.0.1:%d/", lport),   // a host listener, at the build network's gateway
		fmt.Sprintf("http://%s:%d/", host, lport),     // the same, at the host's address
		fmt.Sprintf("http://10.246.0.1:%s/", apiPort), // the API's port
		fmt.Sprintf("http://%s:%s/", host, apiPort),
		"http://169.254.169.254/latest/meta-data/", // cloud metadata
		"http://" + sbAddr + ":8000/",              // another sandbox
	}
	df := "FROM base\nRUN for u in " + strings.Join(targets, " ") + "; do curl -s -m 5 -o /dev/null \"$u\"; echo \"$u $?\"; done > /reach.txt\n" +
		"RUN echo built > /ok.txt; hostname -I > /addr.txt\n"
	if code, body := s.do("POST", "/api/templates", map[string]any{"name": "netcheck", "dockerfile": df}, nil); code != 201 {
		t.Fatalf("build: %d %s", code, body)
	}
	id, code, body := s.createFrom(t, s.key, "netcheck")
	if id == "" {
		t.Fatalf("create from the build: %d %s", code, body)
	}
	if got := s.sh(t, id, "cat /ok.txt"); got != "built\n" {
		t.Fatalf("the build's other step: %q", got)
	}
	lines := strings.Split(strings.TrimSpace(s.sh(t, id, "cat /reach.txt")), "\n")
	if len(lines) != len(targets) {
		t.Fatalf("RUN probed %d targets, want %d: %q", len(lines), len(targets), lines)
	}
	for _, l := range lines {
		t.Logf("RUN curl %s", l)
		u, rc, _ := strings.Cut(l, " ")
		// 7: could not connect, 28: timed out; 0 would be a connection,
		// 127 no curl at all.
		if rc != "7" && rc != "28" {
			t.Errorf("RUN curl %s: exit %s, want it refused (7) or dropped (28)", u, rc)
		}
	}
	// The steps ran on the flags' network, which is gone after the build.
	addr, err := netip.ParseAddr(strings.Fields(s.sh(t, id, "cat /addr.txt"))[0])
	if err != nil || !netip.MustParsePrefix("10.246.0.0/16").Contains(addr) {
		t.Errorf("RUN's address %v (%v), want one of --build-subnet 10.246.0.0/16", addr, err)
	}
	if _, err := net.InterfaceByName("lizardbe0"); err == nil {
		t.Errorf("build bridge lizardbe0 is still there after the build")
	}
}

// TestTemplatePullRefusedAndContextCap: FROM an image on a loopback
// registry is refused before any connection, with one message whether or
// not something listens there, unless the operator allows the registry;
// a build request over --max-build-context is a 413.
func TestTemplatePullRefusedAndContextCap(t *testing.T) {
	listening := ocitest.Registry(t)
	ocitest.PushBusybox(t, listening+"/lizard/busybox:1")
	s := startServer(t, "", "--max-build-context", "1048576")
	type errBody struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	answers := map[string]errBody{}
	for _, reg := range []string{listening, "127.0.0.1:5000", "localhost:9", "169.254.169.254"} {
		ref := reg + "/lizard/busybox:1"
		code, body := s.do("POST", "/api/templates", map[string]any{"name": "pulled", "dockerfile": "FROM " + ref + "\n"}, nil)
		var e errBody
		json.Unmarshal(body, &e)
		if code != 403 || e.Code != "registry_refused" || !strings.Contains(e.Message, "registry "+reg+" is refused") {
			t.Fatalf("FROM %s: %d %s, want 403 registry_refused naming the registry", ref, code, body)
		}
		for _, leak := range []string{"connection refused", "dial", "404", "MANIFEST", "lookup"} {
			if strings.Contains(e.Message, leak) {
				t.Errorf("FROM %s: the answer tells %q: %s", ref, leak, e.Message)
			}
		}
		answers[reg] = errBody{Code: e.Code, Message: strings.ReplaceAll(e.Message, reg, "REG")}
	}
	if answers[listening] != answers["127.0.0.1:5000"] {
		t.Errorf("a registry that listens and one that does not get different answers:\n%v\n%v", answers[listening], answers["127.0.0.1:5000"])
	}
	if !strings.Contains(s.logs(), "image pull failed") {
		t.Errorf("the cause of a refused pull is not logged")
	}

	big := base64.StdEncoding.EncodeToString(make([]byte, 2<<20))
	code, body := s.do("POST", "/api/templates", map[string]any{"name": "big", "dockerfile": "FROM base\nCOPY blob /blob\n",
		"files": map[string]string{"blob": big}}, nil)
	var e errBody
	if json.Unmarshal(body, &e); code != 413 || e.Code != "build_context_too_large" || !strings.Contains(e.Message, "1048576") {
		t.Fatalf("a 2 MiB context over a 1 MiB cap: %d %s, want 413 build_context_too_large naming the limit", code, body)
	}
	if got := s.listedTemplates(t, s.key); contains(got, "big") || contains(got, "pulled") {
		t.Fatalf("refused builds left templates: %v", got)
	}
}
