package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"time"

	"go.opentelemetry.io/otel"
	"golang.org/x/sys/unix"

	"github.com/lizard-build/lizard/internal/api"
	"github.com/lizard-build/lizard/internal/apikey"
	"github.com/lizard-build/lizard/internal/cluster"
	"github.com/lizard-build/lizard/internal/codeinterp"
	"github.com/lizard-build/lizard/internal/dashboard"
	"github.com/lizard-build/lizard/internal/disk"
	"github.com/lizard-build/lizard/internal/durable"
	"github.com/lizard-build/lizard/internal/e2b"
	"github.com/lizard-build/lizard/internal/egress"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/events"
	"github.com/lizard-build/lizard/internal/identity"
	"github.com/lizard-build/lizard/internal/mcp"
	"github.com/lizard-build/lizard/internal/metrics"
	"github.com/lizard-build/lizard/internal/netguard"
	"github.com/lizard-build/lizard/internal/network"
	"github.com/lizard-build/lizard/internal/proxy"
	"github.com/lizard-build/lizard/internal/ratelimit"
	"github.com/lizard-build/lizard/internal/reaper"
	"github.com/lizard-build/lizard/internal/runtime"
	"github.com/lizard-build/lizard/internal/runtime/gvisor"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/sandbox/desktop"
	"github.com/lizard-build/lizard/internal/sandbox/netconf"
	"github.com/lizard-build/lizard/internal/sandbox/preview"
	"github.com/lizard-build/lizard/internal/sandbox/schedule"
	"github.com/lizard-build/lizard/internal/sandbox/snapshot"
	"github.com/lizard-build/lizard/internal/sandbox/tplpool"
	sandboxusage "github.com/lizard-build/lizard/internal/sandbox/usage"
	"github.com/lizard-build/lizard/internal/secrets"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/template"
	"github.com/lizard-build/lizard/internal/tmpldist"
	"github.com/lizard-build/lizard/internal/tracing/otlp"
	"github.com/lizard-build/lizard/internal/volume"
	"github.com/lizard-build/lizard/internal/webhook"
)

// defaultSubnet is the sandboxes' subnet unless --subnet says otherwise.
const defaultSubnet = "10.250.0.0/16"

type serveConfig struct {
	listen, dataDir, templateDir, runsc, agent string
	database                                   string
	bridge, subnet, logLevel                   string
	maxSandboxes                               int
	domain, proxyListen, tlsCert, tlsKey       string
	dnsUpstream                                string
	maxVolumeGB                                int
	templateCacheGB                            int
	limits                                     store.Limits
	nodeVCPUs, nodeMemoryGB                    float64
	cpuOvercommit, memoryOvercommit            float64
	logMaxBytes                                int64
	diskWatermark                              float64
	metricsListen                              string
	usageInterval                              time.Duration
	recoverProbeTimeout                        time.Duration
	rateLimit                                  float64
	rateBurst                                  int
	dashboard                                  bool
	sessionTTL, sessionIdle                    time.Duration
	build                                      buildFlags
	maxBuildContext                            int64
	watchInterval                              time.Duration
	cluster                                    clusterFlags
	secrets                                    secretsFlags
	objectStore                                string
	region                                     string
	apiHost                                    string
	codeInterpreterPublic                      bool
	eventsRetention                            time.Duration
	webhookAllow                               listFlag
	webhookRetryBase                           time.Duration
	egressCAFiles                              listFlag
	templatePools                              listFlag
	buildTemplates                             listFlag
	egressCACert, egressCAKey                  string
	otlpEndpoint, otlpProtocol                 string
}

// The default rate limit is far above what a client that waits for its
// answers can send (the SDKs, their test suites, bench/: a request that
// reaches a sandbox takes a millisecond or more), so it only stops a
// runaway loop or a flood from many goroutines sharing one key.
const (
	defaultRateLimit = 1000
	defaultRateBurst = 2000
)

// serveFlags defines the flags of `lizard serve` into c. They are also the
// keys of the config file and the LIZARD_* variables (config.go).
func serveFlags(c *serveConfig) *flag.FlagSet {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.StringVar(&c.listen, "listen", "127.0.0.1:8080", "API listen address")
	fs.StringVar(&c.dataDir, "data-dir", defaultDataDir, "state directory (database, sandboxes)")
	fs.StringVar(&c.database, "database", "", databaseUsage)
	fs.StringVar(&c.region, "region", "local", "the region this node is in: what sandboxes and snapshots made here answer as their region "+
		"(a create that names another region still runs here); lowercase letters, digits and dashes")
	fs.StringVar(&c.objectStore, "object-store", "", objectStoreUsage)
	fs.StringVar(&c.templateDir, "template-dir", defaultTemplateDir, "template cache directory")
	fs.StringVar(&c.runsc, "runsc", "", "runsc binary (default: runsc in PATH)")
	fs.StringVar(&c.agent, "agent", "", "lizard-agent binary (default: next to this binary)")
	fs.StringVar(&c.bridge, "bridge", "lizard0", "host bridge for sandbox networks")
	fs.StringVar(&c.subnet, "subnet", defaultSubnet, "subnet sandboxes get addresses from")
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&c.domain, "domain", "sandbox.localhost", "preview URLs are <sandbox>-<port>.DOMAIN (a wildcard DNS name in a real deployment)")
	fs.StringVar(&c.proxyListen, "proxy-listen", "127.0.0.1:8081", "preview proxy listen address")
	fs.StringVar(&c.tlsCert, "tls-cert", "", "TLS certificate for the preview proxy (with --tls-key: preview URLs are https)")
	fs.StringVar(&c.tlsKey, "tls-key", "", "TLS key for the preview proxy")
	fs.StringVar(&c.apiHost, "api-host", "", "a host name (e.g. api.example.com) whose requests to --proxy-listen are the API's: the API and the previews "+
		"on one (TLS) listener, where the Lizard SDKs look for them (API at api.D, previews at <sandbox>-<port>.sandbox.D with --domain sandbox.D)")
	fs.BoolVar(&c.codeInterpreterPublic, "code-interpreter-public", false, "serve port 8080 of code-interpreter-v1 sandboxes (the Lizard Python SDK's CodeSandbox) "+
		"through the proxy without a token, as that client sends none: anyone who learns such a sandbox's id can run code in it (docs/SECURITY.md)")
	fs.StringVar(&c.dnsUpstream, "dns-upstream", "", "where the sandboxes' DNS resolver forwards (host:port; default: the host's first nameserver)")
	fs.Var(&c.egressCAFiles, "egress-ca-file", "PEM file of CA certificates the egress proxy trusts, beside the host's trust store, when it re-originates the TLS of hosts with transform rules (repeatable)")
	fs.StringVar(&c.egressCACert, "egress-ca-cert", "", "the egress proxy's own CA (PEM certificate, with --egress-ca-key): sandboxes trust it, and the proxy signs the certificates of hosts it intercepts with it "+
		"(default: one generated in DATA-DIR/egress and kept; give every node of a cluster the same one, docs/SECURITY.md)")
	fs.StringVar(&c.egressCAKey, "egress-ca-key", "", "the private key (PEM) of --egress-ca-cert; it never enters a sandbox")
	fs.IntVar(&c.maxVolumeGB, "max-volume-gb", 50, "largest volume size in GB")
	fs.IntVar(&c.templateCacheGB, "template-cache-gb", 50, "with --object-store: most GB of template versions fetched from other nodes kept on this node "+
		"(least recently used go first; never one a sandbox, paused sandbox or snapshot here uses); 0: no limit")
	fs.StringVar(&c.metricsListen, "metrics-listen", "", "serve GET /metrics here instead of on --listen (host:port)")
	fs.DurationVar(&c.usageInterval, "usage-interval", sandboxusage.DefaultInterval, "how often each sandbox's CPU, memory, disk and network use is sampled")
	fs.DurationVar(&c.recoverProbeTimeout, "recover-probe-timeout", sandbox.DefaultRecoverProbeTimeout, "how long recovery waits for a running sandbox's agent after a restart before it shows the sandbox as unresponsive (it is kept and probed again, never destroyed for it)")
	fs.IntVar(&c.maxSandboxes, "max-sandboxes", sandbox.DefaultMaxSandboxes, "most sandboxes running at once (warm pool copies included)")
	fs.Float64Var(&c.rateLimit, "rate-limit", defaultRateLimit, "API requests a second allowed per API key on average (0: no limit)")
	fs.IntVar(&c.rateBurst, "rate-burst", defaultRateBurst, "API requests per API key allowed at once above --rate-limit")
	fs.IntVar(&c.limits.Sandboxes, "default-max-sandboxes", 50, "per project unless lizard projects set says otherwise: most live sandboxes (paused and warm pool copies included); 0: no limit")
	fs.IntVar(&c.limits.VCPUs, "default-max-vcpus", 64, "per project: most vCPUs of sandboxes that are not paused; 0: no limit")
	fs.IntVar(&c.limits.MemoryGB, "default-max-memory-gb", 128, "per project: most memory (GiB) of sandboxes that are not paused; 0: no limit")
	fs.IntVar(&c.limits.VolumeGB, "default-max-volume-gb", 500, "per project: most GB its volumes' sizes add up to; 0: no limit")
	fs.IntVar(&c.limits.Snapshots, "default-max-snapshots", 100, "per project: most snapshots; 0: no limit")
	fs.IntVar(&c.limits.Schedules, "default-max-schedules", 100, "per project: most schedules of its sandboxes; 0: no limit")
	fs.IntVar(&c.limits.SchedulesPerSandbox, "default-max-schedules-per-sandbox", 10, "per project: most schedules of any one of its sandboxes; 0: no limit")
	fs.Float64Var(&c.nodeVCPUs, "node-vcpus", 0, "CPUs of this node that sandboxes share (default: the cores detected)")
	fs.Float64Var(&c.nodeMemoryGB, "node-memory-gb", 0, "memory (GiB) of this node that sandboxes share (default: the RAM detected)")
	fs.Float64Var(&c.cpuOvercommit, "cpu-overcommit", 32, "sandboxes may reserve this many times the node's CPUs (a vCPU is a ceiling, not a reservation); 0: no limit")
	fs.Float64Var(&c.memoryOvercommit, "memory-overcommit", 4, "sandboxes may reserve this many times the node's memory (gVisor takes memory as it is used); 0: no limit")
	fs.Int64Var(&c.logMaxBytes, "log-max-bytes", sandbox.DefaultLogMaxBytes, "disk each sandbox's log may take; the newest output is kept")
	fs.Float64Var(&c.diskWatermark, "disk-watermark", 5, "percent of the data directory's disk that must stay free: below it creates, pauses, snapshots, volume creates and uploads answer 507; 0: no check")
	fs.DurationVar(&c.watchInterval, "watch-interval", 5*time.Second, "how often to look for sandboxes that died on their own")
	fs.BoolVar(&c.dashboard, "dashboard", true, "serve the web dashboard at / of --listen")
	fs.DurationVar(&c.sessionTTL, "dashboard-session-ttl", dashboard.DefaultTTL, "how long a dashboard sign-in lasts")
	fs.DurationVar(&c.sessionIdle, "dashboard-session-idle", dashboard.DefaultIdle, "a dashboard session ends after this long without a request (at most --dashboard-session-ttl)")
	c.build.register(fs)
	c.cluster.register(fs)
	c.secrets.register(fs)
	fs.Int64Var(&c.maxBuildContext, "max-build-context", api.DefaultMaxBuildContext, "largest POST /api/templates request (Dockerfile and build context files) in bytes")
	fs.DurationVar(&c.eventsRetention, "events-retention", events.DefaultRetention, "how long lifecycle events are kept: GET /api/events replays and resumes (Last-Event-ID) within it; at least 1h")
	fs.Var(&c.buildTemplates, "build-templates", "built-in templates to build in the background, one after another, when not built (comma-separated or repeated; make run: the ones besides base): the server serves meanwhile, and a create of one answers 503 template_building until it is built")
	fs.Var(&c.templatePools, "template-pool", "[PROJECT/]TEMPLATE[:SANDBOX-SIZE]=N: keep N sandboxes of the template booted on this node for the project's creates (default project: default; the API's and the CLI's setting of the same pool replaces it)")
	fs.Var(&c.webhookAllow, "webhook-allow", "HOST[:PORT] a webhook URL may name although it is on a loopback, link-local or private address (repeatable)")
	fs.DurationVar(&c.webhookRetryBase, "webhook-retry-base", webhook.DefaultRetryBase, "wait before the first retry of a failed webhook delivery; each next one waits twice as long (at most 1h, with jitter), for 24h after the event")
	fs.StringVar(&c.otlpEndpoint, "otlp-endpoint", "", "export traces over OTLP to this receiver (http://host:4318 for http/protobuf, http://host:4317 for grpc; https for TLS); "+
		"default: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT, else no tracing (docs/OPERATIONS.md, Tracing)")
	fs.StringVar(&c.otlpProtocol, "otlp-protocol", "", "grpc or http/protobuf (default: OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or OTEL_EXPORTER_OTLP_PROTOCOL, else http/protobuf)")
	return fs
}

// serve is the one wiring function of the server: it builds every part,
// serves until ctx is done, and closes them in reverse order. Sandboxes keep
// running across a restart; the next serve reattaches to them.
func serve(ctx context.Context, args []string) error {
	var c serveConfig
	if _, err := configure(serveFlags(&c), args); err != nil {
		return err
	}
	if err := c.validate(); err != nil {
		return err
	}
	clusterSecret, err := c.cluster.validate(c.database)
	if err != nil {
		return err
	}
	if c.rateLimit < 0 || c.rateBurst < 1 {
		return fmt.Errorf("--rate-limit %g, --rate-burst %d: want a rate of 0 (no limit) or more and a burst of 1 or more", c.rateLimit, c.rateBurst)
	}
	if c.watchInterval <= 0 {
		return fmt.Errorf("--watch-interval %s: must be positive", c.watchInterval)
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	if c.sessionTTL < time.Second || c.sessionIdle < time.Second {
		return fmt.Errorf("--dashboard-session-ttl %s, --dashboard-session-idle %s: must be at least 1s", c.sessionTTL, c.sessionIdle)
	}
	if c.recoverProbeTimeout < time.Second {
		return fmt.Errorf("--recover-probe-timeout %s: must be at least 1s", c.recoverProbeTimeout)
	}
	if c.usageInterval < 100*time.Millisecond {
		return fmt.Errorf("--usage-interval %s: must be at least 100ms", c.usageInterval)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	// Tracing is set up first so that a setting it cannot honour stops
	// the start, and shut down last (deferred first): after the servers
	// stopped and every part closed, its buffered spans are exported.
	traces, err := otlp.Setup(ctx, otlp.Config{Endpoint: c.otlpEndpoint, Protocol: c.otlpProtocol, Version: lizardVersion()})
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := traces.Shutdown(sctx); err != nil {
			log.Warn("tracing: flushing the last spans", "err", err)
		}
	}()
	if traces.Enabled() {
		// The SDK reports export failures only through its global
		// handler.
		tlog := log.With("component", "tracing")
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { tlog.Warn("tracing", "err", err) }))
		log.Info("tracing", "export", traces.String())
	}
	// Every step until the API listens is timed (debug): a start must reach
	// its listeners within a second or two whatever the host's load, and
	// these lines say where the time went when it does not.
	step := startupSteps(log)

	if os.Geteuid() != 0 {
		return errors.New("lizard serve must run as root: it creates network namespaces, cgroups and gVisor sandboxes")
	}
	runsc, err := findRunsc(c.runsc)
	if err != nil {
		return err
	}
	subnet, err := netip.ParsePrefix(c.subnet)
	if err != nil {
		return fmt.Errorf("--subnet: %w", err)
	}
	if err := os.MkdirAll(c.dataDir, 0o700); err != nil {
		return err
	}
	agentPath, err := installAgent(c.agent, c.dataDir)
	if err != nil {
		return err
	}
	codeInterpPath, err := installCodeInterpreter(c.dataDir)
	if err != nil {
		return err
	}
	cliPath, err := installCLI(c.dataDir)
	if err != nil {
		return err
	}
	step("install agent, CLI and code interpreter")

	st, err := openStore(ctx, c.dataDir, c.database)
	if err != nil {
		return err
	}
	defer st.Close()
	step("open store and migrate")
	created, err := firstStart(ctx, st)
	if err != nil {
		return err
	}
	// The key is shown at once, with the URL --listen gives; only a port
	// the kernel picks (:0) waits for the listener.
	if _, port, _ := net.SplitHostPort(c.listen); created != nil && port != "0" {
		created.print(os.Stdout, apiURL(c.listen))
		created = nil
	}
	// The CLI shows the limits in force from the database.
	if err := st.SetDefaultLimits(ctx, c.limits); err != nil {
		return err
	}
	limits := func(ctx context.Context, projectID string) (store.Limits, error) {
		return store.ProjectLimits(ctx, st, projectID, c.limits)
	}
	capacity, err := c.capacity()
	if err != nil {
		return err
	}
	guard := &disk.Guard{Dir: c.dataDir, MinFree: c.diskWatermark / 100}
	apiKeys, err := apikey.Open(ctx, apikey.Config{Store: st, Logger: log.With("component", "apikey")})
	if err != nil {
		return err
	}
	defer apiKeys.Close()
	step("load API keys")
	// Secrets and workload identity: the database's, sealed with the
	// operator's key.
	sealKeys, err := c.secrets.keyring()
	if err != nil {
		return err
	}
	secretRecords, err := secretStore(st)
	if err != nil {
		return err
	}
	secretSvc := secrets.New(secretRecords, sealKeys)
	if sealKeys == nil {
		log.Warn("no secrets key (--secrets-key-file or " + secretsKeyEnv + "): creating and updating secrets is refused")
	}
	issuerCfg, err := c.secrets.issuerConfig(st, sealKeys, log.With("component", "identity"))
	if err != nil {
		return err
	}
	issuer, err := identity.New(ctx, issuerCfg)
	if err != nil {
		return err
	}
	go issuer.Run(ctx)
	if issuer.Enabled() {
		log.Info("workload identity", "issuer", issuer.URL())
	}
	step("secrets and workload identity")
	var limiter api.Limiter
	if c.rateLimit > 0 {
		limiter = ratelimit.New(c.rateLimit, c.rateBurst, 0, nil)
	}

	reg := template.NewRegistry(c.templateDir)
	reg.Mirror = c.build.mirror
	// Templates of the older layout become versions before any sandbox is
	// made from them, so that sandboxes record paths a rebuild keeps.
	if migrated, err := reg.Migrate(); err != nil {
		log.Warn("template layout migration", "err", err)
	} else if len(migrated) > 0 {
		log.Info("templates moved to the versioned layout", "templates", migrated)
	}
	// Custom templates from before templates belonged to projects become
	// the default project's (before the reaper starts: the copy runs cp,
	// whose status a child subreaper could take).
	if def, err := defaultProject(ctx, st); err != nil {
		log.Warn("custom template migration: no default project", "err", err)
	} else if migrated, err := reg.MigrateCustom(def.ID); err != nil {
		log.Warn("custom template migration", "project", def.Slug, "err", err)
	} else if len(migrated) > 0 {
		log.Info("custom templates given to the default project", "project", def.Slug, "templates", migrated)
	}
	step("template layout migration")
	reap, err := reaper.Start(ctx)
	if err != nil {
		return fmt.Errorf("become child subreaper: %w", err)
	}
	reg.RunCommand = reap.Run
	step("start reaper")
	// Sandboxes given a lizardToken reach the API at the gateway, on the
	// API's port (none when the kernel picks it).
	apiHost, apiPort := listenPort(c.listen)
	egressCA, err := openEgressCA(c)
	if err != nil {
		return err
	}
	egressRoots, err := egress.RootPool(c.egressCAFiles...)
	if err != nil {
		return err
	}
	netm, err := network.New(network.Config{Bridge: c.bridge, Subnet: subnet, DNSUpstream: c.dnsUpstream, NetnsPrefix: c.build.cgroupParent,
		APIPort: apiPort, EgressProxy: true, Run: reap.Run, Logger: log.With("component", "network")})
	if err != nil {
		return err
	}
	defer netm.Close()
	step("network")
	rt, err := gvisor.New(gvisor.Config{
		Runsc:     runsc,
		StateDir:  filepath.Join(c.dataDir, "sandboxes"),
		RunscRoot: gvisor.RunscRootFor(c.dataDir),
		AgentPath: agentPath,
		CLIPath:   cliPath,
		EgressCA:  egressCA.CertFile(),
		Network:   netm,
		Reaper:    reap,
		Logger:    log.With("component", "gvisor"),

		CgroupParent: c.build.cgroupParent,
	})
	if err != nil {
		return err
	}
	step("gvisor runtime")
	// The sandbox service and the volume manager work on the node's view
	// of the database in cluster mode (fenced writes, this node's rows).
	var nodeStore store.Store = st
	var cm *clusterMode
	if c.cluster.enabled() {
		build, err := rt.RunscDigest(ctx)
		if err != nil {
			return fmt.Errorf("cluster mode: runsc build: %w", err)
		}
		cm, err = startCluster(ctx, c.cluster, clusterSecret, st, clusterNode{name: c.cluster.nodeName, advertise: c.cluster.advertise,
			runscBuild: build, capacity: capacity, maxSandboxes: c.maxSandboxes, templates: reg, log: log}, limits, log)
		if err != nil {
			return err
		}
		defer cm.Close()
		nodeStore = cm.store
		projectLimits := limits
		limits = func(ctx context.Context, projectID string) (store.Limits, error) {
			l, err := projectLimits(ctx, projectID)
			return l, cluster.Unavailable(err)
		}
	}
	images, err := openImages(c.objectStore, log.With("component", "durable"))
	if err != nil {
		return err
	}
	// In a cluster with an object store, volumes move between nodes.
	// In any cluster, a project's volume quota counts every node's.
	var (
		sharedVols volume.SharedStore
		nodeGone   func(context.Context, string) bool
		allVols    func(context.Context) ([]store.Volume, error)
	)
	if cm != nil && images != nil {
		sharedVols, nodeGone = cm.db, cm.gone
	}
	if cm != nil {
		allVols = func(ctx context.Context) ([]store.Volume, error) {
			vs, err := cm.db.Volumes(ctx)
			return vs, cluster.Unavailable(err)
		}
	}
	vols, err := volume.New(volume.Config{
		Images: images, Shared: sharedVols, Gone: nodeGone, Everywhere: allVols,
		Dir: filepath.Join(c.dataDir, "volumes"), Store: nodeStore, MaxSizeGB: c.maxVolumeGB, Run: reap.Run,
		Logger: log.With("component", "volume"), Disk: guard,
		MaxProjectGB: func(ctx context.Context, projectID string) (int, error) {
			l, err := limits(ctx, projectID)
			return l.VolumeGB, err
		},
	})
	if err != nil {
		return err
	}
	defer vols.Close()
	if cm != nil {
		cm.volumes.Store(vols)
	}
	step("volumes")
	buildOpts, err := c.build.options(subnet)
	if err != nil {
		return err
	}
	tmpls, err := openTemplateDist(&c, reg, images, st, reap.Run, log.With("component", "template"))
	if err != nil {
		return err
	}
	mets := metrics.New()
	evlog, hooks, err := openEvents(&c, st, cm, log)
	if err != nil {
		return err
	}
	defer hooks.Close()
	defer evlog.Close() // before the deliverer: what it writes last is delivered after a restart
	// In a cluster, a project's snapshot limit counts every node's.
	var projectSnapshots func(context.Context, string) (int, error)
	if cm != nil {
		projectSnapshots = func(ctx context.Context, projectID string) (int, error) {
			sns, err := cm.db.Snapshots(ctx)
			n := 0
			for _, sn := range sns {
				if sn.ProjectID == projectID {
					n++
				}
			}
			return n, cluster.Unavailable(err)
		}
	}
	queue, err := newTemplateQueue(&c, reg, rt, reap.Run, buildOpts, tmpls, log.With("component", "template"))
	if err != nil {
		return err
	}
	svc := sandbox.New(sandbox.Config{
		Runtime: rt, Store: nodeStore, Templates: queue.templates(), Volumes: vols,
		SnapshotDir: filepath.Join(c.dataDir, "snapshots"), ReadyDir: filepath.Join(c.dataDir, "ready"),
		LogDir: filepath.Join(c.dataDir, "logs"), MaxSandboxes: c.maxSandboxes, RecoverProbeTimeout: c.recoverProbeTimeout,
		Logger: log.With("component", "sandbox"), Observer: mets, LogMaxBytes: c.logMaxBytes,
		Capacity: capacity, Limits: limits, Disk: guard, CodeInterpreterPath: codeInterpPath,
		Images: images, Region: c.region, Events: evlog,
	})
	defer svc.Close()
	// The sandbox service's features, each a package over its core.
	snaps := snapshot.New(snapshot.Config{
		Core: svc, Runtime: rt, Store: nodeStore, Dir: filepath.Join(c.dataDir, "snapshots"), Images: images, Disk: guard,
		Limits: limits, ProjectSnapshots: projectSnapshots, Observer: mets, Logger: log.With("component", "snapshot"),
	})
	defer snaps.Close()
	inUse := func(rootfs string) bool { return svc.UsesRootfs(rootfs) || snaps.UsesRootfs(rootfs) }
	tmpls.SetInUse(inUse)
	if cm != nil {
		cm.sandboxes.Store(svc)
		cm.snapshots.Store(snaps)
		cm.objectStore.Store(images != nil)
	}
	if err := snaps.Recover(ctx); err != nil {
		log.Error("recovery of the snapshots failed; they are retried at next start", "err", err)
	}
	if err := svc.Recover(ctx); err != nil {
		log.Error("recovery left some sandboxes behind; they are retried at next start", "err", err)
	}
	step("sandbox service and recovery start")
	staticPools, err := parseTemplatePools(ctx, st, c.templatePools)
	if err != nil {
		return err
	}
	poolSettings, _ := st.(store.TemplatePools) // both backends keep them
	tplPools := tplpool.New(tplpool.Config{Core: svc, Settings: poolSettings, Static: staticPools, Logger: log.With("component", "tplpool")})
	tplPools.Start()
	defer tplPools.Close()
	if cm != nil {
		cm.tplPools.Store(tplPools)
	}
	defer queue.start(ctx)()
	go svc.Watch(ctx, c.watchInterval)
	usages := sandboxusage.New(svc, rt, log.With("component", "usage"))
	go usages.Run(ctx, c.usageInterval)
	go svc.ProbeAgents(ctx, c.usageInterval)
	if err := mets.Register(metrics.NewStateCollector(metrics.StateConfig{Inventory: inventory{svc, snaps}, Reservations: svc, DataDir: c.dataDir, MaxSandboxes: c.maxSandboxes})); err != nil {
		return err
	}
	// Templates built by the CLI get their start command's ready state
	// within seconds; template versions left by rebuilds go once nothing
	// uses them (builds through the API do both right away).
	go func() {
		for i := 0; ; i++ {
			svc.PrepareTemplates(reg.ListAll)
			tmpls.PublishNew(ctx) // builds of the CLI, and API builds whose publish failed
			tmpls.Evict("")
			if i%30 == 0 { // every 5 minutes
				pruneTemplates(reg, inUse, log.With("component", "template"))
			}
			if i%360 == 30 { // every hour, from 5 minutes on
				collectTemplates(ctx, tmpls, st, log.With("component", "template"))
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(10 * time.Second):
			}
		}
	}()

	var (
		sessions api.Sessions
		assets   http.Handler
	)
	if c.dashboard {
		a, err := dashboard.NewAssets()
		if err != nil {
			return fmt.Errorf("dashboard: %w", err)
		}
		sessions, assets = dashboard.NewSessions(c.sessionTTL, c.sessionIdle), a
		step("dashboard assets")
	}
	// In cluster mode, requests for what another node holds go there.
	var routing *clusterRouting
	if cm != nil {
		if routing, err = newClusterRouting(cm.member.Self(), cm.secret, cm.db, svc, snaps, usages, vols, images != nil, log.With("component", "route")); err != nil {
			return err
		}
		cm.routing.Store(routing)
		// Warm pools of nodes declared dead or removed are adopted
		// (docs/CLUSTER.md).
		go routing.router.KeepPools(ctx, c.cluster.lease, snaps)
	}
	ln, err := net.Listen("tcp", c.listen)
	if err != nil {
		return err
	}
	pln, err := net.Listen("tcp", c.proxyListen)
	if err != nil {
		ln.Close()
		return fmt.Errorf("--proxy-listen: %w", err)
	}
	var mln net.Listener
	if c.metricsListen != "" {
		if mln, err = net.Listen("tcp", c.metricsListen); err != nil {
			ln.Close()
			pln.Close()
			return fmt.Errorf("--metrics-listen: %w", err)
		}
	}
	var iln net.Listener
	if routing != nil {
		if iln, err = net.Listen("tcp", c.cluster.internalListen); err != nil {
			ln.Close()
			pln.Close()
			if mln != nil {
				mln.Close()
			}
			return fmt.Errorf("--internal-listen: %w", err)
		}
	}
	// The API on the sandboxes' gateway, unless --listen's wildcard
	// address covers it already; only the /api/ routes answer there.
	var gln net.Listener
	if netm.APIURL() != "" && !isWildcard(apiHost) {
		if gln, err = net.Listen("tcp", netip.AddrPortFrom(netm.Gateway(), apiPort).String()); err != nil {
			for _, l := range []net.Listener{ln, pln, mln, iln} {
				if l != nil {
					l.Close()
				}
			}
			return fmt.Errorf("listen for the sandboxes' lizard CLI on the gateway %s: %w", netm.Gateway(), err)
		}
	}
	if created != nil {
		created.print(os.Stdout, apiURL(ln.Addr().String()))
	}
	useTLS := c.tlsCert != "" && c.tlsKey != ""
	previews := previewURLs(c.domain, pln.Addr().String(), useTLS)
	// E2B's SDKs reach port P of sandbox S at P-S.<domain>[:proxy port].
	e2bDomain := c.domain
	if previews.Port != "" {
		e2bDomain = net.JoinHostPort(c.domain, previews.Port)
	}
	apiCluster, previewCluster := routing.hooks()
	ports := preview.New(svc)
	desktops := desktop.New(svc, ports)
	scheds, err := newSchedules(svc, st, cm, limits, evlog, log.With("component", "schedule"))
	if err != nil {
		return err
	}
	schedCtx, stopScheds := context.WithCancel(ctx)
	schedsDone := make(chan struct{})
	go func() {
		defer close(schedsDone)
		scheds.Run(schedCtx)
	}()
	defer func() {
		stopScheds()
		<-schedsDone
	}()
	egressLog := egress.NewLog(0)
	networks := netconf.New(netconf.Config{Core: svc, Runtime: rt, Addresses: netm, Logs: egressLog, Secrets: secretSvc, Tokens: issuer})
	egressProxy := egress.New(egress.Config{Listener: netm.EgressListener(), Sources: networks, Forbidden: netm.Forbidden, CA: egressCA,
		RootCAs: egressRoots, Recorder: mets, Log: egressLog, Secrets: secretSvc, Tokens: issuer, Logger: log.With("component", "egress")})
	go func() {
		if err := egressProxy.Serve(); err != nil {
			log.Error("egress proxy stopped", "err", err)
		}
	}()
	defer egressProxy.Close()
	builder := &templateBuilder{reg: reg, dist: tmpls, runtime: rt, run: reap.Run, dns: c.dnsUpstream, build: buildOpts, ready: svc, inUse: inUse, metrics: mets,
		log: log.With("component", "template")}
	tags, _ := st.(store.TemplateTags) // both backends keep them
	e2bAPI := e2b.Handler(e2b.Config{Auth: api.Auth{Keys: apiKeys, Limiter: limiter}, Sandboxes: svc, Copies: snaps, Usage: usages, Networks: networks, Templates: tmpls,
		Snapshots: snaps, Volumes: vols, Agents: svc, SandboxCLI: gvisor.CLIPath,
		Domain: e2bDomain, Logger: log.With("component", "e2b"), Cluster: apiCluster, Secrets: secretSvc, Identity: issuer,
		Builder: builder, FilesDir: filepath.Join(c.dataDir, "e2b-files"), MaxUpload: c.maxBuildContext, Disk: guard, Tags: tags, BuildContext: ctx})
	// The MCP server's tools call this API's handler in-process (with the
	// key of each MCP request), and the API serves the MCP server at /mcp:
	// the handler is named before it is made.
	var apiHandler http.Handler
	mcpHTTP := mcp.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { apiHandler.ServeHTTP(w, r) }),
		mcp.HandlerConfig{Version: lizardVersion(), Logger: log.With("component", "mcp"), Serving: ctx})
	apiHandler = api.Handler(api.Config{E2B: e2bAPI, MCP: mcpHTTP, Keys: apiKeys, Limiter: limiter, Sandboxes: svc, Snapshots: snaps, Copies: snaps, Usage: usages, Ports: ports, Desktops: desktops, Schedules: scheds, Networks: networks, Templates: tmpls, TemplateBuilds: queue.status(), TemplatePools: tplPools, Previews: previews, Volumes: vols,
		Builder:         builder,
		MaxBuildContext: c.maxBuildContext, Logger: log.With("component", "api"),
		Metrics: mets, ServeMetrics: mln == nil, Tracing: traces.TracerProvider(), Ready: cm.readyChecks(readyChecks(st, runsc, filepath.Join(c.dataDir, "sandboxes"), netm)),
		Disk: guard, KeyStore: st, Sessions: sessions, Dashboard: assets, Cluster: apiCluster, SandboxURL: netm.APIURL(),
		Secrets: secretSvc, Identity: issuer, Events: evlog, Webhooks: hooks})
	srv := &http.Server{
		Handler:           apiHandler,
		ReadHeaderTimeout: 10 * time.Second,
	}
	// Event streams never end on their own: a shutdown ends them so that
	// it does not wait for them (clients reconnect with Last-Event-ID).
	srv.RegisterOnShutdown(evlog.EndStreams)
	var public proxy.PublicPorts
	if c.codeInterpreterPublic {
		public = codeInterpreterPorts{ports}
	}
	psrv := &http.Server{
		Handler: proxy.Handler(proxy.Config{Domain: c.domain, TLS: useTLS, Previews: ports, E2B: ports, Loopback: svc, Dialer: svc, Runs: svc, Logger: log.With("component", "proxy"), Metrics: mets,
			Cluster: previewCluster, Public: public, APIHost: c.apiHost, API: srv.Handler}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	msrv := &http.Server{Handler: mets.Handler(), ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 5)
	go func() { errc <- srv.Serve(ln) }()
	if gln != nil {
		go func() { errc <- srv.Serve(gln) }()
	}
	isrv := &http.Server{}
	if iln != nil {
		isrv = routing.server(srv.Handler, psrv.Handler, traces.TracerProvider())
		go func() { errc <- isrv.Serve(iln) }()
	}
	if mln != nil {
		go func() { errc <- msrv.Serve(mln) }()
	}
	go func() {
		if useTLS {
			errc <- psrv.ServeTLS(pln, c.tlsCert, c.tlsKey)
			return
		}
		errc <- psrv.Serve(pln)
	}()
	log.Info("admission", "vcpus", capacity.VCPUs, "memoryMb", capacity.MemoryMB, "maxSandboxes", c.maxSandboxes, "projectDefaults", c.limits,
		"diskWatermarkPercent", c.diskWatermark, "logMaxBytes", c.logMaxBytes)
	step("listen")
	log.Info("lizard serving", "startup", time.Since(processStart).Round(time.Millisecond), "listen", ln.Addr().String(), "proxy", pln.Addr().String(), "previews", previews.Scheme+"://<sandbox>-<port>."+c.domain,
		"data_dir", c.dataDir, "database", databaseKind(c.database), "templates", c.templateDir, "runsc", runsc)
	if cm != nil {
		log.Info("cluster mode", "node", cm.member.Self(), "incarnation", cm.member.Fence().Incarnation, "advertise", c.cluster.advertise,
			"internal", c.cluster.internalListen, "lease", c.cluster.lease, "deadAfter", c.cluster.deadAfter)
	}
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down; sandboxes keep running")
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return errors.Join(srv.Shutdown(sctx), psrv.Shutdown(sctx), msrv.Shutdown(sctx), isrv.Shutdown(sctx))
}

// newSchedules makes the sandboxes' schedules over svc, kept in st; in a
// cluster their claims carry this node's fence.
func newSchedules(svc *sandbox.Service, st store.Store, cm *clusterMode, limits func(context.Context, string) (store.Limits, error), runs schedule.RunEvents, log *slog.Logger) (*schedule.Service, error) {
	ss, ok := st.(store.Schedules)
	if !ok {
		return nil, fmt.Errorf("store %T keeps no schedules", st)
	}
	cfg := schedule.Config{Core: svc, Store: ss, Limits: limits, Runs: runs, Logger: log}
	if cm != nil {
		cfg.Node, cfg.Fence = cm.member.Self(), cm.member.Fence
	}
	return schedule.New(cfg), nil
}

// openEvents starts the lifecycle event log, which every node of a
// cluster writes to the shared database (st, not the node's view), and
// the webhooks' deliverer, whose claims carry the node's fence in cluster
// mode (on a single server, this process's incarnation).
func openEvents(c *serveConfig, st store.Store, cm *clusterMode, log *slog.Logger) (*events.Log, *webhook.Service, error) {
	evStore, ok := st.(store.Events)
	if !ok {
		return nil, nil, fmt.Errorf("the %T store cannot keep events", st)
	}
	guard, err := netguard.New("--webhook-allow", c.webhookAllow)
	if err != nil {
		return nil, nil, err
	}
	cfg := webhook.Config{Store: evStore, Guard: guard, RetryBase: c.webhookRetryBase, Logger: log.With("component", "webhook")}
	node := ""
	if cm != nil {
		cfg.Fence, node = cm.member.Fence, cm.member.Self()
	}
	hooks := webhook.New(cfg)
	evlog, err := events.New(events.Config{Store: evStore, Node: node, Retention: c.eventsRetention, Appended: hooks.Kick,
		Logger: log.With("component", "events")})
	if err != nil {
		hooks.Close()
		return nil, nil, err
	}
	return evlog, hooks, nil
}

// openEgressCA is the operator's egress CA (--egress-ca-cert and
// --egress-ca-key), else the node's own in DATA-DIR/egress, generated at
// its first start.
func openEgressCA(c serveConfig) (*egress.CA, error) {
	if (c.egressCACert == "") != (c.egressCAKey == "") {
		return nil, errors.New("--egress-ca-cert and --egress-ca-key: give both, or neither (the node makes its own)")
	}
	if c.egressCACert != "" {
		return egress.LoadCA(c.egressCACert, c.egressCAKey)
	}
	name := c.cluster.nodeName
	if name == "" {
		name, _ = os.Hostname()
	}
	return egress.OpenCA(filepath.Join(c.dataDir, "egress"), name)
}

// codeInterpreterPorts makes the Lizard SDK's code-interpreter port of
// code-interpreter-v1 sandboxes public (--code-interpreter-public): its
// client sends no token. The server there still asks for a secure E2B
// sandbox's envd token.
type codeInterpreterPorts struct{ ports *preview.Service }

func (c codeInterpreterPorts) PublicAddr(id string, port int) (string, error) {
	if port != codeinterp.LizardPort {
		return "", fmt.Errorf("port %d is not public: %w", port, errdefs.ErrNotFound)
	}
	return c.ports.CodeInterpreterAddr(id, port)
}

// readyChecks are what GET /readyz checks: the store answers, runsc and
// the runtime's state directory are there, the bridge is up.
func readyChecks(st store.Store, runsc, stateDir string, netm *network.Manager) []api.ReadyCheck {
	return []api.ReadyCheck{
		{Name: "store", Check: st.Ping},
		{Name: "runtime", Check: func(context.Context) error {
			fi, err := os.Stat(runsc)
			if err != nil {
				return err
			}
			if fi.Mode()&0o111 == 0 {
				return fmt.Errorf("%s is not executable", runsc)
			}
			_, err = os.ReadDir(stateDir)
			return err
		}},
		{Name: "network", Check: func(context.Context) error { return netm.Ready() }},
	}
}

// validate refuses flag values that make no sense, naming the flag.
func (c *serveConfig) validate() error {
	for _, l := range store.AllLimits {
		if v := *c.limits.Field(l); v < 0 {
			return fmt.Errorf("--default-max-%s %d: must be 0 (no limit) or more", l, v)
		}
	}
	for name, v := range map[string]float64{"--node-vcpus": c.nodeVCPUs, "--node-memory-gb": c.nodeMemoryGB,
		"--cpu-overcommit": c.cpuOvercommit, "--memory-overcommit": c.memoryOvercommit} {
		if v < 0 {
			return fmt.Errorf("%s %g: must be 0 or more", name, v)
		}
	}
	if c.logMaxBytes < 64<<10 {
		return fmt.Errorf("--log-max-bytes %d: must be at least 65536", c.logMaxBytes)
	}
	if c.diskWatermark < 0 || c.diskWatermark >= 100 {
		return fmt.Errorf("--disk-watermark %g: must be a percentage from 0 to below 100", c.diskWatermark)
	}
	if err := validRegion(c.region); err != nil {
		return err
	}
	if c.maxSandboxes < 1 {
		return fmt.Errorf("--max-sandboxes %d: must be 1 or more", c.maxSandboxes)
	}
	if c.eventsRetention < events.MinRetention {
		return fmt.Errorf("--events-retention %s: must be at least %s (a stream resumes within an hour)", c.eventsRetention, events.MinRetention)
	}
	if c.webhookRetryBase < 10*time.Millisecond || c.webhookRetryBase > webhook.MaxRetryWait {
		return fmt.Errorf("--webhook-retry-base %s: must be from 10ms to %s", c.webhookRetryBase, webhook.MaxRetryWait)
	}
	if err := gvisor.ValidCgroupParent(c.build.cgroupParent); err != nil {
		return fmt.Errorf("--cgroup-parent: %w", err)
	}
	if _, err := netguard.New("--webhook-allow", c.webhookAllow); err != nil {
		return err
	}
	return nil
}

// validRegion checks --region: 1 to 64 lowercase letters, digits and
// dashes, starting and ending with a letter or digit (us-east-1).
func validRegion(r string) error {
	ok := r != "" && len(r) <= 64 && r[0] != '-' && r[len(r)-1] != '-'
	for _, c := range r {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			ok = false
		}
	}
	if !ok {
		return fmt.Errorf("--region %q: want 1 to 64 lowercase letters, digits and dashes, starting and ending with a letter or digit (e.g. us-east-1)", r)
	}
	return nil
}

// capacity is what the node's sandboxes may reserve: its CPUs and memory
// (detected unless given) times the overcommit factors; 0 where a factor
// is 0 (no limit).
func (c *serveConfig) capacity() (sandbox.Capacity, error) {
	cpus, memGB := c.nodeVCPUs, c.nodeMemoryGB
	if cpus == 0 {
		cpus = float64(goruntime.NumCPU())
	}
	if memGB == 0 {
		var si unix.Sysinfo_t
		if err := unix.Sysinfo(&si); err != nil {
			return sandbox.Capacity{}, fmt.Errorf("detect the node's memory (pass --node-memory-gb): %w", err)
		}
		memGB = float64(uint64(si.Totalram)*uint64(si.Unit)) / (1 << 30)
	}
	return sandbox.Capacity{VCPUs: cpus * c.cpuOvercommit, MemoryMB: int64(memGB * c.memoryOvercommit * 1024)}, nil
}

// previewURLs derives how preview URLs look from the proxy's address: the
// port shows in them unless it is the scheme's default.
func previewURLs(domain, proxyAddr string, useTLS bool) api.PreviewURLs {
	p := api.PreviewURLs{Domain: domain, Scheme: "http"}
	if useTLS {
		p.Scheme = "https"
	}
	if _, port, err := net.SplitHostPort(proxyAddr); err == nil && !(port == "80" && !useTLS) && !(port == "443" && useTLS) {
		p.Port = port
	}
	return p
}

// templateBuilder builds Dockerfile templates for the API with this
// server's runtime (RUN steps), and its reaper for the commands builds run;
// a template with a start command gets its ready state made right away.
type templateBuilder struct {
	reg     *template.Registry
	dist    *tmpldist.Dist // publishes what it builds (--object-store)
	runtime runtime.Runner
	run     func(*exec.Cmd) error
	dns     string
	build   template.DockerfileOptions // the build network and pull policy
	// ready makes a template's ready state as part of its build.
	ready interface {
		PrepareReady(ctx context.Context, tpl template.Template, size string, progress io.Writer) (sandbox.ReadyState, error)
	}
	inUse   func(rootfs string) bool
	metrics *metrics.Metrics
	log     *slog.Logger
}

// inventory is what the metrics read of the sandbox service: the core's
// sandboxes and the snapshots' warm pools.
type inventory struct {
	sandboxes *sandbox.Service
	snapshots *snapshot.Manager
}

func (i inventory) Sandboxes() []metrics.Sandbox { return i.sandboxes.Sandboxes() }
func (i inventory) WarmPools() []metrics.Pool    { return i.snapshots.WarmPools() }

func (b *templateBuilder) BuildDockerfile(ctx context.Context, project, name string, opts api.BuildOptions, progress io.Writer) (template.Template, error) {
	// A FROM naming a template built on another node: fetched first.
	b.dist.FetchBases(project, opts.Dockerfile)
	return b.buildWith(ctx, project, name, opts.ContextDir, "", func(reg *template.Registry, o template.DockerfileOptions) (template.Template, error) {
		o.Dockerfile, o.DockerfileName, o.BuildArgs, o.ReadyCommand = opts.Dockerfile, "Dockerfile", opts.BuildArgs, opts.ReadyCommand
		return reg.BuildDockerfile(ctx, name, o, progress)
	})
}

// BuildSteps builds project's template name from steps (E2B's Template
// builder, internal/e2b) as BuildDockerfile does from a Dockerfile, the
// ready state made for sandboxes of size.
func (b *templateBuilder) BuildSteps(ctx context.Context, project, name string, steps template.Steps, contextDir, size string, progress io.Writer) (template.Template, error) {
	if !steps.FromImage && !template.IsBuiltin(steps.From) && b.dist.Enabled() {
		// A base template built on another node: fetched first.
		if _, err := b.dist.Lookup(project, steps.From); err != nil {
			b.log.Debug("templates: base of a build not fetched", "template", steps.From, "err", err)
		}
	}
	return b.buildWith(ctx, project, name, contextDir, size, func(reg *template.Registry, o template.DockerfileOptions) (template.Template, error) {
		return reg.BuildSteps(ctx, name, steps, o, progress)
	})
}

// buildWith runs a build of project's template name with this server's
// options, makes its ready state (for sandboxes of size, "" the default)
// before the template switches to it, publishes it and prunes what it
// replaced.
func (b *templateBuilder) buildWith(ctx context.Context, project, name, contextDir, size string,
	run func(reg *template.Registry, opts template.DockerfileOptions) (template.Template, error)) (template.Template, error) {
	start := time.Now()
	reg, err := b.reg.Project(project)
	if err != nil {
		return template.Template{}, err
	}
	t, err := run(reg, template.DockerfileOptions{
		Context: contextDir, Runtime: b.runtime, DNSUpstream: b.dns, RunCommand: b.run,
		BuildBridge: b.build.BuildBridge, BuildSubnet: b.build.BuildSubnet, BuildDeny: b.build.BuildDeny, Pull: b.build.Pull,
		NetnsPrefix: b.build.NetnsPrefix, Logger: b.log,
		// The start command's ready state is part of the build: a command
		// that fails leaves the template as it was.
		BeforeSwitch: func(ctx context.Context, t template.Template, progress io.Writer) error {
			if len(t.StartCommand) == 0 {
				return nil
			}
			_, err := b.ready.PrepareReady(ctx, t, size, progress)
			return err
		},
	})
	b.metrics.TemplateBuild(time.Since(start), err)
	if err == nil {
		// Other nodes fetch it on first use; a publish that fails is
		// retried by the server's template loop (PublishNew).
		if perr := b.dist.Publish(ctx, t); perr != nil {
			b.log.Error("template built here; publishing it to the object store failed (retried)", "template", name, "err", perr)
		}
		pruneTemplates(b.reg, b.inUse, b.log)
	}
	return t, err
}

// openTemplateDist puts the registry in front of the object store (when
// there is one): published and fetched template versions (tmpldist).
func openTemplateDist(c *serveConfig, reg *template.Registry, images sandbox.Images, st store.Store, run func(*exec.Cmd) error, log *slog.Logger) (*tmpldist.Dist, error) {
	cfg := tmpldist.Config{Registry: reg, Node: c.cluster.nodeName, Dir: filepath.Join(c.dataDir, "templates-dist"),
		CacheBytes: int64(c.templateCacheGB) << 30, Run: run, Logger: log}
	if im, ok := images.(*durable.Images); ok && im != nil {
		recs, ok := st.(store.TemplateVersions)
		if !ok {
			return nil, fmt.Errorf("--object-store: the %T store cannot record template versions", st)
		}
		cfg.Images, cfg.Records = im, recs
		cfg.Projects = func(ctx context.Context) ([]string, error) {
			ps, err := st.Projects(ctx)
			ids := make([]string, len(ps))
			for i, p := range ps {
				ids[i] = p.ID
			}
			return ids, err
		}
	}
	return tmpldist.New(cfg)
}

// collectTemplates deletes from the object store the published template
// versions that are not current and that no sandbox or snapshot record of
// the cluster (st: every node's rows) was made on (tmpldist.Collect).
func collectTemplates(ctx context.Context, tmpls *tmpldist.Dist, st store.Store, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	used := func(ctx context.Context) (map[string]bool, error) { return sandbox.TemplateVersionsUsed(ctx, st) }
	if _, err := tmpls.Collect(ctx, used, tmpldist.CollectGrace); err != nil {
		log.Warn("collect published template versions", "err", err)
	}
}

// pruneTemplates removes the template versions that no sandbox or snapshot
// uses and that are not current, and the Dockerfile layers no build used
// for template.LayerTTL, of the built-in templates and every project's.
func pruneTemplates(reg *template.Registry, inUse func(rootfs string) bool, log *slog.Logger) {
	regs, err := reg.All()
	if err != nil {
		log.Warn("prune templates", "err", err)
		return
	}
	for _, r := range regs {
		log := log.With("project", r.ProjectID())
		removed, err := r.Prune(inUse)
		for _, v := range removed {
			log.Info("removed a template version nothing uses", "dir", v)
		}
		if err != nil {
			log.Warn("prune template versions", "err", err)
		}
		n, _, err := r.PruneLayers(template.LayerTTL)
		if n > 0 {
			log.Info("removed Dockerfile layers no build used lately", "layers", n, "unusedFor", template.LayerTTL)
		}
		if err != nil {
			log.Warn("prune Dockerfile layers", "err", err)
		}
	}
}

// defaultProject is the project custom templates of no project go to: the
// one firstStart made ("default"), else the oldest.
func defaultProject(ctx context.Context, st store.Store) (store.Project, error) {
	if p, err := st.ProjectByRef(ctx, "default"); err == nil {
		return p, nil
	}
	ps, err := st.Projects(ctx)
	if err != nil {
		return store.Project{}, err
	}
	if len(ps) == 0 {
		return store.Project{}, errors.New("no project")
	}
	return ps[0], nil
}

// firstKey is the project and API key a first start made, shown once.
type firstKey struct{ slug, key string }

// print shows the key with url, where the API is reached.
func (k *firstKey) print(out io.Writer, url string) {
	fmt.Fprintf(out, "\nCreated project %q and its API key (shown once, stored hashed):\n\n  export LIZARD_API_URL=%s LIZARD_API_KEY=%s\n\n", k.slug, url, k.key)
}

// firstStart creates the default project and its API key when the database
// has no project yet, and returns them (nil when it made none).
// LIZARD_API_KEY, when set, is the key created. Of cluster nodes starting
// together on an empty database, one creates it (the slug is unique) and
// the others go on.
func firstStart(ctx context.Context, st store.Store) (*firstKey, error) {
	ps, err := st.Projects(ctx)
	if err != nil || len(ps) > 0 {
		return nil, err
	}
	p, err := st.CreateProject(ctx, "default", "default")
	if errors.Is(err, errdefs.ErrConflict) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	key, err := st.CreateKey(ctx, p.ID, os.Getenv("LIZARD_API_KEY"))
	if err != nil {
		return nil, err
	}
	return &firstKey{slug: p.Slug, key: key}, nil
}

// listenPort is the host and the port of --listen; port 0 when the kernel
// picks it or the address does not parse (net.Listen then says why).
func listenPort(listen string) (host string, port uint16) {
	host, p, err := net.SplitHostPort(listen)
	if err != nil {
		return "", 0
	}
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil {
		return host, 0
	}
	return host, uint16(n)
}

// isWildcard says whether a listen host means every address (none,
// 0.0.0.0, ::).
func isWildcard(host string) bool {
	a, err := netip.ParseAddr(host)
	return host == "" || err == nil && a.IsUnspecified()
}

// apiURL is the URL a client on this host reaches the API at when it
// listens on listen (--listen): a wildcard host (none, 0.0.0.0, ::) is
// reached on the loopback address; an IPv6 host is bracketed.
func apiURL(listen string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		// net.Listen refuses it too, just after; say what was given.
		return "http://" + listen
	}
	if isWildcard(host) {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port)
}

func findRunsc(flagPath string) (string, error) {
	p := flagPath
	if p == "" {
		var err error
		if p, err = exec.LookPath("runsc"); err != nil {
			return "", errors.New("runsc (gVisor) is not installed: run `make deps` or pass --runsc PATH")
		}
	}
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("runsc: %w", err)
	}
	return p, nil
}

// installAgent copies lizard-agent into the data dir under a name derived
// from its content. Running sandboxes bind-mount the copy they started with,
// so a rebuilt agent never changes under them.
func installAgent(flagPath, dataDir string) (string, error) {
	src := flagPath
	if src == "" {
		self, err := os.Executable()
		if err != nil {
			return "", err
		}
		src = filepath.Join(filepath.Dir(self), "lizard-agent")
	}
	b, err := os.ReadFile(src)
	if err != nil {
		return "", fmt.Errorf("lizard-agent: %w (build it with `make build` or pass --agent)", err)
	}
	sum := sha256.Sum256(b)
	return installFile(filepath.Join(dataDir, "agent"), "lizard-agent-"+hex.EncodeToString(sum[:])[:16], b, 0o755)
}

// installCLI copies this binary, the lizard CLI, into the data dir under a
// name derived from its content, for the sandboxes to bind-mount read-only
// (at gvisor.CLIPath) as they do the agent.
func installCLI(dataDir string) (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(self)
	if err != nil {
		return "", fmt.Errorf("the lizard binary for sandboxes: %w", err)
	}
	sum := sha256.Sum256(b)
	return installFile(filepath.Join(dataDir, "cli"), "lizard-"+hex.EncodeToString(sum[:])[:16], b, 0o755)
}

// installFile writes b as dir/name, unless that file exists already, and
// returns its path. Names follow the content, so an existing file is the
// same program; sandboxes bind-mount these files, so they are never
// rewritten in place.
func installFile(dir, name string, b []byte, mode os.FileMode) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	dst := filepath.Join(dir, name)
	if _, err := os.Stat(dst); err == nil {
		return dst, nil
	}
	tmp := dst + ".tmp"
	if err := os.WriteFile(tmp, b, mode); err != nil {
		return "", err
	}
	return dst, os.Rename(tmp, dst)
}

// installCodeInterpreter installs the code-interpreter server (see
// internal/codeinterp) next to the agent.
func installCodeInterpreter(dataDir string) (string, error) {
	return installFile(filepath.Join(dataDir, "agent"), "code-interpreter-"+codeinterp.Revision()+".py", codeinterp.Program(), 0o644)
}

// processStart is when this process began (near enough: package variables
// are set before main runs).
var processStart = time.Now()

// startupSteps returns a function that logs (debug) each step of a start
// with how long it took since the one before, and the time since the
// process started.
func startupSteps(log *slog.Logger) func(name string) {
	last := time.Now()
	log.Debug("startup: configured", "took", last.Sub(processStart).Round(time.Millisecond))
	return func(name string) {
		now := time.Now()
		log.Debug("startup: "+name, "took", now.Sub(last).Round(time.Millisecond), "sinceStart", now.Sub(processStart).Round(time.Millisecond))
		last = now
	}
}
