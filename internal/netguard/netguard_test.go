package netguard

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"
)

func TestRefused(t *testing.T) {
	for a, want := range map[string]bool{
		"127.0.0.1": true, "::1": true, "169.254.169.254": true, "10.1.2.3": true, "172.16.0.1": true,
		"192.168.1.1": true, "100.64.0.1": true, "0.0.0.0": true, "fd00::1": true, "fe80::1": true,
		"::ffff:127.0.0.1": true, "224.0.0.1": true,
		"8.8.8.8": false, "151.101.0.1": false, "2606:4700::1": false,
	} {
		if got := Refused(netip.MustParseAddr(a)); got != want {
			t.Errorf("Refused(%s) = %v, want %v", a, got, want)
		}
	}
}

func TestCheck(t *testing.T) {
	p, err := New("--x-allow", []string{"127.0.0.1:5000", "registry.internal"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for dest, refused := range map[string]bool{
		"127.0.0.1:5000":         false, // allowed
		"127.0.0.1:5001":         true,  // another port
		"localhost:5000":         true,  // loopback without a resolver (RFC 6761)
		"LocalHost.:9":           true,
		"registry.localhost":     true,
		"169.254.169.254":        true,
		"[::1]:5000":             true,
		"registry.internal":      false, // allowed at any port
		"registry.internal:8443": false,
		"8.8.8.8":                false,
	} {
		err := p.Check(ctx, dest)
		if got := errors.Is(err, ErrRefused); got != refused {
			t.Errorf("Check(%s) = %v, want refused %v", dest, err, refused)
		}
	}
	var none *Policy
	if err := none.Check(ctx, "127.0.0.1:5000"); !errors.Is(err, ErrRefused) {
		t.Errorf("no policy: %v", err)
	}
	for _, bad := range []string{"", "a/b", "host:port", "user@host"} {
		_, err := New("--x-allow", []string{bad})
		if err == nil {
			t.Errorf("--x-allow %q accepted", bad)
		} else if want := "--x-allow"; err.Error()[:len(want)] != want {
			t.Errorf("--x-allow %q: %v, want the flag named", bad, err)
		}
	}
}

// TestDialContext: the dialer refuses a loopback address it connects to,
// whatever the name said, unless the host is allowed.
func TestDialContext(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	addr := srv.Listener.Addr().String()
	_, port, _ := net.SplitHostPort(addr)
	d := &net.Dialer{Timeout: 5 * time.Second}
	ctx := context.Background()

	none, _ := New("--x-allow", nil)
	for _, target := range []string{addr, net.JoinHostPort("localhost", port)} {
		if c, err := none.DialContext(d)(ctx, "tcp", target); !errors.Is(err, ErrRefused) {
			if c != nil {
				c.Close()
			}
			t.Errorf("dial %s without an allowance: %v, want refused", target, err)
		}
	}
	allowed, _ := New("--x-allow", []string{"127.0.0.1:" + port})
	c, err := allowed.DialContext(d)(ctx, "tcp", addr)
	if err != nil {
		t.Fatalf("dial %s allowed: %v", addr, err)
	}
	c.Close()
	other, _ := New("--x-allow", []string{"127.0.0.1:1"})
	if c, err := other.DialContext(d)(ctx, "tcp", addr); !errors.Is(err, ErrRefused) {
		if c != nil {
			c.Close()
		}
		t.Errorf("dial %s with another port allowed: %v, want refused", addr, err)
	}
}
