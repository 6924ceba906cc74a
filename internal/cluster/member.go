// Package cluster makes several lizard servers on one PostgreSQL database
// act as one service (docs/CLUSTER.md). The database is the coordination
// service: membership (member.go) is a row per node with a lease and an
// incarnation; every write a node makes about its sandboxes is fenced by
// that incarnation (nodestore.go); routing and placement ask the database
// which node holds what.
package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lizard-build/lizard/internal/store"
)

// Database is the store a cluster member works on: both halves of the
// contract, on one database.
type Database interface {
	store.Store
	store.Cluster
}

// MemberConfig configures a Member.
type MemberConfig struct {
	DB Database
	// Info is what the node reports at registration and at every
	// heartbeat (its capacity, templates and runsc build may change).
	Info func() store.NodeInfo
	// Lease is how long a heartbeat keeps the node alive; it is renewed
	// every Lease/3, each heartbeat given up to Lease/2.
	Lease time.Duration
	// DeadAfter is how long a peer's lease must have lapsed before this
	// node declares it dead.
	DeadAfter time.Duration
	// OnFenced runs after this node was found fenced (declared dead,
	// removed, or its name taken by another process) and registered again:
	// it destroys the local sandboxes that keep says have no live row on
	// this node any more (they were lost). Their rows stay, lost, so that
	// clients learn what happened (NodeStore keeps them).
	OnFenced func(ctx context.Context, keep func(id string) bool)
	// OnMove runs when this node's row says move (lizard nodes drain
	// --move): it moves the node's sandboxes to other nodes; then the
	// flag is cleared (the node stays draining). One run at a time.
	OnMove func(ctx context.Context)
	// MoveTimeout bounds one OnMove run (0: DefaultMoveTimeout).
	MoveTimeout time.Duration

	// OnDead runs after this node declared peer node dead (its volumes
	// are flagged lost); nil: nothing.
	OnDead func(ctx context.Context, node string)
	Log    *slog.Logger
	// Now is the clock of the self-view (tests); nil is time.Now.
	Now func() time.Time
}

// DefaultLease and DefaultDeadAfter are the flags' defaults.
const (
	DefaultLease     = 10 * time.Second
	DefaultDeadAfter = 60 * time.Second
)

// Member is this node's membership: its registration, heartbeat and the
// death checker. Its methods are safe for concurrent use.
type Member struct {
	cfg  MemberConfig
	name string

	mu     sync.Mutex
	fence  store.Fence
	fenced bool // a write or heartbeat answered ErrFenced: register again
	// unsettled: registered again after a fence, but the rows this node
	// lost could not be read yet; the next round reads them.
	unsettled bool
	lastOK    time.Time // last successful heartbeat (or registration), by our clock
	streak    time.Time // since when every heartbeat succeeded; zero after a failure
	lost      map[string]bool
	nodes     []store.Node
	nodesAt   time.Time

	kick   chan struct{}
	cancel context.CancelFunc
	done   chan struct{}
	wg     sync.WaitGroup // OnFenced calls

	failing     bool         // the last heartbeat failed (loop only)
	moving      atomic.Bool  // an OnMove run is under way
	deathChecks atomic.Int64 // rounds of the death checker run (tests wait on it)
}

// NewMember checks cfg; Start registers the node.
func NewMember(cfg MemberConfig) (*Member, error) {
	if cfg.DB == nil || cfg.Info == nil {
		return nil, errors.New("cluster member: needs a database and node info")
	}
	if cfg.Lease <= 0 {
		cfg.Lease = DefaultLease
	}
	if cfg.DeadAfter <= 0 {
		cfg.DeadAfter = DefaultDeadAfter
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	name := cfg.Info().Name
	if name == "" {
		return nil, errors.New("cluster member: node name is empty")
	}
	return &Member{cfg: cfg, name: name, lost: map[string]bool{}, kick: make(chan struct{}, 1)}, nil
}

// Start registers the node (a new incarnation) and starts the heartbeat
// and the death checker. A database that does not answer fails it.
func (m *Member) Start(ctx context.Context) error {
	if err := m.register(ctx); err != nil {
		return fmt.Errorf("register node %s: %w", m.name, err)
	}
	// Rows lost while this node was away stay lost (recovery, which does
	// not get them, destroys what is left of those sandboxes).
	if _, err := m.loadLost(ctx); err != nil {
		return fmt.Errorf("node %s: list its sandboxes: %w", m.name, err)
	}
	f := m.Fence()
	m.cfg.Log.Info("cluster: joined", "node", m.name, "incarnation", f.Incarnation, "lease", m.cfg.Lease, "deadAfter", m.cfg.DeadAfter)
	bg, cancel := context.WithCancel(context.WithoutCancel(ctx))
	m.cancel, m.done = cancel, make(chan struct{})
	go m.loop(bg)
	return nil
}

// Close stops the heartbeat. The node's row stays: its lease lapses (a
// restart registers it again and reattaches its sandboxes).
func (m *Member) Close() {
	if m.cancel == nil {
		return
	}
	m.cancel()
	<-m.done
	m.wg.Wait()
}

func (m *Member) register(ctx context.Context) error {
	f, err := m.cfg.DB.RegisterNode(ctx, m.cfg.Info(), m.cfg.Lease)
	if err != nil {
		return err
	}
	now := m.cfg.Now()
	m.mu.Lock()
	m.fence, m.fenced, m.lastOK, m.streak = f, false, now, now
	m.mu.Unlock()
	return nil
}

// Self is this node's name.
func (m *Member) Self() string { return m.name }

// Fence is this node's current incarnation, which its writes carry.
func (m *Member) Fence() store.Fence {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.fence
}

// Healthy reports whether this node's own lease is current by its own
// reckoning (its last successful heartbeat was less than a lease ago) and
// it is not fenced. While it is not, the node takes no new work and makes
// no lifecycle change; its running sandboxes keep serving.
func (m *Member) Healthy() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return !m.fenced && !m.lastOK.IsZero() && m.cfg.Now().Sub(m.lastOK) < m.cfg.Lease
}

// Check is Healthy as an error, for /readyz.
func (m *Member) Check(context.Context) error {
	if m.Healthy() {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fenced {
		return fmt.Errorf("node %s was fenced (declared dead or replaced); registering again", m.name)
	}
	return fmt.Errorf("node %s: own lease lapsed (last heartbeat %s ago)", m.name, m.cfg.Now().Sub(m.lastOK).Round(time.Millisecond))
}

// nodesTTL is how long Nodes answers from its cache.
const nodesTTL = time.Second

// Nodes lists the cluster's nodes, from a cache of about a second. When
// the database does not answer it returns the last good list (nil error)
// if there is one.
func (m *Member) Nodes(ctx context.Context) ([]store.Node, error) {
	m.mu.Lock()
	if m.nodes != nil && m.cfg.Now().Sub(m.nodesAt) < nodesTTL {
		defer m.mu.Unlock()
		return m.nodes, nil
	}
	m.mu.Unlock()
	start := m.cfg.Now() // the list is as old as the read's start
	ns, err := m.cfg.DB.Nodes(ctx)
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		if m.nodes != nil {
			return m.nodes, nil
		}
		return nil, err
	}
	m.nodes, m.nodesAt = ns, start
	return ns, nil
}

// noteFenced records that a write answered ErrFenced for f, and wakes the
// loop to register again.
func (m *Member) noteFenced(f store.Fence) {
	m.mu.Lock()
	if f != m.fence {
		m.mu.Unlock()
		return // already registered again since
	}
	m.fenced = true
	m.mu.Unlock()
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// isLost reports whether id was lost while this node was fenced: its row
// stays as it is.
func (m *Member) isLost(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lost[id]
}

func (m *Member) loop(ctx context.Context) {
	defer close(m.done)
	t := time.NewTicker(m.cfg.Lease / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-m.kick:
		}
		m.tick(ctx)
	}
}

// tick is one round: a heartbeat (or a new registration after a fence),
// then the death checker.
func (m *Member) tick(ctx context.Context) {
	// Half the lease, not the third between ticks: a heartbeat that a
	// loaded database answers in 1.4 s of a 3 s lease still renews it in
	// time (the next tick follows at once), where a deadline of a third
	// failed every heartbeat and the live node's lease lapsed (suspect).
	ctx, cancel := context.WithTimeout(ctx, m.cfg.Lease/2)
	defer cancel()
	m.mu.Lock()
	f, fenced, unsettled := m.fence, m.fenced, m.unsettled
	m.mu.Unlock()
	if fenced {
		m.rejoin(ctx)
		return
	}
	if unsettled {
		m.settleLost(ctx)
	}
	err := m.cfg.DB.Heartbeat(ctx, f, m.cfg.Info(), m.cfg.Lease)
	now := m.cfg.Now()
	m.mu.Lock()
	switch {
	case err == nil:
		m.lastOK = now
		if m.streak.IsZero() {
			m.streak = now
		}
	case errors.Is(err, store.ErrFenced):
		m.fenced, m.streak = true, time.Time{}
	default:
		m.streak = time.Time{}
	}
	streak := m.streak
	m.mu.Unlock()
	switch {
	case errors.Is(err, store.ErrFenced):
		m.cfg.Log.Error("cluster: THIS NODE WAS FENCED: declared dead, removed, or another process registered its name; its lost sandboxes will be destroyed",
			"node", m.name, "incarnation", f.Incarnation)
		m.rejoin(ctx)
		return
	case err != nil:
		// Once per outage at warning level: heartbeats fail about Lease/3 apart.
		lvl := slog.LevelDebug
		if !m.failing {
			lvl = slog.LevelWarn
		}
		m.failing = true
		m.cfg.Log.Log(ctx, lvl, "cluster: heartbeat failed; retrying", "node", m.name, "err", err)
		return
	}
	if m.failing {
		m.failing = false
		m.cfg.Log.Info("cluster: heartbeat went through again", "node", m.name)
	}
	// A database outage is not every node dying: declare others dead only
	// after our own heartbeats have gone through for DeadAfter, so that
	// live peers have renewed their leases after an outage first.
	if now.Sub(streak) >= m.cfg.DeadAfter {
		m.checkDeaths(ctx)
	}
	m.checkMove(ctx)
}

// DefaultMoveTimeout bounds a drain --move on the node: pauses, uploads
// and resumes elsewhere of all its sandboxes.
const DefaultMoveTimeout = 15 * time.Minute

// checkMove starts OnMove when this node's row asks for a move and none
// runs.
func (m *Member) checkMove(ctx context.Context) {
	if m.cfg.OnMove == nil || m.moving.Load() {
		return
	}
	ns, err := m.cfg.DB.Nodes(ctx)
	if err != nil {
		return // the next round asks again
	}
	i := slices.IndexFunc(ns, func(n store.Node) bool { return n.Name == m.name })
	if i < 0 || !ns[i].Moving || !m.moving.CompareAndSwap(false, true) {
		return
	}
	timeout := cmp.Or(m.cfg.MoveTimeout, DefaultMoveTimeout)
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer m.moving.Store(false)
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
		defer cancel()
		m.cfg.Log.Info("cluster: moving this node's sandboxes to other nodes (drain --move)", "node", m.name)
		m.cfg.OnMove(ctx)
		if err := m.cfg.DB.SetMoving(context.WithoutCancel(ctx), m.name, false); err != nil {
			m.cfg.Log.Error("cluster: record the end of a move", "node", m.name, "err", err)
		}
	}()
}

// checkDeaths declares dead the peers whose lease lapsed DeadAfter ago.
func (m *Member) checkDeaths(ctx context.Context) {
	ns, err := m.cfg.DB.Nodes(ctx)
	if err != nil {
		m.cfg.Log.Warn("cluster: list nodes", "err", err)
		return
	}
	defer m.deathChecks.Add(1)
	m.mu.Lock()
	m.nodes, m.nodesAt = ns, m.cfg.Now()
	m.mu.Unlock()
	for _, n := range ns {
		if n.Name == m.name || n.State != store.NodeSuspect || n.LeaseLeft > -m.cfg.DeadAfter {
			continue
		}
		done, err := m.cfg.DB.DeclareDead(ctx, n.Name, m.cfg.DeadAfter)
		switch {
		case err != nil:
			m.cfg.Log.Warn("cluster: declare node dead", "node", n.Name, "err", err)
		case done:
			m.cfg.Log.Warn("cluster: declared node dead; its sandboxes are lost", "node", n.Name,
				"lastHeartbeat", n.Heartbeat, "sandboxes", n.Sandboxes)
			if m.cfg.OnDead != nil {
				m.cfg.OnDead(ctx, n.Name)
			}
		}
	}
}

// rejoin registers a fenced node again and has the sandboxes it lost
// destroyed.
func (m *Member) rejoin(ctx context.Context) {
	if err := m.register(ctx); err != nil {
		m.cfg.Log.Error("cluster: register again after a fence", "node", m.name, "err", err)
		return
	}
	m.settleLost(ctx)
}

// settleLost reads which of this node's rows were lost and has OnFenced
// destroy their sandboxes. A read that fails (a slow or unreachable
// database: when fences happen) is tried again the next round, never
// given up: the lost sandboxes must not run on here.
func (m *Member) settleLost(ctx context.Context) {
	live, err := m.loadLost(ctx)
	m.mu.Lock()
	m.unsettled = err != nil
	m.mu.Unlock()
	if err != nil {
		m.cfg.Log.Error("cluster: list this node's sandboxes after a fence; trying again", "node", m.name, "err", err)
		return
	}
	inc := m.Fence().Incarnation
	m.cfg.Log.Error("cluster: registered again after a fence", "node", m.name, "incarnation", inc, "liveRows", len(live))
	if m.cfg.OnFenced != nil {
		// Destroying takes runsc runs: not in the way of the heartbeat.
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			m.cfg.OnFenced(context.WithoutCancel(ctx), func(id string) bool { return live[id] })
		}()
	}
}

// loadLost records which of this node's rows are lost and returns the ids
// of the others.
func (m *Member) loadLost(ctx context.Context) (live map[string]bool, err error) {
	rows, err := m.cfg.DB.SandboxesOn(ctx, m.name)
	if err != nil {
		return nil, err
	}
	live = map[string]bool{}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range rows {
		if r.Status == store.SandboxLost {
			m.lost[r.ID] = true
		} else {
			live[r.ID] = true
		}
	}
	return live, nil
}
