// Package e2e drives a real `lizard serve` — real gVisor sandboxes, the real
// base template — with the official @lizard-build/sdk from npm and with plain
// HTTP clients. The tests need root, runsc, the base template and node; they
// skip with the reason when one is missing (`make test` provides them all).
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/slowness"
	"github.com/lizard-build/lizard/internal/template"
)

// server is one running lizard serve.
type server struct {
	t       *testing.T
	bin     string
	dataDir string
	// templateDir is the server's own template directory: links to the
	// built-in templates of templateDir(), and what the test builds.
	templateDir string
	db          string // --database: a PostgreSQL URL, or "" for SQLite (database_test.go)
	url         string
	proxy       string        // host:port of the preview proxy
	exited      chan struct{} // closed when the server process has exited
	extra       []string
	key         string
	cmd         *exec.Cmd
	node        *testNode // the network namespace it runs in; nil: the host's
	names       *hostNames
	logMu       sync.Mutex
	log         bytes.Buffer
}

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// budget is a fixed wait of the tests: d on the machine they were written
// on (slowness.Reference), as many times longer as this machine is slower
// (LIZARD_TEST_SLOWNESS, measured by scripts/test.sh), never shorter.
func budget(d time.Duration) time.Duration { return slowness.Scale(d) }

// requirements skips the test when this machine cannot run sandboxes.
func requirements(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: lizard serve creates namespaces, cgroups and gVisor sandboxes")
	}
	if _, err := exec.LookPath("runsc"); err != nil && os.Getenv("LIZARD_RUNSC") == "" {
		t.Skip("runsc not installed (make deps)")
	}
	if _, err := os.Stat(filepath.Join(templateDir(), "base", "template.json")); err != nil {
		t.Skipf("base template not built in %s (make templates)", templateDir())
	}
}

func templateDir() string {
	if d := os.Getenv("LIZARD_TEMPLATE_DIR"); d != "" {
		return d
	}
	return "/var/cache/lizard/templates"
}

// build compiles lizard and lizard-agent once per test binary.
func build(t *testing.T) string {
	buildOnce.Do(func() {
		removeLeftoverTemplates()
		binDir, buildErr = os.MkdirTemp("", "lizard-e2e-bin-")
		if buildErr != nil {
			return
		}
		for _, c := range []string{"lizard", "lizard-agent"} {
			cmd := exec.Command("go", "build", "-o", filepath.Join(binDir, c), "github.com/lizard-build/lizard/cmd/"+c)
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			if out, err := cmd.CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("build %s: %v\n%s", c, err, out)
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
}

// removeLeftoverTemplates removes templates an earlier run of the tests
// left in the shared template cache when it was killed: a server would
// otherwise boot their start commands in the background.
func removeLeftoverTemplates() {
	names, _ := filepath.Glob(filepath.Join(templateDir(), "e2e-*"))
	for _, n := range names {
		removeTemplate(filepath.Base(n))
	}
	versions, _ := filepath.Glob(filepath.Join(templateDir(), ".v", "e2e-*@*"))
	for _, v := range versions {
		os.RemoveAll(v)
	}
}

// templateDirs maps a data dir to its server's template dir, so that a
// server restarted over a data dir finds its templates again.
var templateDirs sync.Map

// serverTemplateDir returns the template directory of the server on
// dataDir: a directory of the test's holding links to the built-in
// templates of the shared cache (templateDir()), which its server only
// reads, so that what a test builds, migrates or prunes stays its own and
// goes with it.
func serverTemplateDir(t *testing.T, dataDir string) string {
	if d, ok := templateDirs.Load(dataDir); ok {
		return d.(string)
	}
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range template.NewRegistry(templateDir()).Builtins() {
		shared := filepath.Join(templateDir(), name)
		if _, err := os.Stat(shared); err != nil {
			continue // not built
		}
		if err := os.Symlink(shared, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	templateDirs.Store(dataDir, dir)
	return dir
}

// startServer starts lizard serve on a fresh data dir (or dataDir when set,
// to restart over existing state) and waits until it answers.
func startServer(t *testing.T, dataDir string, extraArgs ...string) *server {
	t.Helper()
	return startServerOn(t, nil, dataDir, extraArgs...)
}

// startServerOn is startServer inside node's network namespace (the host's
// when node is nil): its bridge, nftables table, iptables rules and
// listeners are the node's; the test reaches it at the node's address.
func startServerOn(t *testing.T, node *testNode, dataDir string, extraArgs ...string) *server {
	t.Helper()
	if dataDir == "" {
		dataDir = t.TempDir()
	}
	s := newServerOn(t, node, dataDir, databaseFor(t, dataDir), extraArgs...)
	s.start()
	return s
}

// newServerOn is a server not started yet, on dataDir and database db
// ("" for SQLite), whose end the test's cleanup sees to.
func newServerOn(t *testing.T, node *testNode, dataDir, db string, extraArgs ...string) *server {
	t.Helper()
	requirements(t)
	bin := build(t)
	s := newTestServer(t, node, dataDir, db, extraArgs...)
	s.bin, s.templateDir = bin, serverTemplateDir(t, dataDir)
	return s
}

// newTestServer is the harness's record of a server on dataDir: its names
// on the host (namesFor), and its end (finish) when the test ends. It runs
// nothing yet; newServerOn makes it one that can start.
func newTestServer(t *testing.T, node *testNode, dataDir, db string, extraArgs ...string) *server {
	t.Helper()
	timeTest(t)
	s := &server{t: t, dataDir: dataDir, names: namesFor(t, dataDir), db: db, key: "lz_e2e_test_key_0123456789abcdef", extra: extraArgs, node: node}
	// A test that failed or skipped half-way did not get to clean up.
	t.Cleanup(func() { s.finish(t, t.Failed() || t.Skipped()) })
	return s
}

// start starts the server and waits until it answers and its recovery
// (reattaching the sandboxes of the last one, in the background) is done.
func (s *server) start() {
	done := strings.Count(s.logs(), recoveryDone)
	s.startAnswering()
	deadline := time.Now().Add(budget(90 * time.Second))
	for strings.Count(s.logs(), recoveryDone) <= done {
		if time.Now().After(deadline) {
			s.t.Fatalf("recovery did not finish within %v:\n%s", budget(90*time.Second), s.logs())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// recoveryDone is what the server logs once recovery is over (or failed).
const recoveryDone = `msg="recover: done`

// startAnswering starts the server and returns once it answers, recovery
// possibly still under way.
func (s *server) startAnswering() {
	t := s.t
	// The ports are free when picked but another process may take one
	// before the server binds it: pick again then.
	for attempt := 0; ; attempt++ {
		err := s.launch()
		if err == nil {
			return
		}
		if !strings.Contains(s.logs(), "address already in use") || attempt == 2 {
			t.Fatalf("lizard serve did not answer: %v\n%s", err, s.logs())
		}
	}
}

// launch starts lizard serve on fresh ports and waits until it answers.
func (s *server) launch() error {
	addr, proxyAddr := freeAddr(s.t), freeAddr(s.t)
	if s.node != nil {
		// A namespace of the test's own: every port is free.
		addr, proxyAddr = s.node.addr.String()+":8080", s.node.addr.String()+":8081"
	}
	// A test that names its addresses (the last of each flag wins) gets
	// them.
	if a := lastFlag(s.extra, "--listen"); a != "" {
		addr = a
	}
	if a := lastFlag(s.extra, "--proxy-listen"); a != "" {
		proxyAddr = a
	}
	s.url, s.proxy = "http://"+addr, proxyAddr
	args := append([]string{"serve", "--listen", addr, "--proxy-listen", proxyAddr, "--template-dir", s.templateDir, "--log-level", "debug"},
		s.names.args()...)
	args = append(args, s.stateArgs()...)
	if r := os.Getenv("LIZARD_RUNSC"); r != "" {
		args = append(args, "--runsc", r)
	}
	args = append(args, s.extra...)
	s.cmd = exec.Command(filepath.Join(s.bin, "lizard"), args...)
	if s.node == nil {
		hostBridges.add(s.bridge(), s.buildBridge())
	}
	if s.node != nil {
		// nsenter joins only the network namespace and execs lizard, so
		// the server's mounts are the host's (leak checks see them) and
		// signals reach lizard itself.
		s.cmd = exec.Command("nsenter", append([]string{"--net=" + s.node.path, "--", filepath.Join(s.bin, "lizard")}, args...)...)
	}
	s.cmd.Env = append(os.Environ(), "LIZARD_API_KEY="+s.key)
	// One writer for both, so that exec gives the server one pipe and its
	// log keeps the order the server wrote in.
	w := &logWriter{s: s}
	s.cmd.Stdout, s.cmd.Stderr = w, w
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := s.cmd.Start(); err != nil {
		return err
	}
	s.exited = make(chan struct{})
	go func(cmd *exec.Cmd, exited chan struct{}) { cmd.Wait(); close(exited) }(s.cmd, s.exited)
	// The server listens before anything slow (runsc runs, probes) is
	// done, whatever its sandboxes' load (TestRestartBusy: 55 ms); the
	// margin is for a host that other work keeps busy (bench/ saw 14 s at
	// a load average of 85 on 2 cores).
	deadline := time.Now().Add(budget(30 * time.Second))
	for time.Now().Before(deadline) {
		select {
		case <-s.exited:
			s.cmd = nil
			return errors.New("lizard serve exited")
		default:
		}
		resp, err := http.Get(s.url + "/api/projects")
		if err == nil {
			resp.Body.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("no answer within %v", budget(30*time.Second))
}

// lastFlag is the value of the last "name value" pair in args, "" if none.
func lastFlag(args []string, name string) string {
	v := ""
	for i := 0; i+1 < len(args); i++ {
		if args[i] == name {
			v = args[i+1]
		}
	}
	return v
}

// freeAddr returns a loopback address with a port that was free just now.
func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// stop ends the server gracefully; sandboxes keep running.
func (s *server) stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(budget(10 * time.Second)):
		s.cmd.Process.Kill()
		<-s.exited
	}
	if s.t.Failed() {
		s.t.Logf("server log:\n%s", s.logs())
	}
	s.cmd = nil
}

// crash kills the server with SIGKILL, as a power cut would to the process.
func (s *server) crash() {
	s.cmd.Process.Kill()
	<-s.exited
	s.cmd = nil
}

func (s *server) logs() string {
	s.logMu.Lock()
	defer s.logMu.Unlock()
	return s.log.String()
}

type logWriter struct{ s *server }

func (w *logWriter) Write(p []byte) (int, error) {
	w.s.logMu.Lock()
	defer w.s.logMu.Unlock()
	return w.s.log.Write(p)
}

// do sends one API request with the server's key and decodes a JSON answer
// into out (when non-nil). It returns the status and the raw body.
func (s *server) do(method, path string, body any, out any) (int, []byte) {
	return s.doKey(s.key, method, path, body, out)
}

func (s *server) doKey(key, method, path string, body any, out any) (int, []byte) {
	s.t.Helper()
	code, raw, err := s.request(context.Background(), key, method, path, body, nil)
	if code == 0 {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	// A body cut short after the status (a server killed under it) is
	// returned as far as it came; decoding it into out fails.
	if out != nil && code < 300 {
		if err := json.Unmarshal(raw, out); err != nil {
			s.t.Fatalf("%s %s: decode %q: %v", method, path, raw, err)
		}
	}
	return code, raw
}

// request is do without the test: for goroutines (which must not call
// t.Fatal), and for requests cut short by ctx. It returns the status (0
// when there was no answer) and the raw body; an answer of 300 or more is
// not an error. out, when non-nil, gets a 2xx answer decoded.
func (s *server) request(ctx context.Context, key, method, path string, body any, out any) (int, []byte, error) {
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		r = bytes.NewReader(b)
	case string:
		r = strings.NewReader(b)
	default:
		j, _ := json.Marshal(b)
		r = bytes.NewReader(j)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.url+path, r)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("X-API-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, raw, err
	}
	if out != nil && resp.StatusCode < 300 {
		if err := json.Unmarshal(raw, out); err != nil {
			return resp.StatusCode, raw, fmt.Errorf("decode %q: %w", raw, err)
		}
	}
	return resp.StatusCode, raw, nil
}

// runNode runs node's test runner on the given SDK test files with the
// server's URL and key, streaming its output into the test log.
func (s *server) runNode(ctx context.Context, files ...string) error {
	return s.runNodeEnv(ctx, nil, files...)
}

// runNodeEnv is runNode with more environment variables.
func (s *server) runNodeEnv(ctx context.Context, env []string, files ...string) error {
	if _, err := exec.LookPath("node"); err != nil {
		s.t.Skip("node not installed")
	}
	if _, err := os.Stat("node_modules/@lizard-build/sdk"); err != nil {
		s.t.Skip("the SDK is not installed: run `npm install` in test/e2e (make test does)")
	}
	args := append([]string{"--test", "--test-concurrency=2", "--test-reporter=spec"}, files...)
	cmd := exec.CommandContext(ctx, "node", args...)
	cmd.Env = append(os.Environ(), "LIZARD_API_URL="+s.url, "LIZARD_API_KEY="+s.key, "LIZARD_TEST_PROXY="+s.proxy)
	cmd.Env = append(cmd.Env, env...)
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	logged := make(chan struct{})
	go func() {
		defer close(logged)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			s.t.Log(sc.Text())
		}
		io.Copy(io.Discard, pr) // a line too long for the scanner must not block node
	}()
	err := cmd.Run()
	pw.Close()
	<-logged // no t.Log after the test returns
	return err
}

// flag is the value of flag name in the server's extra arguments (the last
// one given wins, as in the flag package), def when they do not set it.
func (s *server) flag(name, def string) string {
	if v := lastFlag(s.extra, name); v != "" {
		return v
	}
	return def
}

// testRand returns the randomness of a test that picks random points (when
// to crash a server, …): seeded from LIZARD_TEST_SEED when set, to replay a
// failure, else from the clock. The seed is logged either way.
func testRand(t *testing.T) *rand.Rand {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("LIZARD_TEST_SEED"); v != "" {
		var err error
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("LIZARD_TEST_SEED=%q: want an unsigned integer: %v", v, err)
		}
	}
	t.Logf("random seed %d (replay with LIZARD_TEST_SEED=%d)", seed, seed)
	return rand.New(rand.NewPCG(seed, seed))
}
