package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/lizard-build/lizard/internal/egress"
	"github.com/lizard-build/lizard/internal/egress/egresstest"
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
		stdout, err := s.output(id, map[string]any{"cmd": "chmod +x /tmp/egressclient && /tmp/egressclient -ca /tmp/bench-ca.pem " + args, "timeout": 600})
		return []byte(stdout), err
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
	ln, err := egresstest.ListenIn(egressBenchNS, "0.0.0.0:443")
	if err != nil {
		cleanup()
		return nil, err
	}
	srv, ca, err := serveBenchUpstream(ln)
	if err != nil {
		cleanup()
		return nil, err
	}
	caPEM := ca.PEM()
	caFile := filepath.Join(os.TempDir(), fmt.Sprintf("lizard-bench-ca-%d.pem", os.Getpid()))
	if err := os.WriteFile(caFile, caPEM, 0o644); err != nil {
		srv.Close()
		cleanup()
		return nil, err
	}
	dns := netip.AddrPortFrom(gw, 5353).String()
	pc, err := net.ListenPacket("udp4", dns)
	if err != nil {
		srv.Close()
		cleanup()
		return nil, err
	}
	go egresstest.ServeDNS(pc, func(name string) (netip.Addr, bool) { return web, name == egressBenchName })
	return &benchInternet{dns: dns, caFile: caFile, caPEM: caPEM, close: func() {
		srv.Close()
		pc.Close()
		os.Remove(caFile)
		cleanup()
	}}, nil
}

// serveBenchUpstream serves HTTPS (HTTP/2) on ln for egressBenchName with
// a certificate of a CA of its own: "ok" at every path but /download,
// which answers ?n= bytes.
func serveBenchUpstream(ln net.Listener) (*http.Server, *egresstest.CA, error) {
	ca, err := egresstest.NewCA("lizard bench CA")
	if err != nil {
		return nil, nil, err
	}
	cert, err := ca.ServerCert([]string{egressBenchName})
	if err != nil {
		return nil, nil, err
	}
	srv := &http.Server{TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}},
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/download" {
				egresstest.WriteBytes(w, r)
				return
			}
			io.WriteString(w, "ok")
		})}
	go srv.ServeTLS(ln, "", "")
	return srv, ca, nil
}

// benchEgressLoopback measures the egress proxy alone, in this process on
// loopback, without a sandbox or a firewall in the way (its OriginalDst
// answers the upstream): what the proxy itself adds to a request, apart
// from gVisor's network stack and the host's load on it.
func benchEgressLoopback(w io.Writer, n int) error {
	upLn, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return err
	}
	up, ca, err := serveBenchUpstream(upLn)
	if err != nil {
		return err
	}
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
	roots := ca.Pool()
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
	clientRoots.AddCert(ca.Cert)
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
