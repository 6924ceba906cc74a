package server_test

import (
	"bufio"
	"io"
	"net"
	"strings"
	"testing"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/errdefs"
)

// TestForwardLoopback: GET /forward/{port} becomes a byte stream to a
// server on 127.0.0.1, both ways, half closes included; nothing listening
// is not found; the agent's port and bad ports are refused.
func TestForwardLoopback(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// An upper-casing echo that answers once its client has finished
	// writing (a half close must get through).
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				b, _ := io.ReadAll(c)
				c.Write([]byte(strings.ToUpper(string(b))))
			}()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	c := newClient(t)
	var d net.Dialer
	conn, err := c.DialLoopback(testContext(t), d.DialContext, port)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("hello through the agent")); err != nil {
		t.Fatal(err)
	}
	conn.(interface{ CloseWrite() error }).CloseWrite()
	got, err := io.ReadAll(bufio.NewReader(conn))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != "HELLO THROUGH THE AGENT" {
		t.Fatalf("forwarded answer = %q", got)
	}

	// A port nothing listens on: find one by closing a listener.
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	freePort := free.Addr().(*net.TCPAddr).Port
	free.Close()
	_, err = c.DialLoopback(testContext(t), d.DialContext, freePort)
	wantClass(t, err, errdefs.ErrNotFound)
	for _, p := range []int{agent.Port, 0, 70000} {
		_, err = c.DialLoopback(testContext(t), d.DialContext, p)
		wantClass(t, err, errdefs.ErrInvalid)
	}
}
