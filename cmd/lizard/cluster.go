package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/lizard-build/lizard/internal/api"
	"github.com/lizard-build/lizard/internal/cluster"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/sandbox/move"
	"github.com/lizard-build/lizard/internal/sandbox/snapshot"
	"github.com/lizard-build/lizard/internal/sandbox/tplpool"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/template"
	"github.com/lizard-build/lizard/internal/volume"
)

// clusterFlags are the flags of cluster mode (docs/CLUSTER.md): on when
// --internal-listen is set.
type clusterFlags struct {
	internalListen string
	nodeName       string
	advertise      string
	secretFile     string
	lease          time.Duration
	deadAfter      time.Duration
}

func (f *clusterFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.internalListen, "internal-listen", "", "cluster mode: listen address of the node-to-node API (host:port); needs --database postgres://…, --advertise and --cluster-secret-file")
	fs.StringVar(&f.nodeName, "node-name", "", "cluster mode: this node's name, unique in the cluster (default: the hostname)")
	fs.StringVar(&f.advertise, "advertise", "", "cluster mode: host:port at which the other nodes reach --internal-listen")
	fs.StringVar(&f.secretFile, "cluster-secret-file", "", "cluster mode: file holding the secret every node shares (at least 32 bytes), which authenticates node-to-node calls")
	fs.DurationVar(&f.lease, "node-lease", cluster.DefaultLease, "cluster mode: how long a heartbeat keeps this node alive (renewed every third of it)")
	fs.DurationVar(&f.deadAfter, "node-dead-after", cluster.DefaultDeadAfter, "cluster mode: a node whose lease lapsed this long ago is declared dead and its sandboxes lost")
}

// enabled reports whether cluster mode is on.
func (f *clusterFlags) enabled() bool { return f.internalListen != "" }

// validate checks the cluster flags (when cluster mode is on) and reads
// the secret. Every refusal names the flag.
func (f *clusterFlags) validate(database string) (secret []byte, err error) {
	if !f.enabled() {
		for name, v := range map[string]string{"--advertise": f.advertise, "--cluster-secret-file": f.secretFile, "--node-name": f.nodeName} {
			if v != "" {
				return nil, fmt.Errorf("%s is a cluster mode flag: set --internal-listen too (or drop it)", name)
			}
		}
		return nil, nil
	}
	if pg, err := isPostgres(database); err != nil || !pg {
		return nil, errors.New("--internal-listen (cluster mode) needs --database postgres://…: the nodes of a cluster share one PostgreSQL database")
	}
	if _, _, err := net.SplitHostPort(f.internalListen); err != nil {
		return nil, fmt.Errorf("--internal-listen %q: want host:port: %v", f.internalListen, err)
	}
	if f.advertise == "" {
		return nil, errors.New("--advertise: required in cluster mode (host:port at which the other nodes reach --internal-listen)")
	}
	host, port, err := net.SplitHostPort(f.advertise)
	if n, perr := strconv.Atoi(port); err != nil || host == "" || perr != nil || n < 1 || n > 65535 {
		return nil, fmt.Errorf("--advertise %q: want host:port with a host and a port from 1 to 65535", f.advertise)
	}
	if f.nodeName == "" {
		if f.nodeName, err = os.Hostname(); err != nil {
			return nil, fmt.Errorf("--node-name: not given and no hostname: %w", err)
		}
	}
	if err := validNodeName(f.nodeName); err != nil {
		return nil, err
	}
	if f.lease < time.Second {
		return nil, fmt.Errorf("--node-lease %s: must be at least 1s", f.lease)
	}
	if f.deadAfter < f.lease {
		return nil, fmt.Errorf("--node-dead-after %s: must be at least --node-lease (%s)", f.deadAfter, f.lease)
	}
	if f.secretFile == "" {
		return nil, errors.New("--cluster-secret-file: required in cluster mode (a file of at least 32 bytes every node shares)")
	}
	secret, err = os.ReadFile(f.secretFile)
	if err != nil {
		return nil, fmt.Errorf("--cluster-secret-file: %w", err)
	}
	if len(secret) < cluster.MinSecretBytes {
		return nil, fmt.Errorf("--cluster-secret-file %s: %d bytes, need at least %d (e.g. head -c 48 /dev/urandom | base64 > FILE)", f.secretFile, len(secret), cluster.MinSecretBytes)
	}
	return secret, nil
}

// validNodeName accepts names of letters, digits, '-', '_' and '.', up to
// 63 characters: they go in logs, tables and headers.
func validNodeName(name string) error {
	if len(name) > 63 {
		return fmt.Errorf("--node-name %q: at most 63 characters", name)
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return fmt.Errorf("--node-name %q: only letters, digits, '-', '_' and '.'", name)
		}
	}
	return nil
}

// clusterMode is what serve holds in cluster mode; nil on a single
// server. Routing (internal listener, forwarding) extends it.
type clusterMode struct {
	flags  clusterFlags
	secret []byte
	db     cluster.Database
	member *cluster.Member
	// store is the node's view of db, for the sandbox service and the
	// volume manager.
	store *cluster.NodeStore
	// sandboxes is set once the service exists: a fence destroys what was
	// lost through it.
	sandboxes atomic.Pointer[sandbox.Service]
	// snapshots is set with sandboxes: a drain --move hands the node's
	// warm pools over through it.
	snapshots atomic.Pointer[snapshot.Manager]
	// tplPools is set with sandboxes: a drained node keeps no templates'
	// warm copies.
	tplPools atomic.Pointer[tplpool.Manager]
	// objectStore is set with sandboxes: whether images are durable, which
	// a move needs.
	objectStore atomic.Bool
	// routing is set once routing exists: a drain --move resumes the
	// node's sandboxes elsewhere through it.
	routing atomic.Pointer[clusterRouting]
	// volumes is set once the volume manager exists: a peer declared dead
	// leaves its attached volumes at their last sync through it.
	volumes atomic.Pointer[volume.Manager]
}

// holdingStatuses are the statuses of sandboxes that hold their vCPUs and
// memory, as the single-node admission counts them (all but paused).
var holdingStatuses = []string{sandbox.StatusCreating, sandbox.StatusRunning, sandbox.StatusPausing, sandbox.StatusResuming, sandbox.StatusPooled}

// clusterNode says what a node reports of itself.
type clusterNode struct {
	name, advertise string
	runscBuild      string
	capacity        sandbox.Capacity
	maxSandboxes    int
	templates       *template.Registry
	log             *slog.Logger
}

// info is the node's NodeInfo now (its templates as they are built).
func (n clusterNode) info() store.NodeInfo {
	var names []string
	ts, err := n.templates.ListAll()
	if err != nil {
		n.log.Warn("cluster: list templates for the heartbeat", "err", err)
	}
	for _, t := range ts {
		if t.Project != "" {
			names = append(names, t.Project+"/"+t.Name)
		} else {
			names = append(names, t.Name)
		}
	}
	return store.NodeInfo{Name: n.name, Address: n.advertise, RunscBuild: n.runscBuild, VCPUs: n.capacity.VCPUs,
		MemoryMB: n.capacity.MemoryMB, MaxSandboxes: n.maxSandboxes, Templates: names}
}

// startCluster joins the cluster: it registers this node (before recovery,
// so that the node's writes are fenced from the start) and returns the
// node's store. st must be the PostgreSQL store.
func startCluster(ctx context.Context, f clusterFlags, secret []byte, st store.Store, node clusterNode,
	limits func(context.Context, string) (store.Limits, error), log *slog.Logger) (*clusterMode, error) {
	db, ok := st.(cluster.Database)
	if !ok {
		return nil, fmt.Errorf("cluster mode: the %T store cannot coordinate a cluster", st)
	}
	cm := &clusterMode{flags: f, secret: secret, db: db}
	log = log.With("component", "cluster")
	m, err := cluster.NewMember(cluster.MemberConfig{
		DB: db, Info: node.info, Lease: f.lease, DeadAfter: f.deadAfter, Log: log,
		OnDead: func(ctx context.Context, node string) {
			if vols := cm.volumes.Load(); vols != nil {
				if err := vols.NodeLost(ctx, node); err != nil {
					log.Warn("cluster: flag the dead node's volumes", "node", node, "err", err)
				}
			}
		},
		OnFenced: func(ctx context.Context, keep func(string) bool) {
			svc := cm.sandboxes.Load()
			if svc == nil {
				return // not serving yet: recovery finds nothing to keep
			}
			if ids := svc.DestroyLost(ctx, keep); len(ids) > 0 {
				log.Error("cluster: destroyed the sandboxes this node lost", "sandboxes", ids)
			}
		},
		OnMove: func(ctx context.Context) { cm.move(ctx, log) },
	})
	if err != nil {
		return nil, err
	}
	if err := m.Start(ctx); err != nil {
		return nil, err
	}
	cm.member = m
	cm.store = cluster.NewNodeStore(m, cluster.NodeStoreConfig{
		Holding: holdingStatuses, VCPUs: node.capacity.VCPUs, MemoryMB: node.capacity.MemoryMB,
		MaxSandboxes: node.maxSandboxes, Limits: limits,
	})
	return cm, nil
}

// gone reports whether node was declared dead or removed (a node the
// database cannot tell about is not).
func (cm *clusterMode) gone(ctx context.Context, node string) bool {
	ns, err := cm.db.Nodes(ctx)
	return err == nil && cluster.Gone(ns, node)
}

// Close leaves the cluster's heartbeat; the node's row stays for its
// restart.
func (cm *clusterMode) Close() {
	if cm != nil && cm.member != nil {
		cm.member.Close()
	}
}

// readyChecks adds to checks, in cluster mode, that this node's own lease
// is current.
func (cm *clusterMode) readyChecks(checks []api.ReadyCheck) []api.ReadyCheck {
	if cm == nil {
		return checks
	}
	return append(checks, api.ReadyCheck{Name: "cluster", Check: cm.member.Check})
}

// move is a drain --move on this node: every sandbox is paused, made
// durable, released and resumed on another node (cluster.ResumeElsewhere);
// what did not move is logged (the CLI names it from the database).
func (cm *clusterMode) move(ctx context.Context, log *slog.Logger) {
	svc, snaps, cr := cm.sandboxes.Load(), cm.snapshots.Load(), cm.routing.Load()
	if svc == nil || snaps == nil || cr == nil {
		log.Warn("cluster: drain --move before the node serves; the flag is cleared, run it again")
		return
	}
	if tp := cm.tplPools.Load(); tp != nil {
		tp.Hold() // its copies go with the other warm copies below
	}
	for _, p := range snaps.HandOverPools(ctx, cr.router.AdoptElsewhere) {
		if p.Err != nil {
			log.Error("cluster: warm pool not moved", "snapshot", p.ID, "err", p.Err)
		}
	}
	moved := move.Evacuate(ctx, move.Config{Core: svc, ObjectStore: cm.objectStore.Load(),
		Resume: func(ctx context.Context, _, id string) error { return cr.router.ResumeElsewhere(ctx, id) }})
	failed := 0
	for _, m := range moved {
		if m.Err != nil {
			failed++
			log.Error("cluster: sandbox not moved", "sandbox", m.ID, "wasRunning", m.WasRunning, "err", m.Err)
		}
	}
	log.Info("cluster: drain --move done", "sandboxes", len(moved), "failed", failed)
}
