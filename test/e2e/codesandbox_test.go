package e2e

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// pySDKSeed is the Lizard Python SDK 0.1.1 as the seeds hold it (a diff
// that creates its files), outside the repository; LIZARD_E2E_PY_SDK
// names another copy (a directory with the lizard package, or that file).
const pySDKSeed = "../../../shared/seeds/003_cb818016aa51983c.txt"

// TestCodeInterpPythonSDK: the Python SDK's CodeSandbox, unchanged, works
// against a server deployed as its client expects: the API at api.D and
// previews at <sandbox>-<port>.sandbox.D, both on the proxy's TLS
// listener (--api-host, --domain), with --code-interpreter-public, as the
// client sends no token to port 8080. State, a chart, an error, contexts,
// bash and JavaScript (testdata/codesandbox/check.py).
func TestCodeInterpPythonSDK(t *testing.T) {
	py := pythonWith(t, "httpx")
	sdk := pythonSDK(t)
	const domain = "lizard.test"
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	writeSelfSigned(t, certFile, keyFile, "api."+domain, "*.sandbox."+domain)
	s := startServer(t, "", "--tls-cert", certFile, "--tls-key", keyFile,
		"--domain", "sandbox."+domain, "--api-host", "api."+domain, "--code-interpreter-public")
	// The client waits 5 s for a create (httpx's default); the first
	// create of the template on a server makes its ready state, which
	// takes longer: made here first, as README tells operators.
	warm, _ := s.createdAt(t, "code-interpreter-v1", "")
	s.do("DELETE", "/api/sandboxes/"+warm, nil, nil)
	_, port, _ := strings.Cut(s.proxy, ":")
	if _, err := strconv.Atoi(port); err != nil {
		t.Fatalf("proxy address %q", s.proxy)
	}
	here, _ := filepath.Abs("testdata/codesandbox")
	ctx, cancel := context.WithTimeout(context.Background(), budget(5*time.Minute))
	defer cancel()
	cmd := exec.CommandContext(ctx, py, filepath.Join(here, "check.py"))
	cmd.Env = append(os.Environ(),
		"PYTHONPATH="+here+string(os.PathListSeparator)+sdk,
		"LIZARD_TEST_DOMAIN="+domain,
		"LIZARD_API_URL=https://api."+domain+":"+port,
		"LIZARD_API_KEY="+s.key,
		"SSL_CERT_FILE="+certFile,
	)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.HasSuffix(string(out), "ok\n") {
		t.Fatalf("the Python SDK's CodeSandbox: %v\n%s", err, out)
	}
	s.waitNoLeaks(t)
}

// pythonWith is a python3 that imports module (Debian's, where
// scripts/install-deps.sh puts python3-httpx, else the PATH's).
func pythonWith(t *testing.T, module string) string {
	t.Helper()
	for _, py := range []string{"/usr/bin/python3", "python3"} {
		if exec.Command(py, "-c", "import "+module).Run() == nil {
			return py
		}
	}
	t.Fatalf("no python3 imports %s: apt-get install python3-%s (make deps does)", module, module)
	return ""
}

// pythonSDK is a directory holding the Python SDK's lizard package: the
// one LIZARD_E2E_PY_SDK names, or the seed's files written to a temporary
// directory.
func pythonSDK(t *testing.T) string {
	t.Helper()
	src := os.Getenv("LIZARD_E2E_PY_SDK")
	if src == "" {
		src = pySDKSeed
	}
	fi, err := os.Stat(src)
	if err != nil {
		t.Skipf("the Python SDK 0.1.1 is not here (%v): set LIZARD_E2E_PY_SDK to a directory with its lizard package", err)
	}
	if fi.IsDir() {
		return src
	}
	dir := t.TempDir()
	if err := unpackSeed(src, dir); err != nil {
		t.Fatalf("unpack %s: %v", src, err)
	}
	return dir
}

// unpackSeed writes the files of a seed (each a line naming the file,
// then a hunk "@@ -0,0 +1,N @@" of N added lines) under dir, without the
// first path element (the package's top directory).
func unpackSeed(seed, dir string) error {
	f, err := os.Open(seed)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	var name string
	var body []string
	flush := func() error {
		if name == "" {
			return nil
		}
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		return os.WriteFile(p, []byte(strings.Join(body, "")), 0o644)
	}
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "+") && name != "":
			body = append(body, line[1:]+"\n")
		case strings.HasPrefix(line, "@@"), line == "":
		case !strings.Contains(line, " ") && strings.Contains(line, "/"):
			if err := flush(); err != nil {
				return err
			}
			_, rest, _ := strings.Cut(line, "/")
			name, body = rest, nil
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return flush()
}
