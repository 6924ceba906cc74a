// Package ratelimit is a token bucket per key (an API key's id): Rate
// requests a second on average, Burst at once. The number of buckets kept
// is bounded. internal/api uses it for requests (cmd/lizard configures it),
// internal/apikey for its database checks of unknown keys.
package ratelimit

import (
	"fmt"
	"math"
	"sync"
	"time"
)

// DefaultMaxKeys bounds the buckets kept in memory.
const DefaultMaxKeys = 10000

// Limiter holds one token bucket per key. It is safe for concurrent use.
type Limiter struct {
	rate    float64 // tokens per second
	burst   float64
	maxKeys int
	now     func() time.Time

	mu      sync.Mutex
	buckets map[string]*bucket
}

type bucket struct {
	tokens float64
	at     time.Time // when tokens was computed
}

// New returns a limiter of rate requests a second with bursts of burst
// (at least 1). maxKeys bounds the buckets kept (DefaultMaxKeys when 0);
// now is the clock (time.Now when nil).
func New(rate float64, burst, maxKeys int, now func() time.Time) *Limiter {
	if maxKeys <= 0 {
		maxKeys = DefaultMaxKeys
	}
	if now == nil {
		now = time.Now
	}
	return &Limiter{rate: rate, burst: float64(max(burst, 1)), maxKeys: maxKeys, now: now, buckets: map[string]*bucket{}}
}

// String names the limit, for error messages.
func (l *Limiter) String() string {
	return fmt.Sprintf("%g requests/s per API key with bursts of %g", l.rate, l.burst)
}

// Allow takes a token from key's bucket. When there is none it returns
// false and how long until there is one.
func (l *Limiter) Allow(key string) (retryAfter time.Duration, ok bool) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.buckets[key]
	if b == nil {
		if len(l.buckets) >= l.maxKeys {
			l.evict(now)
		}
		b = &bucket{tokens: l.burst, at: now}
		l.buckets[key] = b
	}
	b.refill(now, l.rate, l.burst)
	if b.tokens >= 1 {
		b.tokens--
		return 0, true
	}
	wait := (1 - b.tokens) / l.rate
	return time.Duration(math.Ceil(wait * float64(time.Second))), false
}

func (b *bucket) refill(now time.Time, rate, burst float64) {
	if d := now.Sub(b.at); d > 0 {
		b.tokens = min(burst, b.tokens+d.Seconds()*rate)
		b.at = now
	}
}

// evict makes room: buckets that have refilled are the same as no bucket
// and go first; when none has, an arbitrary one goes (its key gets a full
// bucket again, which only a flood of distinct valid keys can cause).
func (l *Limiter) evict(now time.Time) {
	for k, b := range l.buckets {
		if b.refill(now, l.rate, l.burst); b.tokens >= l.burst {
			delete(l.buckets, k)
		}
	}
	for k := range l.buckets {
		if len(l.buckets) < l.maxKeys {
			return
		}
		delete(l.buckets, k)
	}
}
