package tcpdial

import (
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestUserTimeoutSet dials a local listener and reads the options back from
// the connected socket.
func TestUserTimeoutSet(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			defer c.Close()
			time.Sleep(time.Second)
		}
	}()
	c, err := New().Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var ut, ka, idle int
	raw.Control(func(fd uintptr) {
		ut, _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT)
		ka, _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_KEEPALIVE)
		idle, _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_KEEPIDLE)
	})
	if ut != int(UserTimeout/time.Millisecond) || ka != 1 || idle != int(KeepAliveIdle/time.Second) {
		t.Fatalf("TCP_USER_TIMEOUT %d ms, SO_KEEPALIVE %d, TCP_KEEPIDLE %d s; want %d, 1, %d", ut, ka, idle,
			UserTimeout/time.Millisecond, KeepAliveIdle/time.Second)
	}
}
