package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
)

func TestParseE2BHost(t *testing.T) {
	tests := []struct {
		host    string
		id      string
		port    int
		wantErr bool
	}{
		{"8000-abc123.sandbox.localhost", "abc123", 8000, false},
		{"49983-abc123.sandbox.localhost:8081", "abc123", 49983, false},
		{"3000-ABC.Sandbox.Localhost.", "abc", 3000, false},
		{"abc123-8000.sandbox.localhost", "", 0, true}, // lizard's order
		{"8000-123abc.sandbox.localhost", "", 0, true}, // ids start with a letter
		{"8000-a-b.sandbox.localhost", "", 0, true},
		{"0-abc.sandbox.localhost", "", 0, true},
		{"080-abc.sandbox.localhost", "", 0, true},
		{"70000-abc.sandbox.localhost", "", 0, true},
		{"8000-.sandbox.localhost", "", 0, true},
		{"8000-abc.other.example", "", 0, true},
		{"x.8000-abc.sandbox.localhost", "", 0, true},
	}
	for _, tt := range tests {
		id, port, err := ParseE2BHost(tt.host, "sandbox.localhost")
		if tt.wantErr {
			if !errors.Is(err, errdefs.ErrNotFound) {
				t.Errorf("%q: %q %d %v, want ErrNotFound", tt.host, id, port, err)
			}
			continue
		}
		if err != nil || id != tt.id || port != tt.port {
			t.Errorf("%q: %q %d %v, want %q %d", tt.host, id, port, err, tt.id, tt.port)
		}
		// A host is never both orders.
		if _, _, err := ParseHost(tt.host, "sandbox.localhost"); err == nil {
			t.Errorf("%q parses in lizard's order too", tt.host)
		}
	}
}

// fakeE2B knows "pub" (public ports), "priv" (traffic token "tt") and
// "paused"; every port of theirs goes to addr.
type fakeE2B struct{ addr string }

func (f fakeE2B) E2BTarget(id string, port int) (E2BTarget, error) {
	switch id {
	case "pub":
		return E2BTarget{Addr: f.addr, Envd: port == 49983}, nil
	case "priv":
		return E2BTarget{Addr: f.addr, Envd: port == 49983, TrafficToken: "tt"}, nil
	case "masked":
		return E2BTarget{Addr: f.addr, Host: "localhost:" + strconv.Itoa(port)}, nil
	case "closed":
		return E2BTarget{Addr: "127.0.0.1:1"}, nil
	case "paused":
		return E2BTarget{}, fmt.Errorf("paused: %w", errdefs.ErrUnavailable)
	}
	return E2BTarget{}, errdefs.ErrNotFound
}

// E2BSignedFile: "v1_pub" signs reads of pub's files.
func (f fakeE2B) E2BSignedFile(q url.Values, operation string) (string, int, bool) {
	if q.Get("signature") == "v1_pub" && operation == "read" {
		return "pub", 49983, true
	}
	return "", 0, false
}

// TestE2BRouting: E2B-addressed requests by host and by header, public and
// private ports, envd's marking, and the 502s.
func TestE2BRouting(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "host=%s envd=%q agent=%q traffic=%q route=%q", r.Host, r.Header.Get(EnvdHeader),
			r.Header.Get(AgentTokenHeader), r.Header.Get(TrafficTokenHeader), r.Header.Get(E2BSandboxIDHeader))
	}))
	defer up.Close()
	prev := &fakePreviews{addr: strings.TrimPrefix(up.URL, "http://")}
	h := Handler(Config{Domain: "d.test", Previews: prev, E2B: fakeE2B{addr: strings.TrimPrefix(up.URL, "http://")}})
	// host may carry a path and query ("host/files?…"); "/" otherwise.
	do := func(host string, hdr map[string]string) *httptest.ResponseRecorder {
		target := "http://" + host
		if !strings.Contains(host, "/") {
			target += "/"
		}
		req := httptest.NewRequest("GET", target, nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	route := func(id, port string) map[string]string {
		return map[string]string{E2BSandboxIDHeader: id, E2BSandboxPortHeader: port}
	}
	tests := []struct {
		name   string
		host   string
		hdr    map[string]string
		status int
		body   string
	}{
		{"public port by host", "3000-pub.d.test", nil, 200, `envd="" agent="" traffic="" route=""`},
		{"public port by header", "127.0.0.1:8081", route("pub", "3000"), 200, `envd="" agent="" traffic="" route=""`},
		{"envd is marked, agent token stripped", "49983-pub.d.test", map[string]string{AgentTokenHeader: "x", EnvdHeader: "1"}, 200, `envd="1" agent=""`},
		{"a client cannot claim envd", "3000-pub.d.test", map[string]string{EnvdHeader: "1"}, 200, `envd="" agent=""`},
		{"maskRequestHost sets the Host the app sees", "3000-masked.d.test", nil, 200, `host=localhost:3000 `},
		{"a signed file URL on the proxy's address goes to its sandbox's envd", "127.0.0.1:8081/files?path=a&signature=v1_pub", nil, 200, `envd="1"`},
		{"a signature no sandbox made is lizard's 401", "127.0.0.1:8081/files?path=a&signature=v1_other", nil, 401, ""},
		{"private without token", "3000-priv.d.test", nil, 403, `"code":403`},
		{"private wrong token", "3000-priv.d.test", map[string]string{TrafficTokenHeader: "no"}, 403, `"code":403`},
		{"private with token", "3000-priv.d.test", map[string]string{TrafficTokenHeader: "tt"}, 200, `traffic=""`},
		{"private envd needs no traffic token", "49983-priv.d.test", nil, 200, `envd="1"`},
		{"unknown sandbox", "3000-nosuch.d.test", nil, 502, `"message":"The sandbox was not found"`},
		{"unknown by header", "127.0.0.1:8081", route("nosuch", "3000"), 502, `"message":"The sandbox was not found"`},
		{"paused", "49983-paused.d.test", nil, 502, `"message":"The sandbox is not running."`},
		{"closed port", "3000-closed.d.test", nil, 502, `"code":502`},
		{"bad header port is lizard's 401", "127.0.0.1:8081", route("pub", "x"), 401, ""},
		{"lizard order stays lizard's", "sb-80.d.test", route("pub", "3000"), 401, ""},
	}
	for _, tt := range tests {
		r := do(tt.host, tt.hdr)
		if r.Code != tt.status || !strings.Contains(r.Body.String(), tt.body) {
			t.Errorf("%s: %d %q, want %d with %q", tt.name, r.Code, r.Body, tt.status, tt.body)
		}
		if r.Code == 502 {
			var body struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			}
			if err := json.Unmarshal(r.Body.Bytes(), &body); err != nil || body.Message == "" || strings.Contains(body.Message, "127.0.0.1") {
				t.Errorf("%s: 502 body %q", tt.name, r.Body)
			}
		}
	}
	if prev.addrCalls != 0 {
		t.Errorf("E2B traffic asked the lizard previews for an address (a resume) %d times", prev.addrCalls)
	}
}

// TestE2BStreams: a streamed answer reaches the client chunk by chunk, not
// when the upstream is done (envd's process streams, Server-Sent Events).
func TestE2BStreams(t *testing.T) {
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/connect+json")
		w.Write([]byte("first"))
		w.(http.Flusher).Flush()
		<-release
		w.Write([]byte("second"))
	}))
	defer up.Close()
	defer close(release)
	front := httptest.NewServer(Handler(Config{Domain: "d.test", Previews: &fakePreviews{}, E2B: fakeE2B{addr: strings.TrimPrefix(up.URL, "http://")}}))
	defer front.Close()
	req, _ := http.NewRequest("POST", front.URL+"/process.Process/Start", strings.NewReader("{}"))
	req.Host = "49983-pub.d.test"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 5)
	if _, err := io.ReadFull(resp.Body, buf); err != nil || string(buf) != "first" {
		t.Fatalf("first chunk before the upstream finished: %q %v", buf, err)
	}
}

// TestE2BAnswerBeforeRequestEnds: envd answers a Connect call (and may end
// its stream) once it has read the message, while the client (undici with
// a streamed body) may still be finishing the request. The proxy must let
// the answer through meanwhile rather than first wait for, or race its
// upstream copy to consume, the rest of the request.
func TestE2BAnswerBeforeRequestEnds(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// An upstream that answers at once (the agent's Go server waits
		// for the rest of a body, which is short, before its headers).
		_ = http.NewResponseController(w).EnableFullDuplex()
		buf := make([]byte, 5)
		if _, err := io.ReadFull(r.Body, buf); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Write([]byte("got " + string(buf)))
	}))
	defer up.Close()
	front := httptest.NewServer(Handler(Config{Domain: "d.test", Previews: &fakePreviews{}, E2B: fakeE2B{addr: strings.TrimPrefix(up.URL, "http://")}}))
	defer front.Close()

	pr, pw := io.Pipe()
	req, _ := http.NewRequest("POST", front.URL+"/process.Process/Start", pr)
	req.Host = "49983-pub.d.test"
	type result struct {
		resp *http.Response
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		done <- result{resp, err}
	}()
	if _, err := pw.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	var res result
	select {
	case res = <-done:
	case <-time.After(10 * time.Second):
		pw.Close()
		t.Fatal("no answer while the request body is still open")
	}
	// The rest of the request comes after the answer began.
	pw.Write([]byte(" and more"))
	pw.Close()
	if res.err != nil {
		t.Fatal(res.err)
	}
	defer res.resp.Body.Close()
	body, err := io.ReadAll(res.resp.Body)
	if err != nil || string(body) != "got hello" {
		t.Fatalf("answer %q %v, want \"got hello\" whole", body, err)
	}
}

// tlsE2B routes "tls" to a port that serves HTTPS (E2B's httpsPorts) and
// "plain" to the same port as if it served HTTP.
type tlsE2B struct{ addr string }

func (f tlsE2B) E2BTarget(id string, port int) (E2BTarget, error) {
	return E2BTarget{Addr: f.addr, TLS: id == "tls"}, nil
}

// tlsPreviews is fakePreviews whose port 443 serves HTTPS.
type tlsPreviews struct{ fakePreviews }

func (f *tlsPreviews) PortTLS(id string, port int) bool { return port == 443 }

// TestHTTPSPorts: a port that serves HTTPS itself (a self-signed
// certificate) is reached over TLS, unverified, by E2B-addressed and by
// Lizard preview requests; the same port spoken to in plain HTTP fails.
func TestHTTPSPorts(t *testing.T) {
	up := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "tls=%v host=%s", r.TLS != nil, r.Host)
	}))
	defer up.Close()
	addr := strings.TrimPrefix(up.URL, "https://")
	prev := &tlsPreviews{fakePreviews{addr: addr}}
	h := Handler(Config{Domain: "d.test", Previews: prev, E2B: tlsE2B{addr: addr}})
	get := func(host string, hdr map[string]string) *httptest.ResponseRecorder { return getHost(h, host, hdr) }
	if rec := get("8443-tls.d.test", nil); rec.Code != 200 || rec.Body.String() != "tls=true host=8443-tls.d.test" {
		t.Fatalf("E2B httpsPorts: %d %q", rec.Code, rec.Body)
	}
	if rec := get("8443-plain.d.test", nil); rec.Code == 200 {
		t.Fatalf("plain HTTP to a TLS port: %d %q", rec.Code, rec.Body)
	}
	fakeTokens["sb"][443] = "tls-token"
	defer delete(fakeTokens["sb"], 443)
	if rec := get("sb-443.d.test", map[string]string{TokenHeader: "tls-token"}); rec.Code != 200 || !strings.HasPrefix(rec.Body.String(), "tls=true") {
		t.Fatalf("Lizard preview of an HTTPS port: %d %q", rec.Code, rec.Body)
	}
}

// sleepyE2B has sandbox "sleepy" (secure: envd token "at"; private: traffic
// token "tt"), paused with autoResume until E2BWake.
type sleepyE2B struct {
	addr  string
	woken atomic.Int32
}

func (f *sleepyE2B) E2BTarget(id string, port int) (E2BTarget, error) {
	if id != "sleepy" {
		return E2BTarget{}, errdefs.ErrNotFound
	}
	t := E2BTarget{Envd: port == 49983, TrafficToken: "tt"}
	if f.woken.Load() == 0 {
		t.Asleep, t.AccessToken = true, "at"
		return t, nil
	}
	t.Addr = f.addr
	return t, nil
}

func (f *sleepyE2B) E2BWake(ctx context.Context, id string) error {
	f.woken.Add(1)
	return nil
}

// TestE2BWake: a sleeping autoResume sandbox is woken only by a request
// the proxy admits (envd's access token, a private port's traffic token),
// which is then forwarded; the others get the answers a running sandbox
// would give them, or E2B's "not running", and wake nothing.
func TestE2BWake(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "up") }))
	defer up.Close()
	f := &sleepyE2B{addr: strings.TrimPrefix(up.URL, "http://")}
	h := Handler(Config{Domain: "d.test", Previews: &fakePreviews{}, E2B: f})
	do := func(host string, hdr map[string]string) *httptest.ResponseRecorder { return getHost(h, host, hdr) }
	for _, tc := range []struct {
		name   string
		host   string
		hdr    map[string]string
		status int
	}{
		{"envd without its access token", "49983-sleepy.d.test", nil, 502},
		{"envd with a wrong access token", "49983-sleepy.d.test", map[string]string{"X-Access-Token": "no"}, 502},
		{"a private port without its traffic token", "3000-sleepy.d.test", nil, 403},
	} {
		if rec := do(tc.host, tc.hdr); rec.Code != tc.status || f.woken.Load() != 0 {
			t.Fatalf("%s: %d %s (woken %d), want %d and asleep", tc.name, rec.Code, rec.Body, f.woken.Load(), tc.status)
		}
	}
	if rec := do("3000-sleepy.d.test", map[string]string{TrafficTokenHeader: "tt"}); rec.Code != 200 || rec.Body.String() != "up" || f.woken.Load() != 1 {
		t.Fatalf("an admitted request: %d %q (woken %d), want it woken once and forwarded", rec.Code, rec.Body, f.woken.Load())
	}
}

// getHost sends h a GET of / on host with headers hdr.
func getHost(h http.Handler, host string, hdr map[string]string) *httptest.ResponseRecorder {
	req := httptest.NewRequest("GET", "http://"+host+"/", nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}
