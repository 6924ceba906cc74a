package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestPreviewTLS: with --tls-cert and --tls-key preview URLs are https and
// the token's cookie is Secure.
func TestPreviewTLS(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	writeSelfSigned(t, certFile, keyFile, "*.sandbox.localhost")
	s := startServer(t, "", "--tls-cert", certFile, "--tls-key", keyFile)
	id, ex := s.exposedApp(t)
	if !strings.HasPrefix(ex.URL, "https://") {
		t.Fatalf("preview url %q is not https", ex.URL)
	}
	c := &http.Client{
		Transport:     &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	req, _ := http.NewRequest("GET", "https://"+s.proxy+"/page?lizard_token="+ex.AccessToken, nil)
	req.Host = ex.Hostname
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusFound || !strings.Contains(resp.Header.Get("Set-Cookie"), "Secure") {
		t.Fatalf("over TLS: %d, cookie %q", resp.StatusCode, resp.Header.Get("Set-Cookie"))
	}
	req, _ = http.NewRequest("GET", "https://"+s.proxy+"/page", nil)
	req.Host = ex.Hostname
	req.Header.Set("X-Lizard-Access-Token", ex.AccessToken)
	if resp, err = c.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("page over TLS: %v %v", resp, err)
	}
	resp.Body.Close()
	s.do("DELETE", "/api/sandboxes/"+id, nil, nil)
	s.waitNoLeaks(t)
}

// writeSelfSigned writes a certificate for hosts (the first is its common
// name) and its key.
func writeSelfSigned(t *testing.T, certFile, keyFile string, hosts ...string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: hosts[0]}, DNSNames: hosts,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600)
}
