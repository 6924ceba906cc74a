package server

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestInstallTrust: the egress CA goes into the system bundle once (a
// second boot, a restored image, leaves it as it is) and into the local
// certificates update-ca-certificates keeps; the variables point Node at
// the CA and the other clients at the bundle. Without the CA nothing
// changes.
func TestInstallTrust(t *testing.T) {
	root := t.TempDir()
	const ca = "-----BEGIN CERTIFICATE-----\nMIIBlizard\n-----END CERTIFICATE-----"
	bundle := filepath.Join(root, "etc/ssl/certs/ca-certificates.crt")
	os.MkdirAll(filepath.Dir(bundle), 0o755)
	os.WriteFile(bundle, []byte("-----BEGIN CERTIFICATE-----\nMIIBother\n-----END CERTIFICATE-----"), 0o644)

	if env, err := installTrust(root, "/.lizard/egress-ca.pem"); err != nil || env != nil {
		t.Fatalf("without a CA: %v, %v", env, err)
	}
	os.MkdirAll(filepath.Join(root, ".lizard"), 0o755)
	os.WriteFile(filepath.Join(root, ".lizard/egress-ca.pem"), []byte(ca+"\n"), 0o444)
	for range 2 {
		env, err := installTrust(root, "/.lizard/egress-ca.pem")
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{"NODE_EXTRA_CA_CERTS": "/.lizard/egress-ca.pem", "SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt",
			"REQUESTS_CA_BUNDLE": "/etc/ssl/certs/ca-certificates.crt", "PIP_CERT": "/etc/ssl/certs/ca-certificates.crt", "CURL_CA_BUNDLE": "/etc/ssl/certs/ca-certificates.crt"}
		for k, v := range want {
			if env[k] != v {
				t.Fatalf("%s=%q, want %q (%v)", k, env[k], v, env)
			}
		}
	}
	b, _ := os.ReadFile(bundle)
	if strings.Count(string(b), "MIIBlizard") != 1 || !strings.Contains(string(b), "MIIBother\n-----END CERTIFICATE-----\n-----BEGIN") {
		t.Fatalf("bundle:\n%s", b)
	}
	if l, err := os.ReadFile(filepath.Join(root, localCA)); err != nil || !strings.Contains(string(l), "MIIBlizard") {
		t.Fatalf("local CA: %q, %v", l, err)
	}
}
