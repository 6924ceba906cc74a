// Command egressclient is the client the bench's egress section runs in a
// sandbox: HTTPS requests to one URL, on one kept-alive connection or on a
// new connection each, or one download, timed from inside the sandbox. It
// prints JSON: the latencies in nanoseconds, or the bytes and seconds of
// the download. It trusts the system's store (with the node's egress CA)
// and the CA file given (the bench's upstream).
package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

func main() {
	url := flag.String("url", "", "what to GET")
	n := flag.Int("n", 100, "requests")
	fresh := flag.Bool("new", false, "a new connection for each request")
	download := flag.Bool("download", false, "one GET, its body counted")
	caFile := flag.String("ca", "", "more CA certificates (PEM)")
	flag.Parse()
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if *caFile != "" {
		b, err := os.ReadFile(*caFile)
		if err != nil {
			fail(err)
		}
		pool.AppendCertsFromPEM(b)
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true, DisableKeepAlives: *fresh, DisableCompression: true}
	c := &http.Client{Transport: tr, Timeout: 5 * time.Minute}
	get := func() (int64, error) {
		res, err := c.Get(*url)
		if err != nil {
			return 0, err
		}
		defer res.Body.Close()
		k, err := io.Copy(io.Discard, res.Body)
		if err == nil && res.StatusCode != 200 {
			err = fmt.Errorf("%s", res.Status)
		}
		return k, err
	}
	if *download {
		t := time.Now()
		k, err := get()
		if err != nil {
			fail(err)
		}
		json.NewEncoder(os.Stdout).Encode(map[string]any{"bytes": k, "seconds": time.Since(t).Seconds()})
		return
	}
	if _, err := get(); err != nil { // warm: DNS, the first handshake
		fail(err)
	}
	lat := make([]int64, 0, *n)
	for range *n {
		t := time.Now()
		if _, err := get(); err != nil {
			fail(err)
		}
		lat = append(lat, time.Since(t).Nanoseconds())
	}
	json.NewEncoder(os.Stdout).Encode(map[string]any{"lat": lat})
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "egressclient:", err)
	os.Exit(1)
}
