package e2e

import (
	"bufio"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
)

type exposed struct {
	Hostname    string `json:"hostname"`
	URL         string `json:"url"`
	Port        int    `json:"port"`
	AccessToken string `json:"accessToken"`
}

// startApp runs testdata/app.py on port in the sandbox and waits for it.
func (s *server) startApp(t *testing.T, id string, port int) {
	t.Helper()
	s.startAppOn(t, id, "0.0.0.0", port)
}

// startAppOn runs testdata/app.py on bind:port in the sandbox and waits
// for it.
func (s *server) startAppOn(t *testing.T, id, bind string, port int) {
	t.Helper()
	app, err := os.ReadFile("testdata/app.py")
	if err != nil {
		t.Fatal(err)
	}
	if code, body := s.do("POST", "/api/sandboxes/"+id+"/files", map[string]any{"path": "/tmp/app.py", "content": string(app)}, nil); code >= 300 {
		t.Fatalf("write app: %d %s", code, body)
	}
	s.sh(t, id, fmt.Sprintf(`nohup python3 /tmp/app.py %d %s > /tmp/app-%d.log 2>&1 &
for i in $(seq 1 100); do curl -s -o /dev/null http://127.0.0.1:%d/ && exit 0; sleep 0.05; done; cat /tmp/app-%d.log; exit 1`, port, bind, port, port, port))
}

// exposedApp creates a sandbox running testdata/app.py on port 8000 and
// exposes that port.
func (s *server) exposedApp(t *testing.T) (string, exposed) {
	t.Helper()
	id := s.create(t)
	s.startApp(t, id, 8000)
	var ex exposed
	if code, body := s.do("POST", "/api/sandboxes/"+id+"/expose/8000", nil, &ex); code != 200 {
		t.Fatalf("expose: %d %s", code, body)
	}
	return id, ex
}

// previewGet sends a request to the preview proxy for host, without
// following redirects.
func (s *server) preview(t *testing.T, method, host, path string, hdr http.Header, body io.Reader) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+s.proxy+path, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	for k, v := range hdr {
		req.Header[k] = v
	}
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }, Timeout: budget(30 * time.Second)}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s%s: %v", method, host, path, err)
	}
	return resp
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestPreview: private preview URLs through the proxy, end to end.
func TestPreview(t *testing.T) {
	s := startServer(t, "")
	id, ex := s.exposedApp(t)
	_, proxyPort, _ := net.SplitHostPort(s.proxy)
	if want := fmt.Sprintf("%s-8000.sandbox.localhost:%s", id, proxyPort); ex.Hostname != want || ex.Port != 8000 {
		t.Fatalf("expose: %+v, want hostname %s", ex, want)
	}
	if raw, _ := base64.RawURLEncoding.DecodeString(ex.AccessToken); len(raw) < 16 {
		t.Fatalf("access token %q is under 128 bits", ex.AccessToken)
	}
	u, _ := url.Parse(ex.URL)
	if u.Host != ex.Hostname || u.Query().Get("lizard_token") != ex.AccessToken {
		t.Fatalf("url %s", ex.URL)
	}
	tok := http.Header{"X-Lizard-Access-Token": {ex.AccessToken}}

	t.Run("no token is 401, a wrong one too", func(t *testing.T) {
		if r := s.preview(t, "GET", ex.Hostname, "/", nil, nil); r.StatusCode != 401 {
			t.Fatalf("no token: %d", r.StatusCode)
		}
		if r := s.preview(t, "GET", ex.Hostname, "/", http.Header{"X-Lizard-Access-Token": {"wrong"}}, nil); r.StatusCode != 401 {
			t.Fatalf("wrong token: %d", r.StatusCode)
		}
		if r := s.preview(t, "GET", ex.Hostname, "/?lizard_token=wrong", nil, nil); r.StatusCode != 401 {
			t.Fatalf("wrong query token: %d", r.StatusCode)
		}
	})
	t.Run("the app sees its Host, X-Forwarded-*, no lizard token", func(t *testing.T) {
		r := s.preview(t, "GET", ex.Hostname, "/echo?a=1", http.Header{"X-Lizard-Access-Token": {ex.AccessToken}, "Cookie": {"lizard_token=" + ex.AccessToken + "; app=1"}}, nil)
		if r.StatusCode != 200 {
			t.Fatalf("status %d", r.StatusCode)
		}
		var info struct {
			Path    string            `json:"path"`
			Headers map[string]string `json:"headers"`
		}
		json.Unmarshal([]byte(readAll(t, r)), &info)
		h := info.Headers
		if info.Path != "/echo?a=1" || h["Host"] != ex.Hostname || h["X-Forwarded-For"] == "" || h["X-Forwarded-Host"] != ex.Hostname || h["X-Forwarded-Proto"] != "http" {
			t.Fatalf("app saw %+v", info)
		}
		if _, ok := h["X-Lizard-Access-Token"]; ok || strings.Contains(h["Cookie"], "lizard_token") || h["Cookie"] != "app=1" {
			t.Fatalf("the token reached the app: %v", h)
		}
	})
	t.Run("query token once, then a host-only cookie", func(t *testing.T) {
		r := s.preview(t, "GET", ex.Hostname, "/page?x=1&lizard_token="+ex.AccessToken, nil, nil)
		if r.StatusCode != http.StatusFound || r.Header.Get("Location") != "/page?x=1" {
			t.Fatalf("redirect: %d %q", r.StatusCode, r.Header.Get("Location"))
		}
		c := r.Header.Get("Set-Cookie")
		if !strings.Contains(c, "lizard_token="+ex.AccessToken) || !strings.Contains(c, "HttpOnly") || !strings.Contains(c, "SameSite=Lax") || strings.Contains(strings.ToLower(c), "domain=") {
			t.Fatalf("cookie %q", c)
		}
		r = s.preview(t, "GET", ex.Hostname, "/page?x=1", http.Header{"Cookie": {"lizard_token=" + ex.AccessToken}}, nil)
		if body := readAll(t, r); r.StatusCode != 200 || !strings.Contains(body, "hello from the sandbox") {
			t.Fatalf("by cookie: %d %s", r.StatusCode, body)
		}
	})
	t.Run("server-sent events stream as they come", func(t *testing.T) {
		start := time.Now()
		r := s.preview(t, "GET", ex.Hostname, "/sse", tok, nil)
		br := bufio.NewReader(r.Body)
		line, err := br.ReadString('\n')
		if err != nil || line != "data: tick 0\n" {
			t.Fatalf("first event %q %v", line, err)
		}
		first := time.Since(start)
		rest, _ := io.ReadAll(br)
		r.Body.Close()
		if !strings.Contains(string(rest), "tick 2") || first > time.Since(start)-500*time.Millisecond {
			t.Fatalf("events were buffered: first after %v, all after %v: %q", first, time.Since(start), rest)
		}
	})
	t.Run("large bodies both ways", func(t *testing.T) {
		r := s.preview(t, "GET", ex.Hostname, "/big", tok, nil)
		n, _ := io.Copy(io.Discard, r.Body)
		r.Body.Close()
		if n != 8<<20 {
			t.Fatalf("download: %d bytes", n)
		}
		up := make([]byte, 5<<20)
		rand.Read(up)
		sum := sha256.Sum256(up)
		r = s.preview(t, "POST", ex.Hostname, "/upload", tok, strings.NewReader(string(up)))
		if body := readAll(t, r); !strings.Contains(body, hex.EncodeToString(sum[:])) {
			t.Fatalf("upload: %s", body)
		}
	})
	t.Run("websocket echo", func(t *testing.T) {
		if got := wsEcho(t, s.proxy, ex.Hostname, ex.AccessToken, "ping through the proxy"); got != "echo: ping through the proxy" {
			t.Fatalf("websocket: %q", got)
		}
	})
	t.Run("unexposed and unknown ports are 401, the agent port cannot be exposed", func(t *testing.T) {
		other := strings.Replace(ex.Hostname, "-8000.", "-8001.", 1)
		if r := s.preview(t, "GET", other, "/", tok, nil); r.StatusCode != 401 {
			t.Fatalf("port not exposed: %d", r.StatusCode)
		}
		if code, _ := s.do("POST", "/api/sandboxes/"+id+"/expose/49983", nil, nil); code != 400 {
			t.Fatalf("expose agent port: %d", code)
		}
		if code, _ := s.do("POST", "/api/sandboxes/"+id+"/expose/70000", nil, nil); code != 400 {
			t.Fatalf("expose port 70000: %d", code)
		}
	})
	t.Run("an app bound to 127.0.0.1 only is served too", func(t *testing.T) {
		s.startAppOn(t, id, "127.0.0.1", 8002)
		// It is not reachable at the sandbox's own address: the proxy
		// goes through the agent to the loopback address.
		s.sh(t, id, `addr=$(hostname -I | cut -d' ' -f1); test -n "$addr" && ! curl -s -o /dev/null --max-time 5 http://$addr:8002/`)
		var lo exposed
		if code, body := s.do("POST", "/api/sandboxes/"+id+"/expose/8002", nil, &lo); code != 200 {
			t.Fatalf("expose: %d %s", code, body)
		}
		lt := http.Header{"X-Lizard-Access-Token": {lo.AccessToken}}
		r := s.preview(t, "GET", lo.Hostname, "/page", lt, nil)
		if body := readAll(t, r); r.StatusCode != 200 || !strings.Contains(body, "hello from the sandbox") {
			t.Fatalf("loopback app: %d %s", r.StatusCode, body)
		}
		r = s.preview(t, "GET", lo.Hostname, "/big", lt, nil)
		n, _ := io.Copy(io.Discard, r.Body)
		r.Body.Close()
		if n != 8<<20 {
			t.Fatalf("loopback download: %d bytes", n)
		}
		if got := wsEcho(t, s.proxy, lo.Hostname, lo.AccessToken, "ping to the loopback"); got != "echo: ping to the loopback" {
			t.Fatalf("websocket: %q", got)
		}
		// A port nothing listens on, anywhere, is still a 502.
		if code, body := s.do("POST", "/api/sandboxes/"+id+"/expose/8003", nil, &lo); code != 200 {
			t.Fatalf("expose: %d %s", code, body)
		}
		if r := s.preview(t, "GET", lo.Hostname, "/", http.Header{"X-Lizard-Access-Token": {lo.AccessToken}}, nil); r.StatusCode != http.StatusBadGateway {
			t.Fatalf("closed port: %d", r.StatusCode)
		}
	})
	t.Run("a paused sandbox resumes on a request; the token stays valid", func(t *testing.T) {
		if code, body := s.do("POST", "/api/sandboxes/"+id+"/pause", nil, nil); code != 200 {
			t.Fatalf("pause: %d %s", code, body)
		}
		r := s.preview(t, "GET", ex.Hostname, "/page", tok, nil)
		if body := readAll(t, r); r.StatusCode != 200 || !strings.Contains(body, "hello") {
			t.Fatalf("after pause: %d %s", r.StatusCode, body)
		}
		if st := s.status(t, id); st != "running" {
			t.Fatalf("status after a preview request: %s", st)
		}
	})
	t.Run("unexpose takes effect at once; a killed sandbox is 401", func(t *testing.T) {
		if code, _ := s.do("DELETE", "/api/sandboxes/"+id+"/expose/8000", nil, nil); code != 204 {
			t.Fatalf("unexpose: %d", code)
		}
		if r := s.preview(t, "GET", ex.Hostname, "/", tok, nil); r.StatusCode != 401 {
			t.Fatalf("after unexpose: %d", r.StatusCode)
		}
		s.do("POST", "/api/sandboxes/"+id+"/expose/8000", nil, nil)
		s.do("DELETE", "/api/sandboxes/"+id, nil, nil)
		if r := s.preview(t, "GET", ex.Hostname, "/", tok, nil); r.StatusCode != 401 {
			t.Fatalf("after kill: %d", r.StatusCode)
		}
	})
	s.waitNoLeaks(t)
}

// refusal is what a preview request was answered, but for the Date header.
type refusal struct {
	status int
	header http.Header
	body   string
}

func (s *server) refusal(t *testing.T, host, path string, hdr http.Header) refusal {
	t.Helper()
	r := s.preview(t, "GET", host, path, hdr, nil)
	body := readAll(t, r)
	r.Header.Del("Date")
	return refusal{r.StatusCode, r.Header, body}
}

// TestPreviewAuthenticatesFirst: requests without the right token get the
// answer a sandbox that does not exist gets, byte for byte, and leave a
// paused sandbox paused; the right token resumes it and is served.
func TestPreviewAuthenticatesFirst(t *testing.T) {
	s := startServer(t, "")
	id, ex := s.exposedApp(t)
	if code, body := s.do("POST", "/api/sandboxes/"+id+"/pause", nil, nil); code != 200 {
		t.Fatalf("pause: %d %s", code, body)
	}
	_, proxyPort, _ := net.SplitHostPort(s.proxy)
	host := func(label string) string { return label + ".sandbox.localhost:" + proxyPort }
	want := s.refusal(t, host("nosandbox0123-8000"), "/page", nil)
	if want.status != http.StatusUnauthorized {
		t.Fatalf("a sandbox that does not exist: %d %s", want.status, want.body)
	}
	tok := func(v string) http.Header { return http.Header{"X-Lizard-Access-Token": {v}} }
	for _, c := range []struct {
		name, host, path string
		hdr              http.Header
	}{
		{"no token", ex.Hostname, "/page", nil},
		{"a wrong token", ex.Hostname, "/page", tok("wrong-token")},
		{"a wrong cookie", ex.Hostname, "/page", http.Header{"Cookie": {"lizard_token=wrong-token"}}},
		{"a wrong query token", ex.Hostname, "/page?lizard_token=wrong-token", nil},
		{"an unknown sandbox with the real token", host("nosandbox0123-8000"), "/page", tok(ex.AccessToken)},
		{"an unexposed port with the real token", host(id + "-8001"), "/page", tok(ex.AccessToken)},
		{"the agent's port with the real token", host(id + "-49983"), "/", tok(ex.AccessToken)},
		{"a malformed host", id + ".sandbox.localhost:" + proxyPort, "/page", tok(ex.AccessToken)},
		{"a foreign host", "example.com", "/page", tok(ex.AccessToken)},
	} {
		if got := s.refusal(t, c.host, c.path, c.hdr); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: %+v\nwant the same as for a sandbox that does not exist: %+v", c.name, got, want)
		}
	}
	if st := s.status(t, id); st != "paused" {
		t.Fatalf("after unauthenticated requests the sandbox is %s, want paused", st)
	}
	r := s.preview(t, "GET", ex.Hostname, "/page", tok(ex.AccessToken), nil)
	if body := readAll(t, r); r.StatusCode != 200 || !strings.Contains(body, "hello from the sandbox") {
		t.Fatalf("with the token: %d %s", r.StatusCode, body)
	}
	if st := s.status(t, id); st != "running" {
		t.Fatalf("after an authenticated request the sandbox is %s, want running", st)
	}
	s.do("DELETE", "/api/sandboxes/"+id, nil, nil)
	s.waitNoLeaks(t)
}

// wsEcho opens a WebSocket through the proxy, sends msg and returns the
// reply's text.
func wsEcho(t *testing.T, proxyAddr, host, token, msg string) string {
	t.Helper()
	conn, err := net.DialTimeout("tcp", proxyAddr, budget(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(budget(20 * time.Second)))
	key := base64.StdEncoding.EncodeToString([]byte("lizard-test-key!"))
	fmt.Fprintf(conn, "GET /ws HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\nX-Lizard-Access-Token: %s\r\n\r\n", host, key, token)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	mask := []byte{1, 2, 3, 4}
	frame := []byte{0x81, 0x80 | byte(len(msg))}
	frame = append(frame, mask...)
	for i := range len(msg) {
		frame = append(frame, msg[i]^mask[i%4])
	}
	conn.Write(frame)
	head := make([]byte, 2)
	if _, err := io.ReadFull(br, head); err != nil {
		t.Fatal(err)
	}
	payload := make([]byte, head[1]&0x7f)
	io.ReadFull(br, payload)
	return string(payload)
}
