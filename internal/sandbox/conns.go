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
	// dials are the dials in flight, which cut cancels too.
	dials map[*context.CancelFunc]struct{}
}

// dialTimeout bounds a connect to a sandbox. A sandbox whose CPU is taken
// (its own busy processes, a loaded host) answers a SYN late, and its
// kernel's retransmissions come 1, 3 and 7 s after the first: a connect
// given 3 s failed execs with 503 on a host running two CPU burners beside
// 16 busy sandboxes (make test, TestRestartBusy). A sandbox that is gone
// does not hold a dial that long: a kill or pause cuts its dials (cut),
// and the caller's context bounds the rest.
const dialTimeout = 15 * time.Second

func (a *agentConns) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	a.mu.Lock()
	a.dials[&cancel] = struct{}{}
	a.mu.Unlock()
	c, err := (&net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}).DialContext(ctx, network, addr)
	a.mu.Lock()
	delete(a.dials, &cancel)
	a.mu.Unlock()
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: c, owner: a}
	a.mu.Lock()
	a.conns[tc] = struct{}{}
	a.mu.Unlock()
	return tc, nil
}

// cut closes every connection, idle or busy, and ends the dials in
// flight; it says how many connections there were.
func (a *agentConns) cut() int {
	a.mu.Lock()
	conns := a.conns
	a.conns = map[net.Conn]struct{}{}
	for cancel := range a.dials {
		(*cancel)()
	}
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
	conns := &agentConns{conns: map[net.Conn]struct{}{}, dials: map[*context.CancelFunc]struct{}{}}
	tr := &http.Transport{
		DialContext:         conns.dial,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	return agent.NewClient("http://"+addr, token, &http.Client{Transport: tr}), conns
}
