package server

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
)

// The egress proxy terminates the TLS of hosts with transform rules with
// certificates of its own CA; the runtime mounts that CA's certificate in
// the sandbox (agent.EgressCAFile). At boot the agent adds it to the
// system trust store and gives every command the variables the common
// clients read their trust from, so that they accept the proxy's
// certificates without anyone configuring them. The CA's key never enters
// a sandbox.

// systemBundles are the trust bundles of the usual distributions, the
// first that exists being the system's: Debian, Ubuntu and Alpine; Fedora
// and RHEL; openSUSE.
var systemBundles = []string{"/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/ca-bundle.pem"}

// localCA is where update-ca-certificates (Debian, Alpine) looks for
// certificates of the machine's own, so a rebuild of the bundle keeps it.
const localCA = "/usr/local/share/ca-certificates/lizard-egress-ca.crt"

// installTrust adds the CA in caFile to the system bundle (once: a bundle
// that holds it already is left alone) and returns the variables commands
// get: NODE_EXTRA_CA_CERTS (Node adds it to its own roots), and the
// system bundle for SSL_CERT_FILE (OpenSSL, Python's ssl, Go),
// REQUESTS_CA_BUNDLE (Python requests, which otherwise uses certifi's),
// PIP_CERT (pip) and CURL_CA_BUNDLE (curl). A sandbox without caFile
// gets nothing; one whose root has no bundle gets NODE_EXTRA_CA_CERTS
// only. root is "/" in a sandbox (tests pass a directory).
func installTrust(root, caFile string) (map[string]string, error) {
	ca, err := os.ReadFile(filepath.Join(root, caFile))
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("egress CA: %w", err)
	}
	ca = bytes.TrimSpace(ca)
	if len(ca) == 0 {
		return nil, nil
	}
	env := map[string]string{"NODE_EXTRA_CA_CERTS": caFile}
	if err := os.MkdirAll(filepath.Join(root, filepath.Dir(localCA)), 0o755); err == nil {
		os.WriteFile(filepath.Join(root, localCA), append(ca, '\n'), 0o644)
	}
	for _, b := range systemBundles {
		path := filepath.Join(root, b)
		have, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		if !bytes.Contains(have, ca) {
			// Appended whole, after a newline, as update-ca-certificates
			// concatenates.
			add := append([]byte("\n"), append(ca, '\n')...)
			if len(have) > 0 && have[len(have)-1] == '\n' {
				add = add[1:]
			}
			f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				return env, fmt.Errorf("egress CA into %s: %w", b, err)
			}
			_, err = f.Write(add)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return env, fmt.Errorf("egress CA into %s: %w", b, err)
			}
		}
		for _, v := range []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT", "CURL_CA_BUNDLE"} {
			env[v] = b
		}
		break
	}
	return env, nil
}
