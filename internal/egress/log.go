package egress

import (
	"sync"
	"time"
)

// Entry is one decision of the proxy: a connection (spliced, tunnelled or
// refused) or a request of a parsed one (plain HTTP, intercepted TLS). It
// never holds a header value, a path or a body.
type Entry struct {
	Time time.Time `json:"time"`
	// Host is the name the decision was by (SNI, Host); "" when none was
	// read.
	Host string `json:"host,omitempty"`
	// Addr is the address the sandbox connected to, Port its port.
	Addr string `json:"addr"`
	Port int    `json:"port"`
	// Decision is allowed or denied.
	Decision string `json:"decision"`
	// Via is how it went: spliced (TLS, not decrypted), intercepted (TLS
	// terminated for transform rules), http, tcp (by address only); with
	// Proxied when through the sandbox's SOCKS5 proxy.
	Via     string `json:"via"`
	Proxied bool   `json:"proxied,omitempty"`
	// Rule is the rules key whose transform the request got.
	Rule string `json:"rule,omitempty"`
	// Reason says why a connection or request was refused or failed.
	Reason string `json:"reason,omitempty"`
	// BytesOut went from the sandbox upstream, BytesIn back (a request's
	// bodies; a connection's stream).
	BytesOut int64 `json:"bytesOut"`
	BytesIn  int64 `json:"bytesIn"`
}

// Decisions.
const (
	Allowed = "allowed"
	Denied  = "denied"
)

// Log holds the sandboxes' egress logs, each a ring of its last entries,
// in memory: they go with the server (and a sandbox's with the sandbox,
// once the proxy notices it is gone). It is safe for concurrent use.
type Log struct {
	max int

	mu     sync.Mutex
	rings  map[string]*ring
	writes int
}

type ring struct {
	entries []Entry
	next    int // where the next entry goes once full
}

// NewLog keeps the last entries of each sandbox (0: DefaultLogEntries).
func NewLog(entries int) *Log {
	if entries <= 0 {
		entries = DefaultLogEntries
	}
	return &Log{max: entries, rings: map[string]*ring{}}
}

// sweepEvery is how many entries go between two sweeps of the logs of
// sandboxes that are gone.
const sweepEvery = 4096

// add records e for sandbox id; every sweepEvery entries the logs of
// sandboxes exists says are gone are dropped.
func (l *Log) add(id string, e Entry, exists func(string) bool) {
	l.mu.Lock()
	r := l.rings[id]
	if r == nil {
		r = &ring{}
		l.rings[id] = r
	}
	if len(r.entries) < l.max {
		r.entries = append(r.entries, e)
	} else {
		r.entries[r.next] = e
		r.next = (r.next + 1) % l.max
	}
	l.writes++
	sweep := l.writes%sweepEvery == 0
	var ids []string
	if sweep {
		for sid := range l.rings {
			ids = append(ids, sid)
		}
	}
	l.mu.Unlock()
	if !sweep || exists == nil {
		return
	}
	for _, sid := range ids {
		if sid != id && !exists(sid) {
			l.mu.Lock()
			delete(l.rings, sid)
			l.mu.Unlock()
		}
	}
}

// Entries returns sandbox id's log, oldest first.
func (l *Log) Entries(id string) []Entry {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.rings[id]
	if r == nil {
		return []Entry{}
	}
	out := make([]Entry, 0, len(r.entries))
	out = append(out, r.entries[r.next:]...)
	return append(out, r.entries[:r.next]...)
}
