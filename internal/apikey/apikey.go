// Package apikey is the server's in-memory view of the valid API keys: a
// request's key is checked against it without a database query. The view
// follows the store's key generation, polled every Poll, so a key revoked
// by the CLI (a different process on the same database) takes effect
// within that time; a key the view does not hold is looked for once more
// in the database before it is refused (at most MissChecks times a second,
// so a flood of bad keys does not reach the database), so a key the CLI
// just created works at once.
// When keys were last used is gathered in memory and written in one batch
// every Flush. Only internal/api uses it; cmd/lizard wires it.
package apikey

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/ratelimit"
	"github.com/lizard-build/lizard/internal/store"
)

// Store is what the view needs of the database.
type Store interface {
	KeyGeneration(ctx context.Context) (int64, error)
	ActiveKeys(ctx context.Context) ([]store.ActiveKey, error)
	TouchKeys(ctx context.Context, used map[string]time.Time) error
}

// Defaults for Config.
const (
	DefaultPoll  = 250 * time.Millisecond
	DefaultFlush = 2 * time.Second
	// DefaultMissChecks: a few database checks a second for keys the view
	// does not hold; the poll finds the rest within DefaultPoll.
	DefaultMissChecks = 4
)

// Config wires a Set.
type Config struct {
	Store Store
	Poll  time.Duration // how often the key generation is read (DefaultPoll)
	Flush time.Duration // how often last-used times are written (DefaultFlush)
	// MissChecks is how many times a second (on average, and at once) a
	// key the view does not hold makes it look at the database before
	// the key is refused (DefaultMissChecks).
	MissChecks int
	Now        func() time.Time // the clock of MissChecks (time.Now)
	Logger     *slog.Logger
}

// Key is a valid API key: its id (not secret) and its project.
type Key struct {
	ID      string
	Project store.Project
}

// Set is the in-memory view of the valid keys. It is safe for concurrent
// use.
type Set struct {
	cfg Config

	mu   sync.RWMutex
	gen  int64
	keys map[string]Key // by hash

	missChecks *ratelimit.Limiter

	usedMu sync.Mutex
	used   map[string]time.Time // by key id, since the last flush

	stop chan struct{}
	done chan struct{}
}

// Open loads the valid keys and starts following the store. Close stops it
// and writes the last-used times gathered.
func Open(ctx context.Context, cfg Config) (*Set, error) {
	if cfg.Poll <= 0 {
		cfg.Poll = DefaultPoll
	}
	if cfg.Flush <= 0 {
		cfg.Flush = DefaultFlush
	}
	if cfg.MissChecks <= 0 {
		cfg.MissChecks = DefaultMissChecks
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Set{cfg: cfg, gen: -1, used: map[string]time.Time{}, stop: make(chan struct{}), done: make(chan struct{}),
		missChecks: ratelimit.New(float64(cfg.MissChecks), cfg.MissChecks, 1, cfg.Now)}
	if err := s.refresh(ctx); err != nil {
		return nil, err
	}
	go s.run()
	return s, nil
}

// Lookup returns the key whose secret this is and notes its use. An
// unknown or revoked key is errdefs.ErrUnauthenticated. A key not in the
// view is looked for in the database first, while MissChecks allows.
func (s *Set) Lookup(secret string) (Key, error) {
	hash := store.HashKey(secret)
	k, ok := s.get(hash)
	if !ok && s.checkMiss() {
		k, ok = s.get(hash)
	}
	if !ok {
		return Key{}, fmt.Errorf("API key: %w", errdefs.ErrUnauthenticated)
	}
	s.usedMu.Lock()
	s.used[k.ID] = time.Now()
	s.usedMu.Unlock()
	return k, nil
}

func (s *Set) get(hash string) (Key, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	k, ok := s.keys[hash]
	return k, ok
}

// checkMiss brings the view up to date for a key it does not hold, unless
// MissChecks were spent; it reports whether it did.
func (s *Set) checkMiss() bool {
	if _, ok := s.missChecks.Allow(""); !ok {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.refresh(ctx); err != nil {
		s.cfg.Logger.Warn("look for an unknown API key", "err", err)
		return false
	}
	return true
}

// Reload reads the store's keys now if they changed, instead of at the next
// poll: the API calls it after it created or revoked a key, so that the
// change holds from its very next request.
func (s *Set) Reload(ctx context.Context) error {
	return s.refresh(ctx)
}

// refresh reloads the keys when the store's generation moved.
func (s *Set) refresh(ctx context.Context) error {
	gen, err := s.cfg.Store.KeyGeneration(ctx)
	if err != nil {
		return fmt.Errorf("read the API key generation: %w", err)
	}
	s.mu.RLock()
	same := gen == s.gen
	s.mu.RUnlock()
	if same {
		return nil
	}
	// The generation is read before the keys: a change between the two
	// reads is loaded again at the next poll.
	active, err := s.cfg.Store.ActiveKeys(ctx)
	if err != nil {
		return fmt.Errorf("load the API keys: %w", err)
	}
	keys := make(map[string]Key, len(active))
	for _, k := range active {
		keys[k.Hash] = Key{ID: k.ID, Project: k.Project}
	}
	s.mu.Lock()
	// Reload and the poll may race: the newer generation wins.
	if gen > s.gen {
		s.gen, s.keys = gen, keys
	}
	s.mu.Unlock()
	return nil
}

// flush writes the last-used times gathered since the last flush. Times
// that fail to be written are kept for the next one unless newer ones came.
func (s *Set) flush(ctx context.Context) {
	s.usedMu.Lock()
	used := s.used
	s.used = map[string]time.Time{}
	s.usedMu.Unlock()
	if err := s.cfg.Store.TouchKeys(ctx, used); err != nil {
		s.cfg.Logger.Warn("record when API keys were last used", "err", err)
		s.usedMu.Lock()
		for id, t := range used {
			if s.used[id].Before(t) {
				s.used[id] = t
			}
		}
		s.usedMu.Unlock()
	}
}

func (s *Set) run() {
	defer close(s.done)
	poll := time.NewTicker(s.cfg.Poll)
	defer poll.Stop()
	flush := time.NewTicker(s.cfg.Flush)
	defer flush.Stop()
	for {
		select {
		case <-s.stop:
			s.flush(context.Background())
			return
		case <-poll.C:
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := s.refresh(ctx); err != nil {
				// The keys of the last load stay in force.
				s.cfg.Logger.Warn("refresh API keys", "err", err)
			}
			cancel()
		case <-flush.C:
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			s.flush(ctx)
			cancel()
		}
	}
}

// Close stops following the store and writes the last-used times
// gathered. It is called once.
func (s *Set) Close() error {
	close(s.stop)
	<-s.done
	return nil
}
