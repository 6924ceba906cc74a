package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// handle decides one redirected connection and carries it to its end.
func (p *Proxy) handle(c net.Conn) {
	srcAP, err := netip.ParseAddrPort(c.RemoteAddr().String())
	if err != nil {
		return
	}
	srcAddr := srcAP.Addr().Unmap()
	dst, err := p.cfg.OriginalDst(c)
	if err != nil {
		p.log.Debug("egress: no original destination", "from", srcAddr, "err", err)
		p.cfg.Recorder.EgressConnection("error")
		return
	}
	src, ok := p.cfg.Sources.Source(srcAddr)
	if !ok {
		// No sandbox we know (one recovery has not reattached yet):
		// nothing goes out for it.
		p.log.Debug("egress: connection from an unknown address", "from", srcAddr, "to", dst)
		p.cfg.Recorder.EgressConnection(Denied)
		return
	}
	if dst == localAddrPort(c) {
		// Straight to the proxy's own port: not a redirected connection.
		p.cfg.Recorder.EgressConnection(Denied)
		return
	}
	entry := Entry{Time: time.Now().UTC(), Addr: dst.Addr().String(), Port: int(dst.Port()), Proxied: src.Egress.Proxy != nil}
	br := bufio.NewReaderSize(c, 4096)
	kind, hello := p.sniff(c, br, dst.Port())
	switch kind {
	case kindTLS:
		entry.Host = hello.name
		p.serveTLS(c, br, src, dst, hello, entry)
	case kindHTTP:
		p.cfg.Recorder.EgressConnection("http")
		h := &requestHandler{p: p, srcAddr: srcAddr, dst: dst, proxied: entry.Proxied}
		h.serve(&bufConn{Conn: c, r: br})
	default:
		entry.Via = "tcp"
		if !src.Egress.AllowsAddr(dst.Addr(), src.Learned) {
			p.deny(src, entry, "the address is not allowed")
			return
		}
		p.forward(c, br, nil, src, dst, "", entry)
	}
}

// Kinds of connection sniff tells apart.
const (
	kindTCP = iota
	kindTLS
	kindHTTP
)

// clientHello is what the proxy reads of a ClientHello: the name (SNI,
// canonical), the application protocols offered, and the bytes read.
type clientHello struct {
	name   string
	protos []string
	raw    []byte
}

// sniff reads the start of a connection to a named port (80, 443): a TLS
// ClientHello, or an HTTP request line. Other ports, and connections that
// send nothing in time or something else, are TCP, decided by address.
func (p *Proxy) sniff(c net.Conn, br *bufio.Reader, port uint16) (int, clientHello) {
	if !slices.Contains(p.cfg.NamedPorts, port) {
		return kindTCP, clientHello{}
	}
	c.SetReadDeadline(time.Now().Add(p.cfg.PeekTimeout))
	defer c.SetReadDeadline(time.Time{})
	first, err := br.Peek(1)
	if err != nil {
		return kindTCP, clientHello{}
	}
	if first[0] == 0x16 { // a TLS handshake record
		h, ok := readClientHello(br)
		if ok {
			return kindTLS, h
		}
		return kindTCP, h
	}
	if looksHTTP(br) {
		return kindHTTP, clientHello{}
	}
	return kindTCP, clientHello{}
}

// looksHTTP says whether the buffered start of a connection is an HTTP/1
// request line: a method of capital letters and a space.
func looksHTTP(br *bufio.Reader) bool {
	for n := 1; n <= 8; n++ {
		b, err := br.Peek(n)
		if err != nil {
			return false
		}
		c := b[n-1]
		switch {
		case c == ' ':
			return n > 1
		case c < 'A' || c > 'Z':
			return false
		}
	}
	return false
}

// serveTLS decides a TLS connection by its SNI: refused, spliced, or
// intercepted for the host's transform rules.
func (p *Proxy) serveTLS(c net.Conn, br *bufio.Reader, src Source, dst netip.AddrPort, hello clientHello, entry Entry) {
	if !src.Egress.Allows(dst.Addr(), hello.name) {
		entry.Via = "tls"
		reason := "the name is not allowed"
		if hello.name == "" {
			reason = "no name (SNI), and the address is not allowed"
		}
		p.deny(src, entry, reason)
		writeAlert(c, alertAccessDenied)
		return
	}
	if _, _, ok := src.Egress.RulesFor(hello.name); ok && p.cfg.CA != nil {
		p.cfg.Recorder.EgressConnection("intercepted")
		p.intercept(&bufConn{Conn: c, r: io.MultiReader(bytes.NewReader(hello.raw), br)}, src, dst, hello)
		return
	}
	entry.Via = "spliced"
	p.forward(c, br, hello.raw, src, dst, hello.name, entry)
}

// forward dials the upstream and copies both ways: what was read already
// (prefix, then what br holds), then the rest straight from c.
func (p *Proxy) forward(c net.Conn, br *bufio.Reader, prefix []byte, src Source, dst netip.AddrPort, name string, entry Entry) {
	ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
	up, err := p.dial(ctx, src, dst, name)
	cancel()
	if err != nil {
		entry.Decision, entry.Reason = Allowed, "upstream: "+dialError(err)
		p.record(src.SandboxID, entry)
		p.cfg.Recorder.EgressConnection("error")
		if entry.Via == "spliced" {
			writeAlert(c, alertInternalError)
		}
		return
	}
	defer up.Close()
	p.cfg.Recorder.EgressConnection(entry.Via)
	head := append(prefix, mustBuffered(br)...)
	out, in := splice(c, up, head)
	entry.Decision, entry.BytesOut, entry.BytesIn = Allowed, out, in
	p.cfg.Recorder.EgressBytes("out", out)
	p.cfg.Recorder.EgressBytes("in", in)
	p.record(src.SandboxID, entry)
}

// mustBuffered takes what br has read ahead.
func mustBuffered(br *bufio.Reader) []byte {
	b, _ := br.Peek(br.Buffered())
	return append([]byte(nil), b...)
}

// deny records a refused connection.
func (p *Proxy) deny(src Source, entry Entry, reason string) {
	entry.Decision, entry.Reason = Denied, reason
	p.record(src.SandboxID, entry)
	p.cfg.Recorder.EgressConnection(Denied)
}

// splice copies between the sandbox's connection and the upstream's until
// both directions end, head first to the upstream; each direction's end
// is passed on as a half-close. It returns the bytes each way.
func splice(client, up net.Conn, head []byte) (out, in int64) {
	done := make(chan int64, 1)
	go func() {
		n, _ := io.Copy(client, up)
		closeWrite(client)
		done <- n
	}()
	if len(head) > 0 {
		n, err := up.Write(head)
		out += int64(n)
		if err != nil {
			client.Close()
			up.Close()
			return out, <-done
		}
	}
	n, _ := io.Copy(up, client)
	out += n
	closeWrite(up)
	in = <-done
	return out, in
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
		return
	}
	c.Close()
}

// TLS alerts the proxy sends instead of a ServerHello.
const (
	alertAccessDenied  = 49
	alertInternalError = 80
)

// writeAlert sends a fatal TLS alert: the client reports the refusal
// instead of a reset.
func writeAlert(c net.Conn, desc byte) {
	c.SetWriteDeadline(time.Now().Add(time.Second))
	c.Write([]byte{0x15, 0x03, 0x03, 0x00, 0x02, 0x02, desc})
}

// bufConn is a connection whose reads come from r (what was read ahead,
// then the connection).
type bufConn struct {
	net.Conn
	r io.Reader
}

func (b *bufConn) Read(p []byte) (int, error) { return b.r.Read(p) }

// originalDst is where a redirected connection was going
// (SO_ORIGINAL_DST, from conntrack).
func originalDst(c net.Conn) (netip.AddrPort, error) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return netip.AddrPort{}, errors.New("not a TCP connection")
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var out netip.AddrPort
	var serr error
	err = raw.Control(func(fd uintptr) {
		// sockaddr_in fits the 16 bytes of an ipv6_mreq: family, port,
		// address.
		m, err := unix.GetsockoptIPv6Mreq(int(fd), unix.IPPROTO_IP, unix.SO_ORIGINAL_DST)
		if err != nil {
			serr = err
			return
		}
		b := m.Multiaddr
		out = netip.AddrPortFrom(netip.AddrFrom4([4]byte{b[4], b[5], b[6], b[7]}), binary.BigEndian.Uint16(b[2:4]))
	})
	if err == nil {
		err = serr
	}
	return out, err
}

// localAddrPort is the proxy's own address of c.
func localAddrPort(c net.Conn) netip.AddrPort {
	ap, err := netip.ParseAddrPort(c.LocalAddr().String())
	if err != nil {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// readClientHello reads a ClientHello through crypto/tls, which stops at
// the callback: no byte is written to the client. ok is false when what
// came is not a ClientHello crypto/tls takes; raw holds what was read
// either way.
func readClientHello(r io.Reader) (h clientHello, ok bool) {
	rc := &recordingConn{r: r}
	tls.Server(rc, &tls.Config{GetConfigForClient: func(info *tls.ClientHelloInfo) (*tls.Config, error) {
		h.name = strings.TrimSuffix(strings.ToLower(info.ServerName), ".")
		h.protos = append([]string(nil), info.SupportedProtos...)
		ok = true
		return nil, errHelloRead
	}}).Handshake()
	h.raw = rc.buf.Bytes()
	return h, ok
}

var errHelloRead = errors.New("ClientHello read")

// recordingConn is the read side of a connection for readClientHello:
// what crypto/tls reads is kept, and it may write nothing.
type recordingConn struct {
	r   io.Reader
	buf bytes.Buffer
}

func (c *recordingConn) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.buf.Write(p[:n])
	return n, err
}
func (c *recordingConn) Write(p []byte) (int, error)        { return 0, errors.New("read only") }
func (c *recordingConn) Close() error                       { return nil }
func (c *recordingConn) LocalAddr() net.Addr                { return &net.TCPAddr{} }
func (c *recordingConn) RemoteAddr() net.Addr               { return &net.TCPAddr{} }
func (c *recordingConn) SetDeadline(t time.Time) error      { return nil }
func (c *recordingConn) SetReadDeadline(t time.Time) error  { return nil }
func (c *recordingConn) SetWriteDeadline(t time.Time) error { return nil }

// dialError is a dial failure as the log shows it.
func dialError(err error) string {
	var fe *forbiddenError
	if errors.As(err, &fe) {
		return fe.Error()
	}
	return fmt.Sprint(err)
}
