// Package tcpdial makes the TCP dialer lizard uses for connections that must
// notice a dead peer in seconds, not the kernel's quarter of an hour: calls
// between cluster nodes and to the cluster's database. A peer whose packets
// vanish (a partition, a host gone) fails the connection once data or
// keepalive probes stay unanswered for UserTimeout, even on a pooled
// connection that was healthy when the request started.
package tcpdial

import (
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Defaults of New.
const (
	// DialTimeout bounds connecting: room for two SYN retransmissions
	// (after 1 s and 3 s), for a first SYN lost or answered with a
	// challenge ACK (the peer still holds the 4-tuple of a previous
	// process on the same address), yet a partitioned peer is given up
	// in seconds.
	DialTimeout = 5 * time.Second
	// UserTimeout is how long sent data or keepalive probes may stay
	// unacknowledged before the kernel gives the connection up
	// (TCP_USER_TIMEOUT).
	UserTimeout = 10 * time.Second
	// KeepAliveIdle is the idle time before the first probe, and between
	// probes; an idle stream (an exec waiting for output, a watch) is
	// probed, so a partition ends it too.
	KeepAliveIdle = 3 * time.Second
)

// New returns a dialer with the package's timeouts.
func New() *net.Dialer {
	return &net.Dialer{
		Timeout: DialTimeout,
		KeepAliveConfig: net.KeepAliveConfig{
			Enable: true, Idle: KeepAliveIdle, Interval: KeepAliveIdle, Count: 3,
		},
		Control: func(network, address string, c syscall.RawConn) error {
			if network != "tcp" && network != "tcp4" && network != "tcp6" {
				return nil // a unix socket (a local database) has no peer to lose
			}
			var serr error
			err := c.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(UserTimeout/time.Millisecond))
			})
			if err != nil {
				return err
			}
			return serr
		},
	}
}
