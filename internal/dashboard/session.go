package dashboard

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"sync"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// Session lifetimes: a session ends TTL after sign-in, or after Idle
// without a request, whichever comes first.
const (
	DefaultTTL  = 12 * time.Hour
	DefaultIdle = 2 * time.Hour
	// maxSessions bounds memory: signing in beyond it ends the oldest.
	maxSessions = 10000
)

// session is one signed-in browser. The API key is kept in this process's
// memory only (the browser holds the random session id), so that every
// request is checked against the server's current key set: a revoked key
// ends its sessions at their next request.
type session struct {
	key      string
	csrf     string
	created  time.Time
	lastSeen time.Time
}

// Sessions are the dashboard's sessions, in memory: a restart of the
// server signs everyone out. It is safe for concurrent use.
type Sessions struct {
	ttl, idle time.Duration
	now       func() time.Time

	mu sync.Mutex
	m  map[string]*session
}

// NewSessions makes an empty session table. ttl is the absolute lifetime
// (DefaultTTL when 0); idle the longest time between requests (DefaultIdle
// when 0, never more than ttl).
func NewSessions(ttl, idle time.Duration) *Sessions {
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	if idle <= 0 {
		idle = DefaultIdle
	}
	return &Sessions{ttl: ttl, idle: min(idle, ttl), now: time.Now, m: map[string]*session{}}
}

// TTL is a session's absolute lifetime.
func (s *Sessions) TTL() time.Duration { return s.ttl }

// Create starts a session for an API key and returns its id (the cookie's
// value) and its CSRF token (sent by the page in a header on every
// state-changing request).
func (s *Sessions) Create(key string) (id, csrf string) {
	id, csrf = randomToken(), randomToken()
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sweepLocked(now)
	if len(s.m) >= maxSessions {
		var oldest string
		for sid, ss := range s.m {
			if oldest == "" || ss.created.Before(s.m[oldest].created) {
				oldest = sid
			}
		}
		delete(s.m, oldest)
	}
	s.m[id] = &session{key: key, csrf: csrf, created: now, lastSeen: now}
	return id, csrf
}

// Session returns the API key and CSRF token of a live session and notes
// its use. An unknown or expired session is errdefs.ErrUnauthenticated
// (and an expired one is forgotten).
func (s *Sessions) Session(id string) (key, csrf string, err error) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	ss, ok := s.m[id]
	if ok && s.expired(ss, now) {
		delete(s.m, id)
		ok = false
	}
	if !ok {
		return "", "", errdefs.WithCode("session_expired",
			fmt.Errorf("the dashboard session has expired or ended: sign in again: %w", errdefs.ErrUnauthenticated))
	}
	ss.lastSeen = now
	return ss.key, ss.csrf, nil
}

// End ends a session; ending an unknown one is a no-op.
func (s *Sessions) End(id string) {
	s.mu.Lock()
	delete(s.m, id)
	s.mu.Unlock()
}

// Expires is when a live session ends at the latest (its absolute
// lifetime); false for an unknown one.
func (s *Sessions) Expires(id string) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss, ok := s.m[id]
	if !ok {
		return time.Time{}, false
	}
	return ss.created.Add(s.ttl), true
}

func (s *Sessions) expired(ss *session, now time.Time) bool {
	return now.Sub(ss.created) >= s.ttl || now.Sub(ss.lastSeen) >= s.idle
}

func (s *Sessions) sweepLocked(now time.Time) {
	for id, ss := range s.m {
		if s.expired(ss, now) {
			delete(s.m, id)
		}
	}
}

// randomToken is 256 random bits, URL-safe.
func randomToken() string {
	b := make([]byte, 32)
	rand.Read(b) // never fails (crypto/rand panics instead)
	return base64.RawURLEncoding.EncodeToString(b)
}
