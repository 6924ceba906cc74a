package egress

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// CA issues the certificates the proxy presents for the hosts it
// intercepts. Its certificate is in every sandbox's trust store
// (CertFile, mounted by the runtime at agent.EgressCAFile); its key stays
// in the server. Leaf certificates are made on first use for each name,
// valid for leafLifetime, share one key, and are kept until near their
// end.
type CA struct {
	cert     *x509.Certificate
	key      crypto.Signer
	certFile string
	leafKey  *ecdsa.PrivateKey

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

// Leaf certificates live a week and are made again a day before their end;
// at most maxLeaves are kept (then the cache starts over).
const (
	leafLifetime = 7 * 24 * time.Hour
	leafRenew    = 24 * time.Hour
	maxLeaves    = 4096
)

// Files of a CA that OpenCA generates in its directory.
const (
	CACertName = "ca.pem"
	CAKeyName  = "ca-key.pem"
)

// OpenCA loads the CA in dir (CACertName and CAKeyName), generating it the
// first time: an ECDSA P-256 key (the key file mode 0600) and a
// self-signed certificate of ten years, "lizard egress CA" and name (the
// node's). A server keeps its CA across restarts; sandboxes trust the one
// they booted with.
func OpenCA(dir, name string) (*CA, error) {
	certFile, keyFile := filepath.Join(dir, CACertName), filepath.Join(dir, CAKeyName)
	if _, err := os.Stat(certFile); errors.Is(err, os.ErrNotExist) {
		if err := generateCA(dir, certFile, keyFile, name); err != nil {
			return nil, fmt.Errorf("egress CA: %w", err)
		}
	}
	return LoadCA(certFile, keyFile)
}

func generateCA(dir, certFile, keyFile, name string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	cn := "lizard egress CA"
	if name != "" {
		cn += " " + name
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: cn, Organization: []string{"lizard"}},
		NotBefore: now.Add(-time.Hour), NotAfter: now.AddDate(10, 0, 0),
		IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return err
	}
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	// The key first: a certificate without its key is not a CA.
	if err := writeFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		return err
	}
	return writeFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}

func writeFile(path string, b []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// LoadCA loads an operator's CA (--egress-ca-cert, --egress-ca-key): a PEM
// certificate that may sign certificates, and its PEM private key (PKCS#8,
// PKCS#1 or SEC 1). The certificate file is what sandboxes get, so it
// must hold that certificate only.
func LoadCA(certFile, keyFile string) (*CA, error) {
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("egress CA %s, %s: %v: %w", certFile, keyFile, err, errdefs.ErrInvalid)
	}
	if len(pair.Certificate) != 1 {
		return nil, fmt.Errorf("egress CA %s: holds %d certificates; want the CA's alone (it is what sandboxes trust): %w", certFile, len(pair.Certificate), errdefs.ErrInvalid)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("egress CA %s: %v: %w", certFile, err, errdefs.ErrInvalid)
	}
	if !cert.IsCA || cert.KeyUsage != 0 && cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, fmt.Errorf("egress CA %s: not a CA certificate (basic constraints CA, key usage certSign): %w", certFile, errdefs.ErrInvalid)
	}
	if time.Now().After(cert.NotAfter) {
		return nil, fmt.Errorf("egress CA %s: expired on %s: %w", certFile, cert.NotAfter.Format(time.DateOnly), errdefs.ErrInvalid)
	}
	signer, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("egress CA %s: the key cannot sign: %w", keyFile, errdefs.ErrInvalid)
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(certFile)
	if err != nil {
		return nil, err
	}
	return &CA{cert: cert, key: signer, certFile: abs, leafKey: leafKey, leaves: map[string]*tls.Certificate{}}, nil
}

// CertFile is the CA's certificate (PEM), what sandboxes trust.
func (c *CA) CertFile() string { return c.certFile }

// Certificate is the CA's certificate.
func (c *CA) Certificate() *x509.Certificate { return c.cert }

// Leaf returns a certificate for name (a DNS name, or an address) signed
// by the CA.
func (c *CA) Leaf(name string) (*tls.Certificate, error) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if l, ok := c.leaves[name]; ok && now.Add(leafRenew).Before(l.Leaf.NotAfter) {
		return l, nil
	}
	end := now.Add(leafLifetime)
	if end.After(c.cert.NotAfter) {
		end = c.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: name},
		NotBefore: now.Add(-time.Hour), NotAfter: end,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if a, err := netip.ParseAddr(name); err == nil {
		tmpl.IPAddresses = append(tmpl.IPAddresses, a.AsSlice())
	} else {
		tmpl.DNSNames = []string{name}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, c.leafKey.Public(), c.key)
	if err != nil {
		return nil, fmt.Errorf("certificate for %s: %w", name, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	l := &tls.Certificate{Certificate: [][]byte{der, c.cert.Raw}, PrivateKey: c.leafKey, Leaf: leaf}
	if len(c.leaves) >= maxLeaves {
		c.leaves = map[string]*tls.Certificate{}
	}
	c.leaves[name] = l
	return l, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

// RootPool is the host's trust store plus the CA certificates in the PEM
// files (--egress-ca-file): what intercepted connections verify their
// upstream against.
func RootPool(files ...string) (*x509.CertPool, error) {
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("--egress-ca-file: %w", err)
		}
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("--egress-ca-file %s: no PEM certificate in it: %w", f, errdefs.ErrInvalid)
		}
	}
	return pool, nil
}
