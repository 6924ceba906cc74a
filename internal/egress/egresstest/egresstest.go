// Package egresstest is the pieces of a fake internet for the egress
// proxy's tests, the e2e tests and the bench: a CA of its own and server
// certificates from it, a DNS server, a SOCKS5 server that records what it
// was asked, a listener in another network namespace, and bodies of a given
// size. Only tests and bench import it.
package egresstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	goruntime "runtime"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/net/dns/dnsmessage"
)

// CA is a certificate authority of a test's own, valid for two days.
type CA struct {
	Cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// NewCA makes a CA named name (its common name).
func NewCA(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(48 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	return &CA{Cert: cert, key: key}, err
}

// PEM is the CA's certificate in PEM.
func (ca *CA) PEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})
}

// Pool is a pool of the CA alone.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// ServerCert is a server certificate signed by the CA for names and addrs.
func (ca *CA) ServerCert(names []string, addrs ...netip.Addr) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(48 * time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	for _, a := range addrs {
		tmpl.IPAddresses = append(tmpl.IPAddresses, a.AsSlice())
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	return n
}

// ServeDNS answers the A queries that reach pc with answer's address for
// the name (lower case, without its final dot); a name it does not know
// is NXDOMAIN. It returns when pc is closed.
func ServeDNS(pc net.PacketConn, answer func(name string) (netip.Addr, bool)) {
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
		addr, ok := answer(strings.TrimSuffix(strings.ToLower(q.Name.String()), "."))
		switch {
		case !ok:
			m.Header.RCode = dnsmessage.RCodeNameError
		case q.Type == dnsmessage.TypeA:
			m.Answers = []dnsmessage.Resource{{Header: dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: 5},
				Body: &dnsmessage.AResource{A: addr.As4()}}}
		}
		if b, err := m.Pack(); err == nil {
			pc.WriteTo(b, from)
		}
	}
}

// ListenIn opens a TCP listener in the named network namespace: the
// socket stays there whichever thread serves it.
func ListenIn(ns, addr string) (net.Listener, error) {
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
		// The thread is stuck in the other namespace: it must not serve
		// anything else.
		panic(fmt.Sprintf("back to the host's network namespace: %v", err))
	}
	return ln, lerr
}

// WriteBytes answers n bytes (the query parameter n of r), with their
// Content-Length: downloads of a given size.
func WriteBytes(w http.ResponseWriter, r *http.Request) {
	n, _ := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
	w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	buf := make([]byte, 64<<10)
	for n > 0 {
		k := min(n, int64(len(buf)))
		if _, err := w.Write(buf[:k]); err != nil {
			return
		}
		n -= k
	}
}
