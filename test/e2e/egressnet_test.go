package e2e

import (
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/egress/egresstest"
)

// egressNet is the egress proxy tests' fake internet: a network namespace
// of the test's own (names and a /24 of 10.96.0.0/16 from the test's salt,
// so runs from several work trees can share the host), joined to the host
// by a veth and reached from sandboxes through the host as the internet
// would be. In it:
//
//   - .2, .3 and .4 serve HTTPS on 443 (HTTP/1.1 and HTTP/2) and HTTP on
//     80, with one certificate of a test CA for every name below and the
//     three addresses, echoing as JSON what they received (host, proto,
//     headers, the address it came to); /download?n= answers n bytes;
//     /seen?path= says whether a request for path came, and /socks lists
//     what the SOCKS5 server was asked;
//   - .5:1080 is a SOCKS5 server (username/password), which connects to
//     the names below by itself;
//   - on the host side (.1:5353) a DNS server answers allowed.test,
//     rules.test, denied.test and other.test with .2 and far.test with
//     .3; the server's resolver forwards to it
//     (--dns-upstream), and the CA is the node's --egress-ca-file.
//
// Nothing leaves this machine.
type egressNet struct {
	ns, veth string
	prefix   netip.Prefix
	gw       netip.Addr // the host's side
	web      netip.Addr // .2: the names' address
	far      netip.Addr // .3
	near     netip.Addr // .4
	socks    string     // .5:1080
	dnsAddr  string
	caFile   string
	caPEM    []byte

	socksServer *egresstest.SOCKS5
	mu          sync.Mutex
	seen        map[string]http.Header // path → headers of requests for /probe/…
}

const (
	egressSocksUser = "lizard"
	egressSocksPass = "socks-password"
)

// egressNames are the fake internet's names, all at .2 but far.test.
var egressNames = []string{"allowed.test", "rules.test", "denied.test", "other.test"}

func startEgressNet(t *testing.T) *egressNet {
	t.Helper()
	sum := sha256.Sum256([]byte(os.Getenv("LIZARD_E2E_SALT") + "egressnet"))
	tag := hex.EncodeToString(sum[:])[:6]
	n := &egressNet{ns: "lzen" + tag, veth: "lzen" + tag, seen: map[string]http.Header{}}
	third := int(sum[3]) % 250
	for i := 0; ; i++ {
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 96, byte((third + i) % 250), 0}), 24)
		if !hostHasAddrIn(p) {
			n.prefix = p
			break
		}
		if i > 250 {
			t.Fatal("no free /24 in 10.96.0.0/16 for the fake internet")
		}
	}
	base := n.prefix.Addr().As4()
	at := func(last byte) netip.Addr { b := base; b[3] = last; return netip.AddrFrom4(b) }
	n.gw, n.web, n.far, n.near = at(1), at(2), at(3), at(4)
	n.socks = netip.AddrPortFrom(at(5), 1080).String()
	n.dnsAddr = netip.AddrPortFrom(n.gw, 5353).String()

	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v %s", args, err, out)
		}
	}
	cleanup := func() {
		exec.Command("ip", "netns", "del", n.ns).Run()
		exec.Command("ip", "link", "del", n.veth).Run()
	}
	cleanup()
	t.Cleanup(cleanup)
	run("ip", "netns", "add", n.ns)
	run("ip", "link", "add", n.veth, "type", "veth", "peer", "name", "eth0", "netns", n.ns)
	run("ip", "addr", "add", n.gw.String()+"/24", "dev", n.veth)
	run("ip", "link", "set", n.veth, "up")
	for _, a := range []netip.Addr{n.web, n.far, n.near, at(5)} {
		run("ip", "-n", n.ns, "addr", "add", a.String()+"/24", "dev", "eth0")
	}
	run("ip", "-n", n.ns, "link", "set", "eth0", "up")
	run("ip", "-n", n.ns, "link", "set", "lo", "up")
	run("ip", "-n", n.ns, "route", "add", "default", "via", n.gw.String())

	ca, err := egresstest.NewCA("egress e2e CA")
	if err != nil {
		t.Fatal(err)
	}
	n.caPEM = ca.PEM()
	cert, err := ca.ServerCert(append(append([]string{}, egressNames...), "far.test"), n.web, n.far, n.near)
	if err != nil {
		t.Fatal(err)
	}
	n.caFile = filepath.Join(t.TempDir(), "egress-test-ca.pem")
	if err := os.WriteFile(n.caFile, n.caPEM, 0o644); err != nil {
		t.Fatal(err)
	}

	tlsLn := n.listen(t, "0.0.0.0:443")
	httpLn := n.listen(t, "0.0.0.0:80")
	socksLn := n.listen(t, n.socks)
	srv := &http.Server{Handler: http.HandlerFunc(n.echo), TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}},
		ReadHeaderTimeout: 10 * time.Second}
	go srv.ServeTLS(tlsLn, "", "")
	plain := &http.Server{Handler: http.HandlerFunc(n.echo), ReadHeaderTimeout: 10 * time.Second}
	go plain.Serve(httpLn)
	web := n.web.String()
	n.socksServer = egresstest.ServeSOCKS5(socksLn, egresstest.WithAuth(egressSocksUser, egressSocksPass),
		egresstest.WithDial(func(network, addr string) (net.Conn, error) {
			host, port, _ := net.SplitHostPort(addr)
			if strings.HasSuffix(host, ".test") {
				host = web // the proxy's own resolution of the names
			}
			return net.DialTimeout("tcp", net.JoinHostPort(host, port), 5*time.Second)
		}))
	pc, err := net.ListenPacket("udp4", n.dnsAddr)
	if err != nil {
		t.Fatal(err)
	}
	go egresstest.ServeDNS(pc, n.resolve)
	t.Cleanup(func() {
		srv.Close()
		plain.Close()
		n.socksServer.Close()
		pc.Close()
	})
	return n
}

// hostHasAddrIn says whether an interface of the host has an address in p.
func hostHasAddrIn(p netip.Prefix) bool {
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if in, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(in.IP.To4()); ok && p.Contains(ip) {
				return true
			}
		}
	}
	return false
}

// listen opens a TCP listener in the fake internet's namespace.
func (n *egressNet) listen(t *testing.T, addr string) net.Listener {
	t.Helper()
	ln, err := egresstest.ListenIn(n.ns, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// echoReply is what the fake internet's servers answer.
type echoReply struct {
	Host    string            `json:"host"`
	Proto   string            `json:"proto"`
	TLS     bool              `json:"tls"`
	Addr    string            `json:"addr"`
	Headers map[string]string `json:"headers"`
}

func (n *egressNet) echo(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/download":
		egresstest.WriteBytes(w, r)
		return
	case "/seen":
		n.mu.Lock()
		h, ok := n.seen[r.URL.Query().Get("path")]
		n.mu.Unlock()
		json.NewEncoder(w).Encode(map[string]any{"seen": ok, "headers": h})
		return
	case "/socks":
		json.NewEncoder(w).Encode(n.socksServer.Requests())
		return
	}
	io.Copy(io.Discard, r.Body)
	if strings.HasPrefix(r.URL.Path, "/probe/") {
		n.mu.Lock()
		n.seen[r.URL.Path] = r.Header.Clone()
		n.mu.Unlock()
	}
	local, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	e := echoReply{Host: r.Host, Proto: r.Proto, TLS: r.TLS != nil, Headers: map[string]string{}}
	if local != nil {
		e.Addr, _, _ = net.SplitHostPort(local.String())
	}
	for k := range r.Header {
		e.Headers[k] = r.Header.Get(k)
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(e)
}

// resolve is the fake internet's DNS.
func (n *egressNet) resolve(name string) (netip.Addr, bool) {
	if name == "far.test" {
		return n.far, true
	}
	return n.web, slices.Contains(egressNames, name)
}

// env is what the SDK tests of the egress proxy are told of the fake
// internet.
func (n *egressNet) env() []string {
	return []string{"EGRESS_WEB=" + n.web.String(), "EGRESS_FAR=" + n.far.String(), "EGRESS_NEAR=" + n.near.String(),
		"EGRESS_NET=" + n.prefix.String(), "EGRESS_SOCKS=" + n.socks, "EGRESS_SOCKS_USER=" + egressSocksUser,
		"EGRESS_SOCKS_PASS=" + egressSocksPass, "EGRESS_CA=" + n.caFile}
}
