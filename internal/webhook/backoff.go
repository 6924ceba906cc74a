package webhook

import (
	"math/rand/v2"
	"time"
)

// Retries: after a failed attempt n (1 for the first), the next waits
// base·2^(n-1), at most MaxRetryWait, with equal jitter (a random point
// in the upper half of that wait, so that the deliveries of many events
// to a receiver that came back do not arrive in a burst). Deliveries are
// retried for RetryFor after their event: a failure after that ends them
// (failed). With the default base of 30 s that is some 40 attempts.
const (
	DefaultRetryBase = 30 * time.Second
	MaxRetryWait     = time.Hour
	RetryFor         = 24 * time.Hour
)

// Backoff is the wait after failed attempt n with base, jittered by rnd.
func Backoff(n int, base time.Duration, rnd *rand.Rand) time.Duration {
	d := base
	for i := 1; i < n && d < MaxRetryWait; i++ {
		d *= 2
	}
	d = min(d, MaxRetryWait)
	return d/2 + time.Duration(rnd.Int64N(int64(d/2)+1))
}
