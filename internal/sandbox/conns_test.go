package sandbox

import (
	"context"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// hangingListener is a 127.0.0.1 port whose accept queue is full, so that
// a connect to it waits for an answer to its SYN, as one to a sandbox whose
// CPU is taken does.
func hangingListener(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
	// Fill the queue: connects that complete and are never accepted.
	for range 4 {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err != nil {
			break
		}
		t.Cleanup(func() { c.Close() })
	}
	return addr
}

// TestCutEndsDials: a connect the sandbox does not answer yet waits (longer
// than the 3 s that failed execs on a loaded host), but a kill or pause
// (cut) ends it at once.
func TestCutEndsDials(t *testing.T) {
	addr := hangingListener(t)
	conns := &agentConns{conns: map[net.Conn]struct{}{}, dials: map[*context.CancelFunc]struct{}{}}
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		c, err := conns.dial(context.Background(), "tcp", addr)
		if err == nil {
			c.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("the dial of a port that does not answer ended after %v: %v", time.Since(start), err)
	case <-time.After(time.Second):
	}
	conns.cut()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the dial succeeded after cut")
		}
	case <-time.After(2 * time.Second):
		t.Fatal("cut did not end the dial in flight")
	}
	if len(conns.dials) != 0 || len(conns.conns) != 0 {
		t.Fatalf("left %d dials and %d connections", len(conns.dials), len(conns.conns))
	}
}
