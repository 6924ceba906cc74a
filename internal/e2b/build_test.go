package e2b

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store/sqlite"
	"github.com/lizard-build/lizard/internal/template"
)

// TestPlanBuild: the SDK's steps become lizard's, by E2B's argument
// conventions; a COPY's source is its pattern's directory under the
// directory its upload is unpacked into.
func TestPlanBuild(t *testing.T) {
	hash := strings.Repeat("ab", 32)
	s, copies, err := planBuild(buildStart{
		FromImage: "python:3.12-slim",
		StartCmd:  "python3 -m http.server 8000",
		ReadyCmd:  `[ -n "$(ss -Htuln sport = :8000)" ]`,
		Steps: []buildStep{
			{Type: "RUN", Args: []string{"pip install flask", "root"}},
			{Type: "COPY", Args: []string{"src/*.py", "/app/", "", "0755"}, FilesHash: hash},
			{Type: "copy", Args: []string{"app.py", "app.py", "user:user", ""}, FilesHash: hash, Force: true},
			{Type: "ENV", Args: []string{"A", "1", "B", "$A-2"}},
			{Type: "WORKDIR", Args: []string{"/app"}},
			{Type: "USER", Args: []string{"app"}},
		},
	}, "0b7c0c7e-1111-4222-8333-444455556666")
	if err != nil {
		t.Fatal(err)
	}
	want := []template.Step{
		{Op: template.StepRun, Command: "pip install flask", User: "root"},
		{Op: template.StepCopy, Src: "1/src", Dest: "/app/", Chmod: 0o755},
		{Op: template.StepCopy, Src: "2/app.py", Dest: "app.py", Chown: "user:user", Force: true},
		{Op: template.StepEnv, Env: []template.EnvVar{{Name: "A", Value: "1"}, {Name: "B", Value: "$A-2"}}},
		{Op: template.StepWorkdir, Path: "/app"},
		{Op: template.StepUser, Name: "app"},
	}
	if !reflect.DeepEqual(s.Steps, want) {
		t.Fatalf("steps:\n%+v\nwant\n%+v", s.Steps, want)
	}
	if s.From != "python:3.12-slim" || !s.FromImage || s.DefaultUser != "user" || s.Version != "0b7c0c7e-1111-4222-8333-444455556666" {
		t.Fatalf("build: %+v", s)
	}
	if !reflect.DeepEqual(s.StartCommand, []string{"/bin/sh", "-c", "python3 -m http.server 8000"}) || !strings.Contains(s.ReadyCommand[2], "/proc/net/tcp") {
		t.Fatalf("start %q ready %q", s.StartCommand, s.ReadyCommand)
	}
	if !reflect.DeepEqual(copies, []copySource{{"1", hash}, {"2", hash}}) {
		t.Fatalf("copies: %+v", copies)
	}
}

// TestPlanBuildInvalid: bad steps are 400s naming the field.
// TestPlanBuildBaseImage: fromBaseImage() (E2B's e2bdev/base, at any tag
// or registry spelling) builds from lizard's base template; another image
// of that name's prefix is pulled as it is.
func TestPlanBuildBaseImage(t *testing.T) {
	for _, ref := range []string{"e2bdev/base", "e2bdev/base:latest", "docker.io/e2bdev/base", "index.docker.io/e2bdev/base:1"} {
		s, _, err := planBuild(buildStart{FromImage: ref}, "v")
		if err != nil || s.From != "base" || s.FromImage {
			t.Fatalf("%s: from %q (image %v) %v, want the base template", ref, s.From, s.FromImage, err)
		}
	}
	s, _, err := planBuild(buildStart{FromImage: "e2bdev/base-other"}, "v")
	if err != nil || s.From != "e2bdev/base-other" || !s.FromImage {
		t.Fatalf("e2bdev/base-other: from %q (image %v) %v, want the image", s.From, s.FromImage, err)
	}
}

func TestPlanBuildInvalid(t *testing.T) {
	hash := strings.Repeat("0", 64)
	img := func(steps ...buildStep) buildStart { return buildStart{FromImage: "debian:12", Steps: steps} }
	for _, c := range []struct {
		req  buildStart
		want string
	}{
		{buildStart{}, "fromImage or fromTemplate: required"},
		{buildStart{FromImage: "a:1", FromTemplate: "b"}, "fromImage and fromTemplate"},
		{buildStart{FromImage: "a:1", FromImageRegistry: json.RawMessage(`{"type":"registry","username":"u","password":"p"}`)}, "fromImageRegistry"},
		{buildStart{FromImage: "a:1", ReadyCmd: "true"}, "readyCmd: needs a startCmd"},
		{img(buildStep{Type: "FROB"}), "steps[0].type"},
		{img(buildStep{Type: "RUN"}), "steps[0].args"},
		{img(buildStep{Type: "RUN", Args: []string{"x", "Not A User"}}), "steps[0].args[1]"},
		{img(buildStep{Type: "RUN", Args: []string{"x"}}, buildStep{Type: "COPY", Args: []string{"a", "/b"}}), "steps[1].filesHash"},
		{img(buildStep{Type: "COPY", Args: []string{"/etc/passwd", "/b"}, FilesHash: hash}), "steps[0].args[0]"},
		{img(buildStep{Type: "COPY", Args: []string{"../x", "/b"}, FilesHash: hash}), "steps[0].args[0]"},
		{img(buildStep{Type: "COPY", Args: []string{"a", "/b", "", "999"}, FilesHash: hash}), "steps[0].args[3]"},
		{img(buildStep{Type: "COPY", Args: []string{"a", "/b", "a b"}, FilesHash: hash}), "steps[0].args[2]"},
		{img(buildStep{Type: "ENV", Args: []string{"A"}}), "steps[0].args"},
		{img(buildStep{Type: "WORKDIR"}), "steps[0].args"},
		{img(buildStep{Type: "USER", Args: []string{"root;x"}}), "steps[0].args"},
		{img(buildStep{Type: "USER", Args: []string{"u", "maybe"}}), "steps[0].args[1]"},
	} {
		_, _, err := planBuild(c.req, "v")
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an invalid argument naming %q", c.req, err, c.want)
		}
	}
}

// TestPatternBase: what a COPY copies of its uploaded files, as E2B's
// builder splits the source pattern.
func TestPatternBase(t *testing.T) {
	for src, want := range map[string]string{
		"app.py": "app.py", "./app.py": "./app.py", "src/": "src", "src": "src", "src/*.py": "src",
		"*.txt": ".", "a/b/**/c": "a/b", `a\*b/c`: `a\*b/c`, "{a,b}/x": ".",
	} {
		if got := patternBase(src); got != want {
			t.Errorf("patternBase(%q) = %q, want %q", src, got, want)
		}
	}
}

// TestReadyArgv: waitForPort becomes a check of /proc/net that passes
// while something listens on the port (and not before); waitForTimeout a
// check that passes once its time has gone by since its first try; any
// other ready command runs as it is.
func TestReadyArgv(t *testing.T) {
	if _, err := os.Stat("/proc/net/tcp"); err != nil {
		t.Skip("no /proc/net/tcp")
	}
	run := func(argv []string, env ...string) bool {
		t.Helper()
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatalf("%q: %v %s", argv, err, out)
		}
		return err == nil
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	check := readyArgv(fmt.Sprintf(`[ -n "$(ss -Htuln sport = :%d)" ]`, port))
	if !run(check) {
		t.Fatalf("the port check fails while port %d listens: %q", port, check)
	}
	ln.Close()
	if run(check) {
		t.Fatalf("the port check passes once port %d is closed", port)
	}
	wait := readyArgv("sleep 1")
	tmp := "TMPDIR=" + t.TempDir()
	if run(wait, tmp) {
		t.Fatal("waitForTimeout(1000) passed at its first try")
	}
	time.Sleep(2100 * time.Millisecond)
	if !run(wait, tmp) {
		t.Fatal("waitForTimeout(1000) fails 2 s after its first try")
	}
	if got := readyArgv("curl -s localhost:3000 | grep -q 200"); !reflect.DeepEqual(got, []string{"/bin/sh", "-c", "curl -s localhost:3000 | grep -q 200"}) {
		t.Fatalf("another ready command: %q", got)
	}
}

// fakeBuilder stands in for the template registry and its builder (which
// needs root and gVisor): a build "succeeds" by recording the template,
// or fails as told; what it was given is kept.
type fakeBuilder struct {
	mu      sync.Mutex
	built   []template.Template
	steps   template.Steps
	context map[string]string // relative path → content of the build context
	fail    error
	lines   int // progress lines a build writes
}

func (f *fakeBuilder) BuildSteps(_ context.Context, project, name string, s template.Steps, dir, size string, progress io.Writer) (template.Template, error) {
	if size != sandboxSize {
		return template.Template{}, fmt.Errorf("ready state for size %q, not E2B's sandboxes' %q", size, sandboxSize)
	}
	files := map[string]string{}
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			rel, _ := filepath.Rel(dir, p)
			files[rel] = string(b)
		}
		return nil
	})
	for i := 0; i < f.lines; i++ {
		fmt.Fprintf(progress, "[%s] line %d\n", name, i)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.steps, f.context = s, files
	if f.fail != nil {
		return template.Template{}, f.fail
	}
	t := template.Template{Name: name, Project: project, Version: s.Version}
	for i, o := range f.built {
		if o.Project == project && o.Name == name {
			f.built[i] = t
			return t, nil
		}
	}
	f.built = append(f.built, t)
	return t, nil
}

func (f *fakeBuilder) ListFor(project string) ([]template.Template, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := []template.Template{{Name: "base"}}
	for _, t := range f.built {
		if t.Project == project {
			out = append(out, t)
		}
	}
	return out, nil
}

func (f *fakeBuilder) Delete(_ context.Context, project, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, t := range f.built {
		if t.Project == project && t.Name == name {
			f.built = append(f.built[:i], f.built[i+1:]...)
			return nil
		}
	}
	return fmt.Errorf("template %q: %w", name, errdefs.ErrNotFound)
}

// newBuildServer is the control plane with builds (through f), its files
// in a temporary directory and tags in a real store, over two projects
// (testKey's and otherKey's), served on a real listener (upload URLs name
// its address).
func newBuildServer(t *testing.T, f *fakeBuilder) *httptest.Server {
	files := filepath.Join(t.TempDir(), "files")
	h := newTestAPI(t, func(c *Config, st *sqlite.Store) {
		c.Templates, c.Builder, c.FilesDir, c.MaxUpload, c.Tags = f, f, files, 1<<20, st
	}, testKey, otherKey)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// call sends a request with key and decodes the JSON answer into out.
func call(t *testing.T, srv *httptest.Server, key, method, path string, body any, out any) (int, string) {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, srv.URL+path, r)
	req.Header.Set("X-API-Key", key)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if out != nil && res.StatusCode < 300 && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %v: %s", method, path, err, b)
		}
	}
	return res.StatusCode, string(b)
}

// tarGz is a gzipped tar of files (path → content), as the SDK uploads.
func tarGz(files map[string]string) []byte {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for name, content := range files {
		tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(content)), Typeflag: tar.TypeReg})
		tw.Write([]byte(content))
	}
	tw.Close()
	zw.Close()
	return buf.Bytes()
}

func put(t *testing.T, u string, body []byte) int {
	t.Helper()
	req, _ := http.NewRequest("PUT", u, bytes.NewReader(body))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res.StatusCode
}

// waitBuild polls the build's status as the SDK does, from logsOffset on,
// until it ends; it returns the status, the log lines and the last answer.
func waitBuild(t *testing.T, srv *httptest.Server, tpl, id string) (buildInfo, []string) {
	t.Helper()
	var lines []string
	deadline := time.Now().Add(10 * time.Second)
	for {
		var info buildInfo
		code, body := call(t, srv, testKey, "GET", fmt.Sprintf("/templates/%s/builds/%s/status?logsOffset=%d", tpl, id, len(lines)), nil, &info)
		if code != 200 {
			t.Fatalf("status: %d %s", code, body)
		}
		if len(info.LogEntries) > maxLogsPerPoll {
			t.Fatalf("a status answered %d log entries", len(info.LogEntries))
		}
		for _, e := range info.LogEntries {
			lines = append(lines, e.Message)
		}
		if (info.Status == buildReady || info.Status == buildError) && len(info.LogEntries) == 0 {
			return info, lines
		}
		if time.Now().After(deadline) {
			t.Fatalf("build still %s", info.Status)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestBuildFlow: the SDK's calls of Template.build, in order: a build is
// requested, the files of its COPY step uploaded to the signed URL (once:
// the next build finds them), the steps started, the log read page by
// page from logsOffset until ready; its tags name it; another project sees
// none of it.
func TestBuildFlow(t *testing.T) {
	f := &fakeBuilder{lines: 150}
	srv := newBuildServer(t, f)
	var req buildRequested
	if code, body := call(t, srv, testKey, "POST", "/v3/templates", map[string]any{"name": "App:V1", "tags": []string{"prod", "v1"}, "cpuCount": 2, "memoryMB": 1024}, &req); code != 202 {
		t.Fatalf("request: %d %s", code, body)
	}
	if req.TemplateID != "app" || !uuidRE.MatchString(req.BuildID) || !reflect.DeepEqual(req.Tags, []string{"v1", "prod"}) {
		t.Fatalf("request: %+v", req)
	}
	hash := strings.Repeat("1f", 32)
	var up fileUpload
	if code, body := call(t, srv, testKey, "GET", "/templates/app/files/"+hash, nil, &up); code != 201 || up.Present || up.URL == "" {
		t.Fatalf("files: %d %s", code, body)
	}
	if code, body := call(t, srv, otherKey, "GET", "/templates/app/files/"+hash, nil, nil); code != 404 {
		t.Fatalf("another project's files: %d %s", code, body)
	}
	u, _ := url.Parse(up.URL)
	if u.Host != strings.TrimPrefix(srv.URL, "http://") {
		t.Fatalf("upload URL %s is not this server's", up.URL)
	}
	archive := tarGz(map[string]string{"src/a.py": "print(1)\n", "src/b.py": "print(2)\n"})
	// A URL changed in any part is refused, as is an expired one.
	for _, bad := range []string{
		strings.Replace(up.URL, hash, strings.Repeat("2f", 32), 1),
		strings.Replace(up.URL, "signature=", "signature=00", 1),
		strings.Replace(up.URL, "expires=", "expires=1", 1),
	} {
		if code := put(t, bad, archive); code != 403 {
			t.Fatalf("PUT %s: %d, want 403", bad, code)
		}
	}
	if code := put(t, up.URL, archive); code != 200 {
		t.Fatalf("upload: %d", code)
	}
	if code, body := call(t, srv, testKey, "GET", "/templates/app/files/"+hash, nil, &up); code != 201 || !up.Present {
		t.Fatalf("files after the upload: %d %s", code, body)
	}
	start := buildStart{FromImage: "python:3.12-slim", StartCmd: "python3 -m http.server 8000", ReadyCmd: `[ -n "$(ss -Htuln sport = :8000)" ]`,
		Steps: []buildStep{{Type: "RUN", Args: []string{"true"}}, {Type: "COPY", Args: []string{"src/*.py", "/app/"}, FilesHash: hash}}}
	if code, body := call(t, srv, otherKey, "POST", "/v2/templates/app/builds/"+req.BuildID, start, nil); code != 404 {
		t.Fatalf("another project starts the build: %d %s", code, body)
	}
	if code, body := call(t, srv, testKey, "POST", "/v2/templates/app/builds/"+req.BuildID, start, nil); code != 202 {
		t.Fatalf("start: %d %s", code, body)
	}
	if code, body := call(t, srv, testKey, "POST", "/v2/templates/app/builds/"+req.BuildID, start, nil); code != 409 {
		t.Fatalf("a second start: %d %s", code, body)
	}
	if code, body := call(t, srv, otherKey, "GET", "/templates/app/builds/"+req.BuildID+"/status", nil, nil); code != 404 {
		t.Fatalf("another project's status: %d %s", code, body)
	}
	info, lines := waitBuild(t, srv, "app", req.BuildID)
	if info.Status != buildReady || info.Reason != nil {
		t.Fatalf("build: %+v", info)
	}
	if len(lines) != 152 || lines[1] != "line 0" || lines[150] != "line 149" || !strings.Contains(lines[151], "is ready") {
		t.Fatalf("log: %d lines, %q … %q", len(lines), lines[:2], lines[len(lines)-2:])
	}
	if f.steps.Steps[1].Src != "1/src" || f.context["1/src/a.py"] != "print(1)\n" || f.context["1/src/b.py"] != "print(2)\n" {
		t.Fatalf("COPY source %q, context %v", f.steps.Steps[1].Src, f.context)
	}
	var tags []templateTag
	if code, body := call(t, srv, testKey, "GET", "/templates/app/tags", nil, &tags); code != 200 || len(tags) != 2 ||
		tags[0].Tag != "prod" || tags[0].BuildID != req.BuildID || tags[1].Tag != "v1" {
		t.Fatalf("tags: %d %s", code, body)
	}
	if code, body := call(t, srv, otherKey, "GET", "/templates/app/tags", nil, nil); code != 404 {
		t.Fatalf("another project's tags: %d %s", code, body)
	}
	if code, body := call(t, srv, testKey, "GET", "/templates/aliases/app", nil, nil); code != 200 {
		t.Fatalf("Template.exists: %d %s", code, body)
	}
	if code, body := call(t, srv, otherKey, "GET", "/templates/aliases/app", nil, nil); code != 404 {
		t.Fatalf("Template.exists by another project: %d %s", code, body)
	}

	// A second build: its files are there; v1 keeps naming the first,
	// so a sandbox of app:v1 is refused, and of app:prod once moved.
	var req2 buildRequested
	call(t, srv, testKey, "POST", "/v3/templates", map[string]any{"name": "app"}, &req2)
	if call(t, srv, testKey, "GET", "/templates/app/files/"+hash, nil, &up); !up.Present {
		t.Fatal("a second build is asked to upload the same files again")
	}
	if code, body := call(t, srv, testKey, "POST", "/v2/templates/app/builds/"+req2.BuildID, start, nil); code != 202 {
		t.Fatalf("second start: %d %s", code, body)
	}
	waitBuild(t, srv, "app", req2.BuildID)
	code, body := call(t, srv, testKey, "POST", "/v2/sandboxes", map[string]any{"templateID": "app:v1"}, nil)
	if code != 400 || !strings.Contains(body, "earlier build") {
		t.Fatalf("a sandbox of a tag of an earlier build: %d %s", code, body)
	}
	var assigned assignedTags
	if code, body := call(t, srv, testKey, "POST", "/templates/tags", map[string]any{"target": "app:default", "tags": []string{"v1"}}, &assigned); code != 201 || assigned.BuildID != req2.BuildID {
		t.Fatalf("assign: %d %s", code, body)
	}
	// Now app:v1 is app's latest build: the create goes on to the service
	// (which has no such template here).
	if code, body := call(t, srv, testKey, "POST", "/v2/sandboxes", map[string]any{"templateID": "app:v1"}, nil); code != 404 || strings.Contains(body, "earlier") {
		t.Fatalf("a sandbox of a tag of the latest build: %d %s", code, body)
	}
	if code, body := call(t, srv, testKey, "DELETE", "/templates/tags", map[string]any{"name": "app", "tags": []string{"default"}}, nil); code != 400 {
		t.Fatalf("removing the default tag: %d %s", code, body)
	}
	if code, body := call(t, srv, testKey, "DELETE", "/templates/tags", map[string]any{"name": "app", "tags": []string{"v1"}}, nil); code != 204 {
		t.Fatalf("remove tags: %d %s", code, body)
	}
	if code, body := call(t, srv, otherKey, "DELETE", "/templates/app", nil, nil); code != 404 {
		t.Fatalf("another project deletes: %d %s", code, body)
	}
	if code, body := call(t, srv, testKey, "DELETE", "/templates/app", nil, nil); code != 204 {
		t.Fatalf("delete: %d %s", code, body)
	}
	if code, body := call(t, srv, testKey, "GET", "/templates/app/tags", nil, nil); code != 404 {
		t.Fatalf("tags of a deleted template: %d %s", code, body)
	}
}

// TestBuildFails: a failed build's status is error, with the builder's
// message (what the step printed) and the step the SDK points at.
func TestBuildFails(t *testing.T) {
	f := &fakeBuilder{fail: &template.StepError{Step: 2, Err: fmt.Errorf("step 2 (RUN): exit code 3; last output: boom: %w", errdefs.ErrInvalid)}}
	srv := newBuildServer(t, f)
	var req buildRequested
	call(t, srv, testKey, "POST", "/v3/templates", map[string]any{"name": "bad"}, &req)
	start := buildStart{FromTemplate: "base", Steps: []buildStep{{Type: "RUN", Args: []string{"true"}}, {Type: "RUN", Args: []string{"exit 3"}}}}
	if code, body := call(t, srv, testKey, "POST", "/v2/templates/bad/builds/"+req.BuildID, start, nil); code != 202 {
		t.Fatalf("start: %d %s", code, body)
	}
	info, lines := waitBuild(t, srv, "bad", req.BuildID)
	if info.Status != buildError || info.Reason == nil || info.Reason.Step == nil || *info.Reason.Step != "2" ||
		!strings.Contains(info.Reason.Message, "exit code 3; last output: boom") {
		t.Fatalf("failed build: %+v", info)
	}
	if !strings.Contains(lines[len(lines)-1], "Build failed: ") {
		t.Fatalf("log: %q", lines)
	}
	if code, _ := call(t, srv, testKey, "GET", "/templates/aliases/bad", nil, nil); code != 404 {
		t.Fatalf("a failed build made a template: %d", code)
	}
}

// TestBuildInvalid: bad requests are E2B's 400 naming the field.
func TestBuildInvalid(t *testing.T) {
	srv := newBuildServer(t, &fakeBuilder{})
	var req buildRequested
	call(t, srv, testKey, "POST", "/v3/templates", map[string]any{"name": "ok"}, &req)
	hash := strings.Repeat("3c", 32)
	for _, c := range []struct {
		method, path string
		body         any
		status       int
		want         string
	}{
		{"POST", "/v3/templates", map[string]any{}, 400, "name: required"},
		{"POST", "/v3/templates", map[string]any{"name": "Bad Name"}, 400, "name"},
		{"POST", "/v3/templates", map[string]any{"name": "x:not a tag"}, 400, "name: tag"},
		{"POST", "/v3/templates", map[string]any{"name": "base"}, 400, "built-in"},
		{"POST", "/v3/templates", map[string]any{"name": "other/x"}, 400, "namespace"},
		{"POST", "/v3/templates", map[string]any{"name": "x", "tags": []string{"ok", "NO WAY"}}, 400, "tags[1]"},
		{"POST", "/v3/templates", map[string]any{"name": "x", "cpuCount": -1}, 400, "cpuCount"},
		{"GET", "/templates/ok/files/xyz", nil, 400, "hash"},
		{"GET", "/templates/nosuch/files/" + hash, nil, 404, "nosuch"},
		{"POST", "/v2/templates/ok/builds/" + req.BuildID, map[string]any{"fromImage": "a:1", "steps": []any{map[string]any{"type": "COPY", "args": []string{"a", "/a"}, "filesHash": hash}}}, 400, "steps[0].filesHash: the files"},
		{"POST", "/v2/templates/ok/builds/" + req.BuildID, map[string]any{"fromImage": "a:1", "steps": []any{map[string]any{"type": "ADD"}}}, 400, "steps[0].type"},
		{"POST", "/v2/templates/ok/builds/" + req.BuildID, map[string]any{"fromImage": "a:1", "steps": "no"}, 400, "steps"},
		{"POST", "/v2/templates/ok/builds/nosuch", map[string]any{"fromImage": "a:1"}, 404, "nosuch"},
		{"GET", "/templates/ok/builds/" + req.BuildID + "/status?logsOffset=-1", nil, 400, "logsOffset"},
		{"POST", "/templates/tags", map[string]any{"target": "ok:v1"}, 400, "tags"},
		{"POST", "/templates/tags", map[string]any{"target": "ok:v1", "tags": []string{"x"}}, 404, "v1"},
		{"DELETE", "/templates/tags", map[string]any{"name": "ok:v1", "tags": []string{"x"}}, 400, "without a tag"},
		{"DELETE", "/templates/base", nil, 400, "built-in"},
	} {
		code, body := call(t, srv, testKey, c.method, c.path, c.body, nil)
		var e errorBody
		json.Unmarshal([]byte(body), &e)
		if code != c.status || e.Code != c.status || !strings.Contains(e.Message, c.want) {
			t.Errorf("%s %s %v: %d %s, want %d naming %q", c.method, c.path, c.body, code, body, c.status, c.want)
		}
	}
}
