package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/net/dns/dnsmessage"

	"github.com/lizard-build/lizard/internal/egress"
	"github.com/lizard-build/lizard/internal/network"
)

// The egress section: an HTTPS request from a sandbox to a host of a fake
// internet (a network namespace of the bench's own, 10.95.0.0/24, HTTPS
// with HTTP/2 on .2 with a certificate of a bench CA, a DNS server on the
// host side), timed inside the sandbox by bench/egressclient, on three
// paths:
//
//   - today's: the sandbox's network is open, nothing goes through the
//     egress proxy (NAT, the forward chain);
//   - spliced: allowOut the name, denyOut everything: the proxy reads the
//     SNI and copies the bytes;
//   - intercepted: a transform rule for the name: the proxy terminates TLS
//     with the node's CA and re-originates it, adding a header.
//
// Per path: the latency of a request on one kept-alive connection and on a
// new connection each time (p50, p99, and what the proxy adds to today's),
// and a 100 MiB download's throughput.

const (
	egressBenchNS   = "lzbench-inet"
	egressBenchVeth = "lzbenchinet"
	egressBenchName = "web.bench"
)

var egressBenchNet = netip.MustParsePrefix("10.95.0.0/24")

type egressRow struct {
	name            string
	keep, fresh     []time.Duration
	download        float64 // bytes a second
	downloadSeconds float64
}

func benchEgress(ctx context.Context, cfg config, w io.Writer, n int) error {
	inet, err := startBenchInternet()
	if err != nil {
		return fmt.Errorf("the fake internet: %w", err)
	}
	defer inet.close()
	srv, err := startServer(ctx, cfg, "--dns-upstream", inet.dns, "--egress-ca-file", inet.caFile)
	if err != nil {
		return err
	}
	defer srv.stop()
	client := filepath.Join(srv.dir, "egressclient")
	b := exec.Command("go", "build", "-o", client, "./bench/egressclient")
	b.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := b.CombinedOutput(); err != nil {
		return fmt.Errorf("build egressclient: %v %s", err, out)
	}
	bin, err := os.ReadFile(client)
	if err != nil {
		return err
	}
	paths := []struct {
		name    string
		network map[string]any
	}{
		{"today's path (no proxy)", nil},
		{"spliced (SNI read, bytes copied)", map[string]any{"allowOut": []string{egressBenchName}, "denyOut": []string{"0.0.0.0/0"}}},
		{"intercepted (TLS terminated, a header added)", map[string]any{"allowOut": []string{egressBenchName}, "denyOut": []string{"0.0.0.0/0"},
			"rules": map[string]any{egressBenchName: []any{map[string]any{"transform": map[string]any{"headers": map[string]string{"X-Bench": "1"}}}}}}},
	}
	var rows []egressRow
	for _, p := range paths {
		row, err := benchEgressPath(srv, p.name, p.network, bin, inet.caPEM, n)
		if err != nil {
			return fmt.Errorf("%s: %w", p.name, err)
		}
		fmt.Fprintf(os.Stderr, "measured egress %s\n", p.name)
		rows = append(rows, row)
	}
	printEgressTable(w, "HTTPS from a sandbox", "timed inside the sandbox (bench/egressclient)", rows)
	fmt.Fprintln(w)
	return benchEgressLoopback(w, n)
}

func benchEgressPath(s *server, name string, network map[string]any, bin, caPEM []byte, n int) (egressRow, error) {
	row := egressRow{name: name}
	body := map[string]any{"template": "base", "timeoutMs": 1800000}
	if network != nil {
		body["network"] = network
	}
	var sb struct {
		SandboxID string `json:"sandboxId"`
	}
	if err := s.call("POST", "/api/sandboxes", body, &sb); err != nil {
		return row, err
	}
	defer s.kill(sb.SandboxID)
	id := sb.SandboxID
	if err := s.post("/api/sandboxes/"+id+"/files", map[string]any{"path": "/tmp/egressclient", "content": base64.StdEncoding.EncodeToString(bin), "encoding": "base64"}, nil); err != nil {
		return row, err
	}
	if err := s.post("/api/sandboxes/"+id+"/files", map[string]any{"path": "/tmp/bench-ca.pem", "content": string(caPEM)}, nil); err != nil {
		return row, err
	}
	run := func(args string) ([]byte, error) {
		var out struct {
			Stdout   string `json:"stdout"`
			Stderr   string `json:"stderr"`
			ExitCode int    `json:"exitCode"`
		}
		if err := s.post("/api/sandboxes/"+id+"/exec", map[string]any{"cmd": "chmod +x /tmp/egressclient && /tmp/egressclient -ca /tmp/bench-ca.pem " + args, "timeout": 600}, &out); err != nil {
			return nil, err
		}
		if out.ExitCode != 0 {
			return nil, fmt.Errorf("egressclient %s: exit %d: %s", args, out.ExitCode, out.Stderr)
		}
		return []byte(out.Stdout), nil
	}
	lat := func(args string) ([]time.Duration, error) {
		b, err := run(args)
		if err != nil {
			return nil, err
		}
		var r struct {
			Lat []int64 `json:"lat"`
		}
		if err := json.Unmarshal(b, &r); err != nil {
			return nil, err
		}
		out := make([]time.Duration, len(r.Lat))
		for i, v := range r.Lat {
			out[i] = time.Duration(v)
		}
		return out, nil
	}
	url := "https://" + egressBenchName + "/small"
	var err error
	if row.keep, err = lat(fmt.Sprintf("-url %s -n %d", url, 20*n)); err != nil {
		return row, err
	}
	if row.fresh, err = lat(fmt.Sprintf("-url %s -n %d -new", url, 5*n)); err != nil {
		return row, err
	}
	b, err := run("-download -url https://" + egressBenchName + "/download?n=" + strconv.Itoa(100<<20))
	if err != nil {
		return row, err
	}
	var d struct {
		Bytes   int64   `json:"bytes"`
		Seconds float64 `json:"seconds"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return row, err
	}
	if d.Bytes != 100<<20 {
		return row, fmt.Errorf("downloaded %d bytes, want %d", d.Bytes, 100<<20)
	}
	row.download, row.downloadSeconds = float64(d.Bytes)/d.Seconds, d.Seconds
	return row, nil
}

// p99 is the 99th percentile of ds.
func p99(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[int(0.99*float64(len(s)-1)+0.5)]
}

func printEgressTable(w io.Writer, title, where string, rows []egressRow) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, title+"\tkeep-alive p50\tp99\tadded p50\tadded p99\tnew conn p50\tp99\tadded p50\tadded p99\t100 MiB\tratio\t")
	base := rows[0]
	bk, bf := stats(base.keep)[1], stats(base.fresh)[1]
	bk99, bf99 := p99(base.keep), p99(base.fresh)
	for _, r := range rows {
		k, f := stats(r.keep)[1], stats(r.fresh)[1]
		k99, f99 := p99(r.keep), p99(r.fresh)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.0f MiB/s\t%.2fx\t\n", r.name, ms(k), ms(k99), signed(k-bk), signed(k99-bk99),
			ms(f), ms(f99), signed(f-bf), signed(f99-bf99), r.download/(1<<20), r.download/base.download)
	}
	tw.Flush()
	fmt.Fprintf(w, "%s, HTTP/2; keep-alive: %d requests on one connection; new conn: %d, each a TCP and TLS handshake; added: over the first row\n",
		where, len(base.keep), len(base.fresh))
}

func signed(d time.Duration) string {
	if d < 0 {
		return "-" + ms(-d)
	}
	return "+" + ms(d)
}

// benchInternet is the egress section's fake internet.
type benchInternet struct {
	dns    string
	caFile string
	caPEM  []byte
	close  func()
}

func startBenchInternet() (*benchInternet, error) {
	gw, web := egressBenchNet.Addr().Next(), egressBenchNet.Addr().Next().Next()
	cleanup := func() {
		exec.Command("ip", "netns", "del", egressBenchNS).Run()
		exec.Command("ip", "link", "del", egressBenchVeth).Run()
	}
	cleanup()
	for _, args := range [][]string{
		{"ip", "netns", "add", egressBenchNS},
		{"ip", "link", "add", egressBenchVeth, "type", "veth", "peer", "name", "eth0", "netns", egressBenchNS},
		{"ip", "addr", "add", gw.String() + "/24", "dev", egressBenchVeth},
		{"ip", "link", "set", egressBenchVeth, "up"},
		{"ip", "-n", egressBenchNS, "addr", "add", web.String() + "/24", "dev", "eth0"},
		{"ip", "-n", egressBenchNS, "link", "set", "eth0", "up"},
		{"ip", "-n", egressBenchNS, "link", "set", "lo", "up"},
		{"ip", "-n", egressBenchNS, "route", "add", "default", "via", gw.String()},
	} {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			cleanup()
			return nil, fmt.Errorf("%v: %v %s", args, err, out)
		}
	}
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "lizard bench CA"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(48 * time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, _ := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caKey.Public(), caKey)
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: egressBenchName}, DNSNames: []string{egressBenchName},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(48 * time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		cleanup()
		return nil, err
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	caFile := filepath.Join(os.TempDir(), fmt.Sprintf("lizard-bench-ca-%d.pem", os.Getpid()))
	if err := os.WriteFile(caFile, caPEM, 0o644); err != nil {
		cleanup()
		return nil, err
	}
	ln, err := listenIn(egressBenchNS, "0.0.0.0:443")
	if err != nil {
		cleanup()
		return nil, err
	}
	payload := make([]byte, 256<<10)
	srv := &http.Server{TLSConfig: &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}},
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/download" {
				io.WriteString(w, "ok")
				return
			}
			size, _ := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
			w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
			for size > 0 {
				k := min(size, int64(len(payload)))
				if _, err := w.Write(payload[:k]); err != nil {
					return
				}
				size -= k
			}
		})}
	go srv.ServeTLS(ln, "", "")
	dns := netip.AddrPortFrom(gw, 5353).String()
	pc, err := net.ListenPacket("udp4", dns)
	if err != nil {
		srv.Close()
		cleanup()
		return nil, err
	}
	go serveBenchDNS(pc, web)
	return &benchInternet{dns: dns, caFile: caFile, caPEM: caPEM, close: func() {
		srv.Close()
		pc.Close()
		os.Remove(caFile)
		cleanup()
	}}, nil
}

// listenIn opens a TCP listener in network namespace ns.
func listenIn(ns, addr string) (net.Listener, error) {
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return nil, err
	}
	defer orig.Close()
	h, err := netns.GetFromName(ns)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	if err := netns.Set(h); err != nil {
		return nil, err
	}
	ln, lerr := net.Listen("tcp4", addr)
	if err := netns.Set(orig); err != nil {
		panic(fmt.Sprintf("back to the host's network namespace: %v", err))
	}
	return ln, lerr
}

// serveBenchDNS answers web.bench with web, anything else NXDOMAIN.
func serveBenchDNS(pc net.PacketConn, web netip.Addr) {
	buf := make([]byte, 1500)
	for {
		k, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		var p dnsmessage.Parser
		h, err := p.Start(buf[:k])
		if err != nil {
			continue
		}
		q, err := p.Question()
		if err != nil {
			continue
		}
		m := dnsmessage.Message{Header: dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true}, Questions: []dnsmessage.Question{q}}
		switch {
		case strings.TrimSuffix(strings.ToLower(q.Name.String()), ".") != egressBenchName:
			m.Header.RCode = dnsmessage.RCodeNameError
		case q.Type == dnsmessage.TypeA:
			m.Answers = []dnsmessage.Resource{{Header: dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: 60},
				Body: &dnsmessage.AResource{A: web.As4()}}}
		}
		if b, err := m.Pack(); err == nil {
			pc.WriteTo(b, from)
		}
	}
}

// benchEgressLoopback measures the egress proxy alone, in this process on
// loopback, without a sandbox or a firewall in the way (its OriginalDst
// answers the upstream): what the proxy itself adds to a request, apart
// from gVisor's network stack and the host's load on it.
func benchEgressLoopback(w io.Writer, n int) error {
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "lizard bench CA"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(48 * time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, _ := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caKey.Public(), caKey)
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: egressBenchName}, DNSNames: []string{egressBenchName},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(48 * time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, _ := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	upLn, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return err
	}
	payload := make([]byte, 256<<10)
	up := &http.Server{TLSConfig: &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}},
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/download" {
				io.WriteString(w, "ok")
				return
			}
			size, _ := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
			w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
			for size > 0 {
				k := min(size, int64(len(payload)))
				if _, err := w.Write(payload[:k]); err != nil {
					return
				}
				size -= k
			}
		})}
	go up.ServeTLS(upLn, "", "")
	defer up.Close()
	upAddr := netip.MustParseAddrPort(upLn.Addr().String())

	dir, err := os.MkdirTemp("", "lizard-bench-egress-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	lizardCA, err := egress.OpenCA(dir, "bench")
	if err != nil {
		return err
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	src := &loopbackSources{}
	pln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return err
	}
	p := egress.New(egress.Config{Listener: pln, Sources: src, CA: lizardCA, RootCAs: roots, NamedPorts: []uint16{upAddr.Port()},
		OriginalDst: func(net.Conn) (netip.AddrPort, error) { return upAddr, nil }, Logger: slog.New(slog.DiscardHandler)})
	go p.Serve()
	defer p.Close()
	clientRoots := x509.NewCertPool()
	clientRoots.AddCert(ca)
	clientRoots.AddCert(lizardCA.Certificate())

	paths := []struct {
		name   string
		to     string
		egress network.Egress
	}{
		{"direct (no proxy)", upLn.Addr().String(), network.Egress{}},
		{"spliced", pln.Addr().String(), network.Egress{Restricted: true, Allowed: []string{egressBenchName}}},
		{"intercepted", pln.Addr().String(), network.Egress{Restricted: true, Allowed: []string{egressBenchName},
			Rules: map[string][]network.Rule{egressBenchName: {{Transform: &network.Transform{Headers: map[string]string{"X-Bench": "1"}}}}}}},
	}
	var rows []egressRow
	for _, path := range paths {
		src.set(path.egress)
		row := egressRow{name: path.name}
		client := func(fresh bool) *http.Client {
			return &http.Client{Transport: &http.Transport{
				DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
					return (&net.Dialer{}).DialContext(ctx, "tcp4", path.to)
				},
				TLSClientConfig:   &tls.Config{RootCAs: clientRoots},
				ForceAttemptHTTP2: true, DisableKeepAlives: fresh, DisableCompression: true,
			}}
		}
		get := func(c *http.Client, url string) (int64, error) {
			res, err := c.Get(url)
			if err != nil {
				return 0, err
			}
			defer res.Body.Close()
			return io.Copy(io.Discard, res.Body)
		}
		for _, fresh := range []bool{false, true} {
			c := client(fresh)
			k := 100 * n
			if fresh {
				k = 25 * n
			}
			if _, err := get(c, "https://"+egressBenchName+"/small"); err != nil {
				return fmt.Errorf("%s: %w", path.name, err)
			}
			lat := make([]time.Duration, 0, k)
			for range k {
				t := time.Now()
				if _, err := get(c, "https://"+egressBenchName+"/small"); err != nil {
					return fmt.Errorf("%s: %w", path.name, err)
				}
				lat = append(lat, time.Since(t))
			}
			if fresh {
				row.fresh = lat
			} else {
				row.keep = lat
			}
			c.CloseIdleConnections()
		}
		c := client(false)
		t := time.Now()
		got, err := get(c, "https://"+egressBenchName+"/download?n="+strconv.Itoa(100<<20))
		if err != nil || got != 100<<20 {
			return fmt.Errorf("%s: download: %d bytes, %v", path.name, got, err)
		}
		row.downloadSeconds = time.Since(t).Seconds()
		row.download = float64(got) / row.downloadSeconds
		c.CloseIdleConnections()
		fmt.Fprintf(os.Stderr, "measured egress on loopback: %s\n", path.name)
		rows = append(rows, row)
	}
	printEgressTable(w, "the proxy alone, on loopback", "timed by a client in the bench's process", rows)
	return nil
}

// loopbackSources is every loopback address as one sandbox with the
// configuration of the path being measured.
type loopbackSources struct {
	mu sync.Mutex
	e  network.Egress
}

func (s *loopbackSources) set(e network.Egress) {
	s.mu.Lock()
	s.e = e
	s.mu.Unlock()
}

func (s *loopbackSources) Source(a netip.Addr) (egress.Source, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return egress.Source{SandboxID: "bench", ProjectID: "bench", Egress: s.e}, a.IsLoopback()
}

func (s *loopbackSources) Exists(string) bool { return true }
