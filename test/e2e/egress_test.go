package e2e

import (
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/egress/egresstest"
)

// fakeInternet is a test host in a network namespace of its own, reached
// from sandboxes only by being routed through this host like the internet
// would be: 10.99.0.2 and 10.99.0.3 serve HTTP on 8080, and a DNS server on
// the host side (10.99.0.1:5353) answers allowed.test → .2, denied.test → .3.
// Nothing leaves this machine.
type fakeInternet struct {
	dns net.PacketConn
}

const inetNS = "lztest-inet"

func startFakeInternet(t *testing.T) *fakeInternet {
	t.Helper()
	run := func(args ...string) {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v %s", args, err, out)
		}
	}
	exec.Command("ip", "netns", "del", inetNS).Run()
	exec.Command("ip", "link", "del", "lztinet0").Run()
	run("ip", "netns", "add", inetNS)
	run("ip", "link", "add", "lztinet0", "type", "veth", "peer", "name", "eth0", "netns", inetNS)
	run("ip", "addr", "add", "10.99.0.1/24", "dev", "lztinet0")
	run("ip", "link", "set", "lztinet0", "up")
	run("ip", "-n", inetNS, "addr", "add", "10.99.0.2/24", "dev", "eth0")
	run("ip", "-n", inetNS, "addr", "add", "10.99.0.3/24", "dev", "eth0")
	run("ip", "-n", inetNS, "link", "set", "eth0", "up")
	run("ip", "-n", inetNS, "link", "set", "lo", "up")
	run("ip", "-n", inetNS, "route", "add", "default", "via", "10.99.0.1")
	srv := exec.Command("ip", "netns", "exec", inetNS, "python3", "-c",
		`import http.server as h
class H(h.BaseHTTPRequestHandler):
    def do_GET(self):
        b = ("internet " + self.connection.getsockname()[0]).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(b))); self.end_headers(); self.wfile.write(b)
    def log_message(self, *a): pass
h.ThreadingHTTPServer(("0.0.0.0", 8080), H).serve_forever()`)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	f := &fakeInternet{}
	pc, err := net.ListenPacket("udp4", "10.99.0.1:5353")
	if err != nil {
		t.Fatal(err)
	}
	f.dns = pc
	go egresstest.ServeDNS(pc, resolveTestName)
	t.Cleanup(func() {
		pc.Close()
		srv.Process.Kill()
		srv.Wait()
		exec.Command("ip", "netns", "del", inetNS).Run()
		exec.Command("ip", "link", "del", "lztinet0").Run()
	})
	return f
}

// testNames are the fake internet's names.
var testNames = map[string]netip.Addr{"allowed.test": netip.MustParseAddr("10.99.0.2"), "denied.test": netip.MustParseAddr("10.99.0.3")}

func resolveTestName(name string) (netip.Addr, bool) {
	a, ok := testNames[name]
	return a, ok
}

func (s *server) createWith(t *testing.T, body map[string]any) sandboxInfoEgress {
	t.Helper()
	body["template"] = "base"
	var sb sandboxInfoEgress
	if code, raw := s.do("POST", "/api/sandboxes", body, &sb); code >= 300 {
		t.Fatalf("create %v: %d %s", body, code, raw)
	}
	return sb
}

type sandboxInfoEgress struct {
	SandboxID      string   `json:"sandboxId"`
	InternetAccess bool     `json:"internetAccess"`
	AllowedHosts   []string `json:"allowedHosts"`
}

// curl's exit statuses that mean "the network did not let me through":
// the name did not resolve, the connection was refused or reset, or it
// timed out. Any other status (curl missing, a bad option, an HTTP error
// with --fail, …) is a broken test, not a blocked sandbox.
var curlBlocked = map[int]string{6: "could not resolve host", 7: "could not connect", 28: "timed out", 56: "connection reset"}

// reach runs curl in the sandbox and returns the body, or "" when the
// network kept it from connecting. It fails the test when the exec itself
// fails or curl fails for another reason, so that "no access" is never a
// broken exec.
func (s *server) reach(t *testing.T, id, url string) string {
	t.Helper()
	var out execReply
	if code, raw := s.do("POST", "/api/sandboxes/"+id+"/exec", map[string]any{"cmd": []string{"curl", "-sS", "-m", "3", url}}, &out); code != 200 {
		t.Fatalf("exec curl %s in %s: %d %s", url, id, code, raw)
	}
	if out.ExitCode == 0 {
		return out.Stdout
	}
	why, ok := curlBlocked[out.ExitCode]
	if !ok {
		t.Fatalf("curl %s in %s: exit %d, which is not a blocked connection: %s", url, id, out.ExitCode, out.Stderr)
	}
	t.Logf("curl %s: %s (exit %d)", url, why, out.ExitCode)
	return ""
}

// TestEgress: sandboxes reach the (fake) internet through NAT by default;
// internetAccess:false and allowedHosts restrict it on the host's network
// path; no sandbox reaches another, the host's services or the metadata
// range.
func TestEgress(t *testing.T) {
	startFakeInternet(t)
	s := startServer(t, "", "--dns-upstream", "10.99.0.1:5353")
	open := s.createWith(t, map[string]any{})
	closed := s.createWith(t, map[string]any{"internetAccess": false})
	byName := s.createWith(t, map[string]any{"internetAccess": false, "allowedHosts": []string{"allowed.test", "*.wild.test"}})
	byCIDR := s.createWith(t, map[string]any{"allowedHosts": []string{"10.99.0.3/32"}})
	for _, sb := range []sandboxInfoEgress{open, closed, byName, byCIDR} {
		defer s.do("DELETE", "/api/sandboxes/"+sb.SandboxID, nil, nil)
	}
	if !open.InternetAccess || len(open.AllowedHosts) != 0 || closed.InternetAccess || byName.InternetAccess ||
		strings.Join(byName.AllowedHosts, ",") != "allowed.test,*.wild.test" || byCIDR.InternetAccess {
		t.Fatalf("echoed policies: %+v %+v %+v %+v", open, closed, byName, byCIDR)
	}
	var info sandboxInfoEgress
	s.do("GET", "/api/sandboxes/"+byName.SandboxID, nil, &info)
	if info.InternetAccess || len(info.AllowedHosts) != 2 {
		t.Fatalf("SandboxInfo: %+v", info)
	}

	t.Run("open: internet through NAT and DNS", func(t *testing.T) {
		if got := s.reach(t, open.SandboxID, "http://10.99.0.2:8080/"); got != "internet 10.99.0.2" {
			t.Fatalf("got %q", got)
		}
		if got := s.reach(t, open.SandboxID, "http://denied.test:8080/"); got != "internet 10.99.0.3" {
			t.Fatalf("by name: %q", got)
		}
	})
	t.Run("internetAccess false: nothing", func(t *testing.T) {
		for _, u := range []string{"http://10.99.0.2:8080/", "http://allowed.test:8080/"} {
			if got := s.reach(t, closed.SandboxID, u); got != "" {
				t.Fatalf("%s: %q", u, got)
			}
		}
	})
	t.Run("allowedHosts by name: only those names", func(t *testing.T) {
		if got := s.reach(t, byName.SandboxID, "http://allowed.test:8080/"); got != "internet 10.99.0.2" {
			t.Fatalf("allowed.test: %q", got)
		}
		if got := s.reach(t, byName.SandboxID, "http://denied.test:8080/"); got != "" {
			t.Fatalf("denied.test: %q", got)
		}
		if got := s.reach(t, byName.SandboxID, "http://10.99.0.3:8080/"); got != "" {
			t.Fatalf("by address around the name check: %q", got)
		}
	})
	t.Run("allowedHosts by CIDR", func(t *testing.T) {
		if got := s.reach(t, byCIDR.SandboxID, "http://10.99.0.3:8080/"); got != "internet 10.99.0.3" {
			t.Fatalf("in range: %q", got)
		}
		if got := s.reach(t, byCIDR.SandboxID, "http://10.99.0.2:8080/"); got != "" {
			t.Fatalf("out of range: %q", got)
		}
	})
	t.Run("no sandbox reaches another, the host or the metadata range", func(t *testing.T) {
		ln, err := net.Listen("tcp4", "0.0.0.0:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Write([]byte("HTTP/1.0 200 OK\r\n\r\nhost service"))
				c.Close()
			}
		}()
		_, port, _ := net.SplitHostPort(ln.Addr().String())
		var peerIP execReply
		s.do("POST", "/api/sandboxes/"+closed.SandboxID+"/exec", map[string]any{"cmd": "hostname -I"}, &peerIP)
		peer := strings.TrimSpace(peerIP.Stdout)
		gw := s.gateway()
		for _, u := range []string{
			fmt.Sprintf("http://%s:%s/", gw, port),           // a listener on the host, on every address
			"http://" + strings.TrimPrefix(s.url, "http://"), // the API (loopback only)
			fmt.Sprintf("http://%s:49983/health", peer),      // another sandbox's agent
			"http://169.254.169.254/latest/meta-data/",       // cloud metadata
		} {
			start := time.Now()
			if got := s.reach(t, open.SandboxID, u); got != "" {
				t.Fatalf("%s reachable from a sandbox: %q", u, got)
			}
			t.Logf("%s: refused after %v", u, time.Since(start).Round(time.Millisecond))
		}
	})
}
