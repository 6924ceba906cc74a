package server

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/lizard-build/lizard/internal/agent"
)

// forward serves GET /forward/{port}: the connection becomes a byte stream
// to 127.0.0.1:port (else [::1]:port) inside the sandbox. The node uses it
// to reach servers bound to the loopback address only, which the
// sandbox's address does not serve (agent.ForwardUpgrade).
func (s *Server) forward(w http.ResponseWriter, r *http.Request) error {
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || port < 1 || port > 65535 {
		return errInvalid("port must be 1-65535, not %q", r.PathValue("port"))
	}
	if port == agent.Port {
		return errInvalid("the agent's own port cannot be forwarded")
	}
	if r.Header.Get("Upgrade") != agent.ForwardUpgrade {
		return errInvalid("GET /forward needs Upgrade: %s", agent.ForwardUpgrade)
	}
	up, err := dialLoopback(r, port)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			return errNotFound("nothing listens on the loopback address at port %d", port)
		}
		return err
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		up.Close()
		return err
	}
	// The answer is written by hand: the connection is no longer HTTP's.
	_, err = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + agent.ForwardUpgrade + "\r\n\r\n")
	if err == nil {
		err = brw.Flush()
	}
	if err != nil {
		conn.Close()
		up.Close()
		return nil
	}
	// What the client sent after its request may already be buffered.
	var in io.Reader = conn
	if n := brw.Reader.Buffered(); n > 0 {
		b, _ := brw.Reader.Peek(n)
		in = io.MultiReader(bytes.NewReader(bytes.Clone(b)), conn)
	}
	splice(conn, in, up)
	return nil
}

// dialLoopback connects to port on 127.0.0.1, else on ::1.
func dialLoopback(r *http.Request, port int) (net.Conn, error) {
	d := net.Dialer{Timeout: 5 * time.Second}
	p := strconv.Itoa(port)
	c, err := d.DialContext(r.Context(), "tcp4", net.JoinHostPort("127.0.0.1", p))
	if err == nil || !errors.Is(err, syscall.ECONNREFUSED) {
		return c, err
	}
	if c6, err6 := d.DialContext(r.Context(), "tcp6", net.JoinHostPort("::1", p)); err6 == nil {
		return c6, nil
	}
	return nil, err
}

// splice copies both ways until both directions ended; an end in one
// direction is passed on as a half close, so request-then-EOF protocols
// work.
func splice(client net.Conn, fromClient io.Reader, up net.Conn) {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		io.Copy(up, fromClient)
		closeWrite(up)
	}()
	go func() {
		defer wg.Done()
		io.Copy(client, up)
		closeWrite(client)
	}()
	wg.Wait()
	client.Close()
	up.Close()
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	} else {
		c.Close()
	}
}
