package sandbox

import (
	"context"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/lizard-build/lizard/internal/agent"
)

// agentConns is the connections to one sandbox's agent. A sandbox that
// dies (killed, out of memory, paused) never resets them — its network
// stack is gone — so calls in flight would hang until their own deadline;
// cutting them makes those calls fail at once.
type agentConns struct {
	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

func (a *agentConns) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{Timeout: 3 * time.Second, KeepAlive: 30 * time.Second}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: c, owner: a}
	a.mu.Lock()
	a.conns[tc] = struct{}{}
	a.mu.Unlock()
	return tc, nil
}

// cut closes every connection, idle or busy, and says how many there were.
func (a *agentConns) cut() int {
	a.mu.Lock()
	conns := a.conns
	a.conns = map[net.Conn]struct{}{}
	a.mu.Unlock()
	for c := range conns {
		c.Close()
	}
	return len(conns)
}

type trackedConn struct {
	net.Conn
	owner *agentConns
	once  sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.owner.mu.Lock()
		delete(c.owner.conns, c)
		c.owner.mu.Unlock()
	})
	return c.Conn.Close()
}

// newAgent returns a client for a sandbox's agent with connections of its
// own, which cut ends.
func newAgent(addr, token string) (*agent.Client, *agentConns) {
	conns := &agentConns{conns: map[net.Conn]struct{}{}}
	tr := &http.Transport{
		DialContext:         conns.dial,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	return agent.NewClient("http://"+addr, token, &http.Client{Transport: tr}), conns
}
