package webhook

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/lizard-build/lizard/internal/netguard"
	"github.com/lizard-build/lizard/internal/store"
)

// Store is what webhooks keep their records in (store.Events has it).
type Store interface {
	CreateWebhook(ctx context.Context, w store.Webhook, max int) (store.Webhook, error)
	Webhooks(ctx context.Context, projectID string) ([]store.Webhook, error)
	DeleteWebhook(ctx context.Context, projectID, id string) error
	ClaimDeliveries(ctx context.Context, f store.Fence, lease time.Duration, limit int) ([]store.Delivery, error)
	RecordAttempt(ctx context.Context, f store.Fence, id, claim string, r store.AttemptResult) error
	ReleaseClaims(ctx context.Context, f store.Fence) error
	Deliveries(ctx context.Context, projectID, webhookID string, limit int) ([]store.Delivery, error)
	PruneDeliveries(ctx context.Context, before time.Time) (int64, error)
}

// Defaults of Config.
const (
	DefaultTimeout      = 10 * time.Second
	DefaultWorkers      = 8
	DefaultPollInterval = time.Second
	// KeepDeliveries is how long a delivery's record stays after it
	// ended (delivered or failed).
	KeepDeliveries = 7 * 24 * time.Hour
)

const (
	// claimMargin is how much longer than an attempt's timeout a claim
	// lasts: another node takes a delivery only once its claimer is
	// surely done with it, or gone.
	claimMargin = 50 * time.Second
	// recordTimeout bounds the write of an attempt's outcome, which is
	// made even when the server is stopping.
	recordTimeout = 10 * time.Second
	pruneEvery    = time.Hour
	// maxAnswer is what is read of a receiver's answer (and dropped).
	maxAnswer = 64 << 10
	// maxError caps an attempt's error text.
	maxError = 300
)

// Config wires a Service.
type Config struct {
	Store Store
	// Guard is what webhook URLs may reach beyond public addresses
	// (--webhook-allow); nil: public addresses only.
	Guard *netguard.Policy
	// Fence is this node's current fence in cluster mode (claims and
	// attempts are fenced by it); on a single server, a fence of no
	// node whose incarnation is this process's.
	Fence func() store.Fence
	// RetryBase is the wait after a first failed attempt (0:
	// DefaultRetryBase; tests make it short).
	RetryBase time.Duration
	// Timeout bounds an attempt (0: DefaultTimeout).
	Timeout time.Duration
	// Workers is how many attempts run at once (0: DefaultWorkers).
	Workers int
	// PollInterval is how often due deliveries are looked for (0:
	// DefaultPollInterval); Kick looks at once.
	PollInterval time.Duration
	// MaxWebhooks is how many webhooks a project may have (0:
	// DefaultMaxWebhooks).
	MaxWebhooks int
	Logger      *slog.Logger
	// Now and Rand are the clock and the jitter (nil: time.Now and a
	// random seed).
	Now  func() time.Time
	Rand *rand.Rand
}

// Service is the project's webhooks and their deliverer.
type Service struct {
	cfg    Config
	log    *slog.Logger
	client *http.Client
	kick   chan struct{}
	stop   context.CancelFunc
	done   chan struct{}

	mu  sync.Mutex // of rnd
	rnd *rand.Rand
}

// New starts the deliverer; Close stops it.
func New(cfg Config) *Service {
	if cfg.RetryBase <= 0 {
		cfg.RetryBase = DefaultRetryBase
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Workers <= 0 {
		cfg.Workers = DefaultWorkers
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.MaxWebhooks <= 0 {
		cfg.MaxWebhooks = DefaultMaxWebhooks
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Fence == nil {
		f := store.Fence{Incarnation: time.Now().UnixNano()}
		cfg.Fence = func() store.Fence { return f }
	}
	rnd := cfg.Rand
	if rnd == nil {
		rnd = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	ctx, stop := context.WithCancel(context.Background())
	s := &Service{cfg: cfg, log: cfg.Logger, kick: make(chan struct{}, 1), stop: stop, done: make(chan struct{}), rnd: rnd,
		client: &http.Client{
			Transport: &http.Transport{
				// No proxy: the guard checks the address connected to.
				Proxy:                 nil,
				DialContext:           cfg.Guard.DialContext(&net.Dialer{Timeout: cfg.Timeout, KeepAlive: 30 * time.Second}),
				TLSHandshakeTimeout:   cfg.Timeout,
				ResponseHeaderTimeout: cfg.Timeout,
				MaxIdleConnsPerHost:   4,
				IdleConnTimeout:       90 * time.Second,
				ForceAttemptHTTP2:     true,
			},
			// A redirect is the receiver's answer, not followed: a 3xx
			// is a failed attempt (and a redirect could point anywhere).
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}}
	go s.run(ctx)
	return s
}

// Close stops the deliverer. Attempts under way are abandoned without a
// record: their deliveries are attempted again (after a restart, at once).
func (s *Service) Close() {
	s.stop()
	<-s.done
}

// Kick makes the deliverer look for due deliveries now (the event log
// calls it after each append).
func (s *Service) Kick() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// run claims due deliveries and attempts them, Workers at a time, until
// ctx is done.
func (s *Service) run(ctx context.Context) {
	defer close(s.done)
	// A restart: what this node's last process held is due now.
	if err := s.cfg.Store.ReleaseClaims(ctx, s.cfg.Fence()); err != nil && ctx.Err() == nil {
		s.log.Warn("webhooks: release the last run's claims (they lapse on their own)", "err", err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	free := make(chan struct{}, s.cfg.Workers)
	for range s.cfg.Workers {
		free <- struct{}{}
	}
	poll := time.NewTicker(s.cfg.PollInterval)
	defer poll.Stop()
	lastPrune := time.Time{}
	for {
		if time.Since(lastPrune) > pruneEvery {
			lastPrune = time.Now()
			if n, err := s.cfg.Store.PruneDeliveries(ctx, s.cfg.Now().Add(-KeepDeliveries)); err != nil && ctx.Err() == nil {
				s.log.Warn("webhooks: prune deliveries", "err", err)
			} else if n > 0 {
				s.log.Debug("webhooks: pruned deliveries", "deliveries", n)
			}
		}
		idle := len(free)
		var claimed []store.Delivery
		if idle > 0 {
			var err error
			f := s.cfg.Fence()
			claimed, err = s.cfg.Store.ClaimDeliveries(ctx, f, s.cfg.Timeout+claimMargin, idle)
			if err != nil && ctx.Err() == nil {
				s.log.Warn("webhooks: claim due deliveries", "err", err)
			}
			for _, d := range claimed {
				<-free
				wg.Add(1)
				go func() {
					defer wg.Done()
					s.attempt(ctx, f, d)
					free <- struct{}{}
					s.Kick() // a worker is free: more may be due
				}()
			}
		}
		if len(claimed) > 0 && len(claimed) == idle {
			// Every worker busy and perhaps more due: wait for one.
			select {
			case <-ctx.Done():
				return
			case <-s.kick:
			}
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-poll.C:
		case <-s.kick:
		}
	}
}

// attempt posts d once and records how it went.
func (s *Service) attempt(ctx context.Context, f store.Fence, d store.Delivery) {
	n := d.Attempts + 1
	start := s.cfg.Now()
	a := store.Attempt{N: n, At: start}
	status, err := s.post(ctx, d, n, start)
	a.Duration = s.cfg.Now().Sub(start)
	if ctx.Err() != nil {
		return // stopping: no record, the delivery is attempted again
	}
	a.StatusCode = status
	if err != nil {
		a.Error = err.Error()
		if len(a.Error) > maxError {
			a.Error = a.Error[:maxError] + "…"
		}
	}
	r := s.outcome(d, a)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	if err := s.cfg.Store.RecordAttempt(rctx, f, d.ID, d.Claim, r); err != nil {
		// The claim lapsed or the node was fenced: another node attempts
		// it again (at least once).
		s.log.Warn("webhooks: record an attempt", "delivery", d.ID, "attempt", n, "err", err)
		return
	}
	level := slog.LevelDebug
	if r.State == store.DeliveryFailed {
		level = slog.LevelWarn
	}
	s.log.Log(ctx, level, "webhook delivery attempt", "delivery", d.ID, "webhook", d.WebhookID, "event", d.EventID, "attempt", n,
		"status", a.StatusCode, "err", a.Error, "state", r.State, "retryIn", r.RetryIn)
}

// outcome is what follows from attempt a of d: delivered on a 2xx, else
// another attempt after Backoff while the event is younger than RetryFor,
// else failed.
func (s *Service) outcome(d store.Delivery, a store.Attempt) store.AttemptResult {
	r := store.AttemptResult{Attempt: a}
	switch {
	case a.Error == "":
		r.State = store.DeliveryDelivered
	case s.cfg.Now().Sub(d.CreatedAt) >= RetryFor:
		r.State = store.DeliveryFailed
	default:
		r.State = store.DeliveryPending
		s.mu.Lock()
		r.RetryIn = Backoff(a.N, s.cfg.RetryBase, s.rnd)
		s.mu.Unlock()
	}
	return r
}

// errRefusedAddr is an attempt's error when the URL's address may not be
// reached (its name resolves elsewhere than when the webhook was made).
var errRefusedAddr = errors.New("refused: the URL's host is on a loopback, link-local or private address, which webhooks may not reach unless the operator allows it (--webhook-allow)")

// post sends d's body to its URL, signed, and returns the answer's
// status; an error when there was none or it was not a 2xx.
func (s *Service) post(ctx context.Context, d store.Delivery, n int, now time.Time) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.URL, bytes.NewReader(d.Body))
	if err != nil {
		return 0, fmt.Errorf("bad URL: %v", err)
	}
	ts := now.Unix()
	h := req.Header
	h.Set("Content-Type", "application/json")
	h.Set("User-Agent", "lizard-webhook/1")
	h.Set(WebhookIDHeader, d.WebhookID)
	h.Set(EventIDHeader, d.EventID)
	h.Set(EventTypeHeader, d.EventType)
	h.Set(DeliveryHeader, d.ID)
	h.Set(AttemptHeader, strconv.Itoa(n))
	h.Set(TimestampHeader, strconv.FormatInt(ts, 10))
	h.Set(SignatureHeader, Sign(d.Secret, ts, d.Body))
	resp, err := s.client.Do(req)
	if err != nil {
		switch {
		case errors.Is(err, netguard.ErrRefused):
			return 0, errRefusedAddr
		case errors.Is(err, context.DeadlineExceeded):
			return 0, fmt.Errorf("no answer within %s", s.cfg.Timeout)
		}
		return 0, err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, maxAnswer))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp.StatusCode, fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return resp.StatusCode, nil
}
