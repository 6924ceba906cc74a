package egresstest

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
)

// SOCKS5 is a SOCKS5 server (RFC 1928, CONNECT only, with RFC 1929
// username/password authentication when asked) that records every
// CONNECT it was asked.
type SOCKS5 struct {
	ln                 net.Listener
	username, password string
	// Dial connects to a CONNECT's target; nil is net.Dial.
	dial func(network, addr string) (net.Conn, error)

	mu       sync.Mutex
	requests []Request
}

// Request is a CONNECT the server was asked: its target as sent (a name
// when the client sent the domain address type) and whether it was one.
type Request struct {
	Target string
	ByName bool
}

// Option configures a SOCKS5 server.
type Option func(*SOCKS5)

// WithAuth requires username/password authentication.
func WithAuth(username, password string) Option {
	return func(s *SOCKS5) { s.username, s.password = username, password }
}

// WithDial makes the server connect to targets with dial (a test resolves
// names of its own there).
func WithDial(dial func(network, addr string) (net.Conn, error)) Option {
	return func(s *SOCKS5) { s.dial = dial }
}

// ServeSOCKS5 serves SOCKS5 on ln until Close.
func ServeSOCKS5(ln net.Listener, opts ...Option) *SOCKS5 {
	s := &SOCKS5{ln: ln, dial: net.Dial}
	for _, o := range opts {
		o(s)
	}
	go s.loop()
	return s
}

// Addr is the server's address.
func (s *SOCKS5) Addr() string { return s.ln.Addr().String() }

// Close stops the server.
func (s *SOCKS5) Close() error { return s.ln.Close() }

// Requests are the CONNECTs asked so far.
func (s *SOCKS5) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request{}, s.requests...)
}

func (s *SOCKS5) loop() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		go s.serve(c)
	}
}

func (s *SOCKS5) serve(c net.Conn) {
	defer c.Close()
	target, byName, err := s.handshake(c)
	if err != nil {
		return
	}
	s.mu.Lock()
	s.requests = append(s.requests, Request{Target: target, ByName: byName})
	s.mu.Unlock()
	up, err := s.dial("tcp", target)
	if err != nil {
		c.Write([]byte{5, 5, 0, 1, 0, 0, 0, 0, 0, 0}) // connection refused
		return
	}
	defer up.Close()
	if _, err := c.Write([]byte{5, 0, 0, 1, 0, 0, 0, 0, 0, 0}); err != nil {
		return
	}
	done := make(chan struct{})
	go func() {
		io.Copy(c, up)
		if tc, ok := c.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
		close(done)
	}()
	io.Copy(up, c)
	if tc, ok := up.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
	<-done
}

// handshake reads the greeting, authenticates, and reads the CONNECT.
func (s *SOCKS5) handshake(c net.Conn) (target string, byName bool, err error) {
	b := make([]byte, 262)
	if _, err := io.ReadFull(c, b[:2]); err != nil || b[0] != 5 {
		return "", false, errors.New("not SOCKS5")
	}
	methods := b[2 : 2+int(b[1])]
	if _, err := io.ReadFull(c, methods); err != nil {
		return "", false, err
	}
	want := byte(0)
	if s.username != "" {
		want = 2
	}
	found := false
	for _, m := range methods {
		found = found || m == want
	}
	if !found {
		c.Write([]byte{5, 0xff})
		return "", false, errors.New("no acceptable method")
	}
	c.Write([]byte{5, want})
	if want == 2 {
		if _, err := io.ReadFull(c, b[:2]); err != nil {
			return "", false, err
		}
		user := make([]byte, b[1])
		io.ReadFull(c, user)
		io.ReadFull(c, b[:1])
		pass := make([]byte, b[0])
		io.ReadFull(c, pass)
		if string(user) != s.username || string(pass) != s.password {
			c.Write([]byte{1, 1})
			return "", false, errors.New("bad credentials")
		}
		c.Write([]byte{1, 0})
	}
	if _, err := io.ReadFull(c, b[:4]); err != nil || b[0] != 5 || b[1] != 1 {
		c.Write([]byte{5, 7, 0, 1, 0, 0, 0, 0, 0, 0}) // command not supported
		return "", false, errors.New("not CONNECT")
	}
	var host string
	switch b[3] {
	case 1:
		ip := make([]byte, 4)
		io.ReadFull(c, ip)
		host = net.IP(ip).String()
	case 3:
		io.ReadFull(c, b[:1])
		name := make([]byte, b[0])
		io.ReadFull(c, name)
		host, byName = string(name), true
	case 4:
		ip := make([]byte, 16)
		io.ReadFull(c, ip)
		host = net.IP(ip).String()
	default:
		return "", false, errors.New("bad address type")
	}
	if _, err := io.ReadFull(c, b[:2]); err != nil {
		return "", false, err
	}
	return net.JoinHostPort(host, strconv.Itoa(int(binary.BigEndian.Uint16(b[:2])))), byName, nil
}
