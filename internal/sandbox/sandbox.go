// Package sandbox is the core of the sandbox service: it creates sandboxes
// from templates on a runtime.Runtime, keeps their records and statuses in
// the store and in its live table, enforces their deadlines and admission,
// runs commands and file operations through each sandbox's agent, pauses
// and resumes them when the runtime is a runtime.Checkpointer, tells of
// their lifecycle (EventSink), and after a restart reattaches to the
// sandboxes that survived or cleans up those that did not. Features are
// packages of their own under internal/sandbox/ over the seams of live.go
// (Update, Live, EachLive) and copy.go (Checkpoint, Copy and warm copies):
// snapshots, forks and pools (snapshot), moves (move), previews, the
// desktop, usage, schedules, network configurations. Its callers are the
// two APIs (internal/api, internal/e2b), the feature packages, the preview
// proxy (through the interfaces internal/proxy declares), cluster mode
// (internal/cluster) and cmd/lizard, which wires them; it knows nothing of
// HTTP.
package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/codeinterp"
	"github.com/lizard-build/lizard/internal/disk"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/network"
	"github.com/lizard-build/lizard/internal/runtime"
	"github.com/lizard-build/lizard/internal/sandbox/images"
	"github.com/lizard-build/lizard/internal/sandbox/ready"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/template"
	"github.com/lizard-build/lizard/internal/tracing"
	"github.com/lizard-build/lizard/internal/volume"
)

// Templates is what the service needs of the template registry.
type Templates interface {
	// Lookup returns template name as project sees it: a built-in one or
	// the project's own.
	Lookup(project, name string) (template.Template, error)
	// LookupVersion returns the version with digest of template name (not
	// an alias) as project sees it, current or not, brought to this node
	// if need be; errdefs.ErrNotFound when it can be had nowhere.
	LookupVersion(project, name, digest string) (template.Template, error)
}

// Volumes is what the service needs of the volume manager.
type Volumes interface {
	Attach(ctx context.Context, projectID, ref, sandboxID string) (volume.Volume, string, error)
	Detach(ctx context.Context, sandboxID string) error
	Mount(ctx context.Context, id string) error
	// Release unmounts and syncs the volumes of a paused sandbox that
	// moves to another node, where Attach with its id fetches them.
	Release(ctx context.Context, sandboxID string) error
	Reconcile(ctx context.Context, live func(sandboxID string) bool) error
}

// Config wires the service.
type Config struct {
	Runtime   runtime.Runtime
	Store     store.Store
	Templates Templates
	Volumes   Volumes
	Logger    *slog.Logger
	// SnapshotDir holds snapshot images (and forks' temporary ones).
	SnapshotDir string
	// ReadyDir holds the ready states of templates with a start command
	// (see PrepareReady); "" makes none.
	ReadyDir string
	// LogDir holds each sandbox's log; "" keeps no logs.
	LogDir string
	// LogMaxBytes caps the disk each sandbox's log takes; 0 means
	// DefaultLogMaxBytes.
	LogMaxBytes int64
	// MaxSandboxes caps live sandboxes (warm pool copies included); 0 means
	// DefaultMaxSandboxes.
	MaxSandboxes int
	// Capacity caps the vCPUs and memory the node's sandboxes reserve.
	Capacity Capacity
	// Limits returns a project's limits (see admission.go); nil: none.
	Limits func(ctx context.Context, projectID string) (store.Limits, error)
	// Disk refuses new sandboxes, pauses and snapshots when the data
	// directory's disk is low; nil: no check.
	Disk *disk.Guard
	// AgentReadyTimeout bounds the wait for a new sandbox's agent.
	AgentReadyTimeout time.Duration
	// RecoverProbeTimeout is how long recovery waits for the agent of a
	// sandbox the runtime runs before it calls the sandbox unresponsive
	// (never destroyed for it; see Recover); 0 means DefaultRecoverProbeTimeout.
	RecoverProbeTimeout time.Duration
	// Observer is told of lifecycle operations and agent round trips; nil
	// tells no one.
	Observer Observer
	// CodeInterpreterPath is the host path of the code-interpreter server
	// (internal/codeinterp), mounted read-only in the sandboxes of the
	// templates that run it (template.NeedsCodeInterpreter); "": none.
	CodeInterpreterPath string
	// Images keeps pause images and snapshots durable in an object store
	// (durable.Images); nil: they live only on this node's disk.
	Images Images
	// Region is the node's region (lizard serve --region): every sandbox
	// the node runs, and every snapshot taken here, is in it.
	Region string
	// Events is told of lifecycle events (events.go); nil tells no one.
	Events EventSink
}

// DefaultMaxSandboxes is the cap on live sandboxes unless configured.
const DefaultMaxSandboxes = 100

// Status values of a sandbox. The API shows all but creating and pooled.
const (
	StatusCreating = "creating" // being made; Recover destroys it
	StatusRunning  = "running"
	StatusPausing  = "pausing"
	StatusPaused   = "paused"
	StatusResuming = "resuming"
	StatusPooled   = "pooled" // a warm copy of a snapshot or a template, not yet claimed
	// StatusUnresponsive is shown, never stored: after a restart the
	// runtime runs the sandbox but its agent has not answered recovery's
	// probe; it is kept and probed again with backoff (recover.go).
	StatusUnresponsive = "unresponsive"
)

// MaxTimeoutMs is the largest sandbox lifetime the API accepts.
const MaxTimeoutMs = 2147483647

// Service manages sandboxes. It is safe for concurrent use.
type Service struct {
	cfg  Config
	log  *slog.Logger
	cp   runtime.Checkpointer // nil when the runtime cannot checkpoint
	fp   runtime.FilesPauser  // nil when it cannot pause keeping files only
	logs *logs

	mu         sync.Mutex
	sandboxes  map[string]*entry
	launching  map[string]string      // sandbox id → rootfs, while being made
	pinned     map[string]int         // template version directories being brought here (hereRootfs)
	pending    map[string]reservation // sandbox id → its admission, while being made
	recovering map[string]Record      // running sandboxes Recover has yet to probe
	// yielding is what the creates that made a warm copy yield need:
	// warm copies are not admitted into it.
	yielding usage
	// unresponsive are the sandboxes of recovering whose agent did not
	// answer the first probe: kept, probed again (recover.go).
	unresponsive map[string]*stalled
	moving       map[string]struct{} // orphaned sandboxes being resumed here (move.go)
	closed       bool
	bg           sync.WaitGroup
	// bgCtx is the context of background work; Close cancels it.
	bgCtx    context.Context
	bgCancel context.CancelFunc
	// images runs the uploads, removals and downloads of images in the
	// object store (internal/sandbox/images).
	images *images.Jobs
	// ready holds the ready states (package ready); nil when the runtime
	// cannot checkpoint or ReadyDir is "".
	ready *ready.States
	// keepPool says which warm copies recovery takes back (KeepPools).
	keepPool func(poolOf string) bool
	// onWarmClaimed is told of each template's warm copy a create took
	// (OnWarmClaimed).
	onWarmClaimed func(key string)
	// recovered is closed once Recover judged every sandbox (Recovered).
	recovered     chan struct{}
	recoveredOnce sync.Once
}

// entry is one live sandbox. mu serializes its lifecycle operations; the
// fields below mu are guarded by Service.mu.
type entry struct {
	mu    sync.Mutex
	rec   Record
	agent *agent.Client
	conns *agentConns
	timer *time.Timer
	gone  bool
	// since is when the sandbox last came up in the runtime (made,
	// reattached, resumed): Watch judges it only on evidence taken after.
	since time.Time
}

// Record is a sandbox as the service keeps it (and persists it as the
// store's spec column).
type Record struct {
	ID         string            `json:"id"`
	ProjectID  string            `json:"projectId"`
	Template   string            `json:"template"`
	Size       string            `json:"size"`
	CPUs       float64           `json:"cpus"`
	MemoryMB   int64             `json:"memoryMb"`
	Region     string            `json:"region,omitempty"`
	Metadata   map[string]string `json:"metadata,omitempty"`
	Envs       map[string]string `json:"envs,omitempty"`
	AgentToken string            `json:"agentToken"`
	AgentAddr  string            `json:"agentAddr"`
	// AgentVersion is the protocol version the sandbox's agent reported
	// when it last came up (see agent.ProtocolVersion); 0 in records of
	// older servers, and 1 for agents that report none.
	AgentVersion int        `json:"agentVersion,omitempty"`
	StartedAt    time.Time  `json:"startedAt"`
	EndAt        *time.Time `json:"endAt,omitempty"`
	TimeoutMs    int64      `json:"timeoutMs"`
	Status       string     `json:"status"`
	// RemainingMs is what was left of the deadline when a pause began; a
	// paused sandbox's deadline does not run. 0 with no deadline.
	RemainingMs int64  `json:"remainingMs,omitempty"`
	PauseError  string `json:"pauseError,omitempty"`
	// DurableAt is when the paused sandbox's image was made durable in the
	// object store (any node can resume it from there); nil while it is
	// only on this node's disk, and when not paused.
	DurableAt *time.Time `json:"durableAt,omitempty"`
	// SnapshotID names the snapshot the sandbox was restored from; PoolOf
	// the snapshot whose warm pool holds it (status pooled).
	SnapshotID string `json:"snapshotId,omitempty"`
	PoolOf     string `json:"poolOf,omitempty"`
	// Ports are exposed on the preview proxy; PreviewToken admits requests
	// to them, except to ports in PortTokens, which only their own token
	// admits (kept while the port is not exposed, so its URL does not
	// change).
	Ports        []int          `json:"ports,omitempty"`
	PreviewToken string         `json:"previewToken,omitempty"`
	PortTokens   map[int]string `json:"portTokens,omitempty"`
	// Desktop is the size the desktop was last started with; nil if it
	// never was.
	Desktop *DesktopSize `json:"desktop,omitempty"`
	// Egress is what the sandbox may reach outside the host.
	Egress network.Egress `json:"egress,omitempty"`
	// VolumeID is the volume attached at /workspace.
	VolumeID string `json:"volumeId,omitempty"`
	// User and Workdir are the template's defaults for commands (a
	// Dockerfile's USER and WORKDIR).
	User    string `json:"user,omitempty"`
	Workdir string `json:"workdir,omitempty"`
	// Rootfs is the template version's root filesystem the sandbox runs
	// on; a rebuild of the template keeps it while the sandbox (or a
	// snapshot of it) is there. "" in records of older servers.
	Rootfs string `json:"rootfs,omitempty"`
	// E2B: made through the E2B API. Only such sandboxes take
	// E2B-addressed proxy traffic, whose ports are public as in E2B; the
	// others keep lizard's private previews.
	E2B bool `json:"e2b,omitempty"`
	// EnvdToken is what E2B's envd in the sandbox's agent requires in
	// X-Access-Token; set only for sandboxes created with E2B's secure
	// option (otherwise envd accepts requests without one).
	EnvdToken string `json:"envdToken,omitempty"`
	// Secure: made with E2B's secure option (EnvdToken is required).
	Secure bool `json:"secure,omitempty"`
	// TrafficToken, when set, must come in E2B's traffic access token
	// header for E2B-addressed requests to the sandbox's ports (E2B's
	// network.allowPublicTraffic false); "" leaves them public to E2B
	// clients. Lizard-addressed previews keep their own tokens.
	TrafficToken string `json:"trafficToken,omitempty"`
	// MaskHost, when set, is the Host header E2B-addressed requests to the
	// sandbox's ports carry instead of the one they came with (E2B's
	// network.maskRequestHost); "${PORT}" in it stands for the port.
	MaskHost string `json:"maskRequestHost,omitempty"`
	// AutoPause pauses the sandbox at its deadline instead of killing it
	// (E2B's autoPause).
	AutoPause bool `json:"autoPause,omitempty"`
	// AutoResume: once paused, the sandbox is resumed by the first
	// authenticated request that needs it (E2B's lifecycle.autoResume;
	// internal/sandbox/preview's E2BTarget).
	AutoResume bool `json:"autoResume,omitempty"`
	// AutoPauseFiles: the pause at its deadline (AutoPause) keeps its
	// files only (PauseFiles; E2B's autoPauseMemory false).
	AutoPauseFiles bool `json:"autoPauseFiles,omitempty"`
	// FilesOnly: paused (or pausing) keeping its files only: nothing of
	// it runs or holds memory, and its resume boots it over its files.
	FilesOnly bool `json:"filesOnly,omitempty"`
}

// Wakes reports whether the sandbox is asleep and wakes by traffic: made
// with AutoResume, paused (or pausing, or resuming) with its memory. A
// files-only pause is resumed only when asked (E2B's rule: traffic would
// get a sandbox booted afresh, its processes gone).
func (r Record) Wakes() bool {
	asleep := r.Status == StatusPaused || r.Status == StatusPausing || r.Status == StatusResuming
	return r.AutoResume && asleep && !r.FilesOnly
}

// DesktopSize is a desktop's screen size in pixels (internal/sandbox/desktop
// keeps the last one started in Record.Desktop).
type DesktopSize struct {
	Width  int `json:"width"`
	Height int `json:"height"`
}

// New builds the service. Call Recover before serving.
func New(cfg Config) *Service {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.AgentReadyTimeout == 0 {
		cfg.AgentReadyTimeout = 15 * time.Second
	}
	if cfg.MaxSandboxes == 0 {
		cfg.MaxSandboxes = DefaultMaxSandboxes
	}
	if cfg.RecoverProbeTimeout == 0 {
		cfg.RecoverProbeTimeout = DefaultRecoverProbeTimeout
	}
	cp, _ := cfg.Runtime.(runtime.Checkpointer)
	fp, _ := cfg.Runtime.(runtime.FilesPauser)
	bgCtx, bgCancel := context.WithCancel(context.Background())
	s := &Service{cfg: cfg, log: cfg.Logger, cp: cp, fp: fp, logs: newLogs(cfg.LogDir, cfg.LogMaxBytes), sandboxes: map[string]*entry{},
		launching: map[string]string{}, pinned: map[string]int{},
		pending: map[string]reservation{}, recovering: map[string]Record{}, unresponsive: map[string]*stalled{}, moving: map[string]struct{}{}, bgCtx: bgCtx, bgCancel: bgCancel,
		images: images.New(cfg.Images, cfg.Logger), recovered: make(chan struct{})}
	s.ready = s.newReady()
	return s
}

// CreateRequest is a validated create.
type CreateRequest struct {
	ProjectID string
	Template  string
	Size      string
	TimeoutMs int64 // 0: no deadline
	Metadata  map[string]string
	Envs      map[string]string
	Egress    network.Egress
	// Volume names (or ids) a volume of the project to attach at /workspace.
	Volume string
	// E2B marks a sandbox made through the E2B API; Secure gives it an E2B
	// envd access token, PrivateTraffic an E2B traffic access token;
	// AutoPause pauses it at its deadline, AutoResume resumes it paused
	// by traffic (Record.AutoResume).
	E2B, Secure, PrivateTraffic, AutoPause, AutoResume bool
	// AutoPauseFiles makes AutoPause's pause keep files only
	// (Record.AutoPauseFiles); it needs AutoPause and refuses AutoResume.
	AutoPauseFiles bool
	// MaskRequestHost is Record.MaskHost (CheckMaskHost).
	MaskRequestHost string
}

// Create starts a sandbox and returns once its agent answers.
func (s *Service) Create(ctx context.Context, req CreateRequest) (_ Record, err error) {
	defer s.observe(opCreate, time.Now(), &err)
	if req.Template == "" {
		req.Template = "base"
	}
	_, tspan := tracing.Start(ctx, "template lookup")
	tpl, err := s.cfg.Templates.Lookup(req.ProjectID, req.Template)
	tracing.End(tspan, err)
	if err != nil {
		return Record{}, err
	}
	size, err := LookupSize(req.Size)
	if err != nil {
		return Record{}, err
	}
	if err := ValidTimeout(req.TimeoutMs); err != nil {
		return Record{}, err
	}
	if err := CheckEnvs("envs", req.Envs); err != nil {
		return Record{}, err
	}
	if err := CheckMetadata("metadata", req.Metadata); err != nil {
		return Record{}, err
	}
	if err := CheckMaskHost("network.maskRequestHost", req.MaskRequestHost); err != nil {
		return Record{}, err
	}
	if req.AutoPauseFiles && (!req.AutoPause || req.AutoResume) {
		return Record{}, fmt.Errorf("a files-only auto-pause needs autoPause and cannot wake by traffic (autoResume): %w", errdefs.ErrInvalid)
	}
	rec := s.newRecord(req.ProjectID, req.Template, size, req.TimeoutMs)
	rec.Metadata, rec.Envs, rec.Egress = req.Metadata, mergeEnv(tpl.Env, req.Envs), req.Egress
	rec.User, rec.Workdir, rec.Rootfs = tpl.User, tpl.Workdir, tpl.Rootfs
	rec.E2B, rec.Secure, rec.AutoPause, rec.AutoResume, rec.MaskHost = req.E2B, req.Secure, req.AutoPause, req.AutoResume, req.MaskRequestHost
	rec.AutoPauseFiles = req.AutoPauseFiles
	if req.Secure {
		rec.EnvdToken = randomToken()
	}
	if req.PrivateTraffic {
		rec.TrafficToken = randomToken()
	}
	// A warm copy of the template, booted before anyone asked, becomes
	// this sandbox when one waits (warm.go); a volume changes the
	// sandbox's mounts, which only a boot can give.
	if req.Volume == "" {
		if out, ok := s.claimWarm(ctx, rec, tpl); ok {
			return out, nil
		}
	}
	out, err := s.boot(ctx, rec, tpl, size, req.Volume)
	if errors.Is(err, errdefs.ErrCapacity) {
		out, err = s.bootInPlaceOfWarm(ctx, rec, tpl, size, req.Volume, err)
	}
	return out, err
}

// bootInPlaceOfWarm boots rec, which the node had no room for (err), in
// place of a warm copy: warm copies yield to the sandboxes asked for. One
// copy goes and the boot is tried again; until it is done, the pools'
// refills do not take the room it needs (reserve).
func (s *Service) bootInPlaceOfWarm(ctx context.Context, rec Record, tpl template.Template, size Size, volume string, err error) (Record, error) {
	need := holds(StatusRunning, rec.CPUs, rec.MemoryMB)
	s.mu.Lock()
	s.yielding.add(need)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.yielding.sub(need)
		s.mu.Unlock()
	}()
	if !s.dropWarm(ctx) {
		return Record{}, err
	}
	rec.ID = store.NewID("", 20)
	return s.boot(ctx, rec, tpl, size, volume)
}

// boot makes rec a new sandbox of tpl at size with volume ("" for none)
// at /workspace: from the template's ready state when it has a start
// command, else booted afresh (and its start command started).
func (s *Service) boot(ctx context.Context, rec Record, tpl template.Template, size Size, volume string) (_ Record, err error) {
	// A template with a start command starts from its ready state: the
	// command already running. A volume changes the sandbox's mounts, which
	// a restore cannot, so those boot and start the command.
	if len(tpl.StartCommand) > 0 && volume == "" && s.ready != nil {
		if _, _, ok := s.ready.Lookup(tpl, size.Name); !ok && tpl.OnDemand {
			// Its first create makes the state and waits; one that
			// fails boots and starts the command as below.
			if _, err := s.PrepareReady(ctx, tpl, size.Name, nil); err != nil {
				s.log.Warn("ready state on demand", "template", tpl.Name, "size", size.Name, "err", err)
			}
		}
		out, done, err := s.createFromReady(ctx, rec, tpl, size)
		if done {
			return out, err
		}
		rec.ID = store.NewID("", 20)
	}
	rec, err = s.launch(ctx, rec, func(ctx context.Context, rec *Record) (runtime.Sandbox, error) {
		mounts, err := s.attachVolume(ctx, rec, volume)
		if err != nil {
			return runtime.Sandbox{}, err
		}
		rsb, err := s.cfg.Runtime.Create(ctx, runtime.Spec{
			ID: rec.ID, Rootfs: tpl.Rootfs, AgentToken: rec.AgentToken, Resources: size.resources(), Egress: rec.Egress,
			Mounts: s.mounts(tpl.Name, mounts), Start: true,
		})
		if err != nil {
			return rsb, fmt.Errorf("create sandbox: %w", err)
		}
		return rsb, nil
	}, rec.AgentToken)
	if err == nil && len(tpl.StartCommand) > 0 {
		s.startCommand(ctx, rec, tpl.StartCommand)
	}
	return rec, err
}

// startCommand starts the template's start command (a Dockerfile's
// CMD/ENTRYPOINT) in the background of a new sandbox, as the template's
// user in its workdir (see ready.StartArgv), when the template has no ready state
// for the sandbox. A command that does not start is in the sandbox's log;
// the sandbox is there either way.
func (s *Service) startCommand(ctx context.Context, rec Record, argv []string) {
	var pid strings.Builder
	err := s.Exec(ctx, rec.ProjectID, rec.ID, ExecRequest{Cmd: ready.StartArgv(argv), TimeoutMs: 30_000}, func(ev agent.Event) error {
		if ev.Line != nil && ev.Stream == "stdout" {
			pid.WriteString(*ev.Line)
		}
		return nil
	})
	if err != nil {
		s.logs.event(rec.ID, "start command %q did not start: %v", strings.Join(argv, " "), err)
		return
	}
	s.logs.event(rec.ID, "start command %q started (pid %s)", strings.Join(argv, " "), pid.String())
}

// newRecord fills what every new sandbox record has.
func (s *Service) newRecord(projectID, tpl string, size Size, timeoutMs int64) Record {
	now := time.Now().UTC()
	return Record{
		ID: store.NewID("", 20), ProjectID: projectID, Template: tpl, Region: s.cfg.Region,
		Size: size.Name, CPUs: size.CPUs, MemoryMB: size.MemoryMB,
		AgentToken: randomToken(), StartedAt: now, TimeoutMs: timeoutMs,
		EndAt: deadline(now, timeoutMs), Status: StatusRunning,
	}
}

// giveEnvdToken tells the agent's envd the token it must require in
// X-Access-Token (when secure) and the command defaults E2B clients get
// (the template's user and workdir, the sandbox's envs): a copy restored
// from a snapshot or a ready state wakes up with the envd of the sandbox
// it was taken from. Resume keeps the agent's memory, envd's included.
// Only E2B sandboxes get envd traffic.
func giveEnvdToken(ctx context.Context, ag *agent.Client, rec Record) error {
	if !rec.E2B {
		return nil
	}
	err := ag.SetEnvd(ctx, agent.EnvdRequest{
		Token: rec.EnvdToken, Secure: rec.Secure,
		User: rec.User, Workdir: rec.Workdir, Env: rec.Envs,
	})
	if err != nil {
		return fmt.Errorf("configuring the sandbox's envd: %w", err)
	}
	return nil
}

// ValidTimeout refuses a sandbox lifetime the API does not take.
func ValidTimeout(ms int64) error {
	if ms < 0 || ms > MaxTimeoutMs {
		return fmt.Errorf("timeoutMs %d: must be 0 (no deadline) to %d: %w", ms, MaxTimeoutMs, errdefs.ErrInvalid)
	}
	return nil
}

// launch records rec as creating, runs boot to bring the runtime sandbox
// up, waits for its agent (which answers to bootToken, then gets rec's
// token if they differ) and publishes the sandbox. Any failure destroys
// what was made.
func (s *Service) launch(ctx context.Context, rec Record, boot func(context.Context, *Record) (runtime.Sandbox, error), bootToken string) (Record, error) {
	rec, err := s.start(ctx, rec, boot, bootToken, func(ctx context.Context, id string) { s.destroy(ctx, id) })
	if err == nil {
		detail := "template " + rec.Template
		if rec.SnapshotID != "" {
			detail = "snapshot " + rec.SnapshotID
		}
		s.emit(EventCreated, rec, causeOf(ctx), detail)
	}
	return rec, err
}

// start is launch with undo to run on a failure after rec was recorded
// (launch's destroys the sandbox).
func (s *Service) start(ctx context.Context, rec Record, boot func(context.Context, *Record) (runtime.Sandbox, error), bootToken string,
	undo func(ctx context.Context, id string)) (Record, error) {
	if err := s.cfg.Disk.Check(); err != nil {
		return Record{}, err
	}
	release, err := s.reserve(ctx, rec)
	if err != nil {
		return Record{}, err
	}
	defer release()
	defer s.booting(rec.ID, rec.Rootfs)()
	want := rec.Status
	rec.Status = StatusCreating
	if err := s.persist(ctx, rec); err != nil {
		return Record{}, err
	}
	fail := func(err error) (Record, error) {
		undo(context.WithoutCancel(ctx), rec.ID)
		return Record{}, err
	}
	began := time.Now()
	rsb, err := boot(ctx, &rec)
	if err != nil {
		return fail(err)
	}
	booted := time.Now()
	rec.AgentAddr = rsb.Agent.String()
	ag, conns := newAgent(rec.AgentAddr, bootToken)
	if err := waitReady(ctx, ag, s.agentWait(booted.Sub(began))); err != nil {
		return fail(fmt.Errorf("sandbox agent did not come up: %w", err))
	}
	s.log.Debug("sandbox up", "sandbox", rec.ID, "boot", booted.Sub(began), "agent", time.Since(booted), "agentVersion", ag.Version())
	rec.AgentVersion = ag.Version()
	if bootToken != rec.AgentToken {
		if err := ag.SetToken(ctx, rec.AgentToken); err != nil {
			return fail(fmt.Errorf("give the copy its own agent token: %w", err))
		}
	}
	if err := giveEnvdToken(ctx, ag, rec); err != nil {
		return fail(err)
	}
	rec.Status = want
	if err := s.persist(ctx, rec); err != nil {
		return fail(err)
	}
	e := &entry{rec: rec, agent: ag, conns: conns, since: began}
	s.mu.Lock()
	s.sandboxes[rec.ID] = e
	delete(s.pending, rec.ID) // held by the live sandbox now
	s.armLocked(e)
	s.mu.Unlock()
	s.log.Info("sandbox started", "sandbox", rec.ID, "project", rec.ProjectID, "template", rec.Template,
		"size", rec.Size, "snapshot", rec.SnapshotID, "status", rec.Status)
	if rec.SnapshotID != "" {
		s.logs.event(rec.ID, "created from snapshot %s (template %s, size %s)", rec.SnapshotID, rec.Template, rec.Size)
	} else {
		s.logs.event(rec.ID, "created (template %s, size %s)", rec.Template, rec.Size)
	}
	return rec, nil
}

// UsesRootfs reports whether a sandbox of the server runs on (or is being
// made or restored onto) the template root filesystem rootfs, so that a
// template version is kept while it does (the snapshots' versions are
// their package's to report).
func (s *Service) UsesRootfs(rootfs string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.sandboxes {
		if e.rec.Rootfs == rootfs {
			return true
		}
	}
	for _, r := range s.launching {
		if r == rootfs {
			return true
		}
	}
	for _, rec := range s.recovering {
		if rec.Rootfs == rootfs {
			return true
		}
	}
	return s.pinned[filepath.Base(filepath.Dir(rootfs))] > 0
}

// booting counts sandbox id as using rootfs until the returned func is
// called (see UsesRootfs): a sandbox being made is not in the live set yet.
func (s *Service) booting(id, rootfs string) func() {
	s.mu.Lock()
	s.launching[id] = rootfs
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		delete(s.launching, id)
		s.mu.Unlock()
	}
}

// mounts are the mounts of a sandbox of template tpl (a name or alias):
// the template's own, then the volume's, vol. Every runtime.Spec is built
// with them (create, ready states, restores of snapshots and ready states,
// warm copies, forks): runsc restore refuses a spec whose mounts are not
// the checkpoint's, so a template's sandboxes and their checkpoints must
// always get the same ones, and no other sandbox gets them.
func (s *Service) mounts(tpl string, vol []runtime.Mount) []runtime.Mount {
	var out []runtime.Mount
	if s.cfg.CodeInterpreterPath != "" && template.NeedsCodeInterpreter(tpl) {
		out = append(out, runtime.Mount{Source: s.cfg.CodeInterpreterPath, Destination: codeinterp.SandboxPath, ReadOnly: true})
	}
	return append(out, vol...)
}

// attachVolume attaches the volume ref (if any) to rec and returns its
// mount. The volume is detached again by destroy, on any failure after.
func (s *Service) attachVolume(ctx context.Context, rec *Record, ref string) ([]runtime.Mount, error) {
	if ref == "" {
		return nil, nil
	}
	if s.cfg.Volumes == nil {
		return nil, errdefs.WithCode("feature_unavailable", fmt.Errorf("volumes: this server has none: %w", errdefs.ErrInvalid))
	}
	v, dir, err := s.cfg.Volumes.Attach(ctx, rec.ProjectID, ref, rec.ID)
	if err != nil {
		return nil, err
	}
	rec.VolumeID = v.ID
	return []runtime.Mount{{Source: dir, Destination: volume.MountPath}}, nil
}

// waitReady polls the agent's health until it answers or the time is up.
// agentWait is how long a sandbox that took boot to create and start may
// take for its agent to answer: AgentReadyTimeout, or three times boot when
// the host is that loaded (a boot of seconds is a host whose CPUs are
// taken, where the agent's own start is as slow).
func (s *Service) agentWait(boot time.Duration) time.Duration {
	return max(s.cfg.AgentReadyTimeout, 3*boot)
}

func waitReady(ctx context.Context, ag *agent.Client, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	// A new agent answers some 15–40 ms after its sandbox starts: poll
	// every few milliseconds at first, then back off.
	start, delay := time.Now(), time.Millisecond
	for {
		hctx, hcancel := context.WithTimeout(ctx, time.Second)
		_, err := ag.Health(hctx)
		hcancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			if !errors.Is(err, errdefs.ErrUnavailable) {
				err = fmt.Errorf("%v: %w", err, errdefs.ErrUnavailable)
			}
			return err
		case <-time.After(delay):
		}
		switch {
		case time.Since(start) > 5*time.Second:
			// A long wait (recovery of a busy sandbox): back off to 1 s.
			delay = min(2*delay, time.Second)
		case time.Since(start) > 500*time.Millisecond:
			delay = 50 * time.Millisecond
		case delay < 4*time.Millisecond:
			delay *= 2
		}
	}
}

// Holds reports whether this service runs, has paused or is recovering
// sandbox id (of any project): cluster routing checks an owner it cached
// as this node against it, since a sandbox this node let go (drain --move)
// lives elsewhere by now.
func (s *Service) Holds(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.sandboxes[id]; ok && !e.gone && e.rec.Status != StatusPooled {
		return true
	}
	_, ok := s.recovering[id]
	return ok
}

// Get returns the sandbox if it belongs to the project.
func (s *Service) Get(projectID, id string) (Record, error) {
	if rec, ok := s.stalledRecord(projectID, id); ok {
		return rec, nil
	}
	e, err := s.lookup(projectID, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		// A paused sandbox whose node went, which any node may resume.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if rec, ok := s.orphan(ctx, projectID, id); ok {
			return rec, nil
		}
	}
	if err != nil {
		return Record{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return e.rec, nil
}

// List returns the project's sandboxes, oldest first; those recovery has
// yet to reattach as their record has them.
func (s *Service) List(projectID string) []Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []Record{}
	for _, e := range s.sandboxes {
		if e.rec.ProjectID == projectID && e.rec.Status != StatusPooled {
			out = append(out, e.rec)
		}
	}
	for _, rec := range s.recovering {
		if rec.ProjectID == projectID && rec.Status != StatusPooled {
			if _, stuck := s.unresponsive[rec.ID]; stuck {
				rec.Status = StatusUnresponsive
			}
			out = append(out, rec)
		}
	}
	sortRecords(out)
	return out
}

// LifecycleTimeout bounds a kill, pause, resume or snapshot once begun.
const LifecycleTimeout = 5 * time.Minute

// detach is the context of a lifecycle operation: it runs to its end (or
// LifecycleTimeout) whatever the client does, since one cut short by a
// client hanging up would leave a sandbox half-destroyed or half-saved.
func detach(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), LifecycleTimeout)
}

// Kill destroys the sandbox and frees everything it held.
func (s *Service) Kill(ctx context.Context, projectID, id string) (err error) {
	defer s.observe(opKill, time.Now(), &err)
	ctx, cancel := detach(ctx)
	defer cancel()
	if done, err := s.killStalled(ctx, projectID, id); done {
		return err
	}
	e, err := s.lookup(projectID, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		if rec, ok := s.orphan(ctx, projectID, id); ok {
			return s.killOrphan(ctx, rec)
		}
	}
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if !s.take(e) {
		return NotFound(id)
	}
	s.log.Info("sandbox killed", "sandbox", id)
	s.logs.event(id, "killed")
	s.emit(EventKilled, s.recordOf(e), causeOf(ctx), "")
	return s.destroy(ctx, id)
}

// SetTimeout moves the sandbox's deadline to timeoutMs from now (from the
// resume, for a paused sandbox).
func (s *Service) SetTimeout(ctx context.Context, projectID, id string, timeoutMs int64) error {
	if timeoutMs < 1000 || timeoutMs > MaxTimeoutMs {
		return fmt.Errorf("timeoutMs %d: must be 1000 to %d: %w", timeoutMs, MaxTimeoutMs, errdefs.ErrInvalid)
	}
	e, err := s.lockLive(projectID, id)
	if err != nil {
		return err
	}
	defer e.mu.Unlock()
	e.rec.TimeoutMs = timeoutMs
	if e.rec.Status == StatusPaused {
		e.rec.RemainingMs = timeoutMs
	} else {
		e.rec.EndAt = deadline(time.Now().UTC(), timeoutMs)
		s.armLocked(e)
	}
	rec := e.rec
	s.mu.Unlock()
	return s.persist(ctx, rec)
}

// Agent returns the agent client of a running sandbox, for commands and
// files. A paused sandbox is a conflict: it has no processes to talk to.
func (s *Service) Agent(projectID, id string) (*agent.Client, Record, error) {
	e, err := s.lookup(projectID, id)
	if err != nil {
		return nil, Record{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if e.rec.Status != StatusRunning {
		return nil, Record{}, errdefs.WithCode("sandbox_not_running",
			fmt.Errorf("sandbox %q is %s: resume it first: %w", id, e.rec.Status, errdefs.ErrConflict))
	}
	return e.agent, e.rec, nil
}

// Wake is Agent for a request that needs the sandbox: one made with
// AutoResume that is paused (or pausing, or resuming) is resumed first,
// the resume caused by traffic (one resume however many ask at once:
// Resume waits for the one under way).
func (s *Service) Wake(ctx context.Context, projectID, id string) (*agent.Client, Record, error) {
	e, err := s.lookup(projectID, id)
	if err != nil {
		return nil, Record{}, err
	}
	s.mu.Lock()
	asleep := e.rec.Wakes()
	s.mu.Unlock()
	if asleep {
		if _, err := s.Resume(WithCause(ctx, CauseTraffic), projectID, id); err != nil {
			return nil, Record{}, err
		}
	}
	return s.Agent(projectID, id)
}

func (s *Service) lookup(projectID, id string) (*entry, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.sandboxes[id]
	if !ok || e.gone || e.rec.ProjectID != projectID || e.rec.Status == StatusPooled {
		if rec, ok := s.recovering[id]; ok && rec.ProjectID == projectID && rec.Status != StatusPooled {
			if _, stuck := s.unresponsive[id]; stuck {
				return nil, unresponsiveErr(id)
			}
			return nil, recoveringErr(id)
		}
		return nil, NotFound(id)
	}
	return e, nil
}

// lockLive finds the project's sandbox for a change of its record: it
// returns with the entry's lifecycle lock and s.mu held, the entry still
// live (not killed while the caller waited for the lock). The caller
// unlocks s.mu once done with the record, and e.mu at the end.
func (s *Service) lockLive(projectID, id string) (*entry, error) {
	e, err := s.lookup(projectID, id)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	s.mu.Lock()
	if e.gone {
		s.mu.Unlock()
		e.mu.Unlock()
		return nil, NotFound(id)
	}
	return e, nil
}

// NotFound is the error of a sandbox id that is not there (or not the
// project's).
func NotFound(id string) error {
	return errdefs.WithCode("sandbox_not_found", fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound))
}

// take removes e from the live set; false if someone else did first.
func (s *Service) take(e *entry) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e.gone {
		return false
	}
	e.gone = true
	if e.timer != nil {
		e.timer.Stop()
	}
	if e.conns != nil {
		if n := e.conns.cut(); n > 0 {
			s.log.Debug("sandbox connections cut", "sandbox", e.rec.ID, "conns", n, "why", "gone")
		}
	}
	delete(s.sandboxes, e.rec.ID)
	return true
}

// destroy frees the runtime sandbox and forgets the record. The record goes
// only once the runtime let go, so a failure is retried by Recover.
func (s *Service) destroy(ctx context.Context, id string) error {
	return s.destroyKeeping(ctx, id, false)
}

// destroyKeeping is destroy that leaves the sandbox's durable pause image
// in the object store when keepImage: another node may resume it.
func (s *Service) destroyKeeping(ctx context.Context, id string, keepImage bool) error {
	if err := s.cfg.Runtime.Destroy(ctx, id); err != nil {
		s.log.Error("destroy sandbox", "sandbox", id, "err", err)
		return fmt.Errorf("destroy sandbox %q: %w", id, err)
	}
	s.logs.remove(id)
	if keepImage {
		s.images.StopUpload(PauseImageName(id))
	} else {
		s.images.Drop(PauseImageName(id))
	}
	if s.cfg.Volumes != nil {
		if err := s.cfg.Volumes.Detach(ctx, id); err != nil {
			s.log.Error("detach volume", "sandbox", id, "err", err)
			return fmt.Errorf("detach the volume of sandbox %q: %w", id, err)
		}
	}
	return s.cfg.Store.DeleteSandbox(ctx, id)
}

// armLocked (re)starts e's deadline timer. Caller holds s.mu.
func (s *Service) armLocked(e *entry) {
	if e.timer != nil {
		e.timer.Stop()
		e.timer = nil
	}
	if e.rec.EndAt == nil || e.rec.Status == StatusPaused || e.rec.Status == StatusPooled {
		return
	}
	id := e.rec.ID
	e.timer = time.AfterFunc(time.Until(*e.rec.EndAt), func() { s.expire(id, e) })
}

// expire kills a sandbox whose deadline passed, or pauses it when it was
// made with AutoPause; a resume then gives it its whole timeout again, as
// E2B does.
func (s *Service) expire(id string, e *entry) {
	s.mu.Lock()
	autoPause := !e.gone && e.rec.AutoPause && s.cp != nil
	files := e.rec.AutoPauseFiles
	projectID := e.rec.ProjectID
	s.mu.Unlock()
	if autoPause && s.due(e) {
		s.log.Info("sandbox timed out: pausing it (autoPause)", "sandbox", id)
		s.logs.event(id, "timed out: pausing")
		err := s.pause(context.Background(), projectID, id, true, files)
		if err == nil || errors.Is(err, errdefs.ErrNotFound) {
			return
		}
		s.log.Error("autoPause failed: the sandbox is killed", "sandbox", id, "err", err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if !s.due(e) || !s.take(e) {
		return
	}
	s.log.Info("sandbox timed out", "sandbox", id)
	s.logs.event(id, "timed out")
	s.emit(EventTimedOut, s.recordOf(e), CauseTimeout, "killed at its deadline")
	s.destroy(context.Background(), id)
}

// due reports whether e is running past its deadline.
func (s *Service) due(e *entry) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !e.gone && e.rec.EndAt != nil && e.rec.Status == StatusRunning && !time.Now().Before(*e.rec.EndAt)
}

// persist stores rec; a template's warm copy (unowned) is not stored.
func (s *Service) persist(ctx context.Context, rec Record) error {
	if unowned(rec) {
		return nil
	}
	spec, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	ctx, span := tracing.Start(ctx, "store put sandbox", tracing.SandboxID.String(rec.ID))
	err = s.cfg.Store.PutSandbox(ctx, store.Sandbox{
		ID: rec.ID, ProjectID: rec.ProjectID, Template: rec.Template, Size: rec.Size,
		Status: rec.Status, Spec: spec, StartedAt: rec.StartedAt, EndAt: rec.EndAt,
		PauseError: rec.PauseError, CPUs: rec.CPUs, MemoryMB: rec.MemoryMB,
	})
	tracing.End(span, err)
	return err
}

// goLocked runs fn in the background with the service's background
// context, which Close cancels and then waits for fn; nothing runs once the
// service is closing. The caller holds s.mu.
func (s *Service) goLocked(fn func(ctx context.Context)) {
	if s.closed {
		return
	}
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		fn(s.bgCtx)
	}()
}

// Close stops deadline timers and background work; sandboxes keep running
// for the next server.
func (s *Service) Close() {
	s.mu.Lock()
	s.closed = true
	for _, e := range s.sandboxes {
		if e.timer != nil {
			e.timer.Stop()
		}
	}
	s.mu.Unlock()
	s.bgCancel()
	// Before the wait: background work may be waiting for an upload
	// (StopUpload), which only a cancel ends.
	s.images.Close()
	s.bg.Wait()
}

func deadline(from time.Time, timeoutMs int64) *time.Time {
	if timeoutMs == 0 {
		return nil
	}
	t := from.Add(time.Duration(timeoutMs) * time.Millisecond)
	return &t
}

func randomToken() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// mergeEnv lays the create-time envs over the template's default env.
func mergeEnv(tplEnv []string, envs map[string]string) map[string]string {
	if len(tplEnv) == 0 && len(envs) == 0 {
		return nil
	}
	out := template.EnvMap(tplEnv)
	for k, v := range envs {
		out[k] = v
	}
	return out
}

// DestroyLost destroys every sandbox of this server that keep rejects, as
// a kill does, and returns their ids: a cluster node that was declared
// dead or removed while it ran them (their rows were marked lost) calls it
// when it learns so (internal/cluster). Sandboxes still being recovered
// are left to recovery.
func (s *Service) DestroyLost(ctx context.Context, keep func(id string) bool) []string {
	s.mu.Lock()
	var lost []*entry
	for id, e := range s.sandboxes {
		if !keep(id) {
			lost = append(lost, e)
		}
	}
	s.mu.Unlock()
	var ids []string
	for _, e := range lost {
		e.mu.Lock()
		if s.take(e) {
			s.mu.Lock()
			// A durable paused sandbox was not lost: it is orphaned, and
			// another node resumes it from its image.
			durable := e.rec.Status == StatusPaused && e.rec.DurableAt != nil
			s.mu.Unlock()
			s.log.Warn("sandbox lost with this node's membership, destroying", "sandbox", e.rec.ID, "durable", durable)
			s.logs.event(e.rec.ID, "lost: this node was declared dead")
			if !durable {
				s.emit(EventDied, s.recordOf(e), "", "lost: its node was declared dead")
			}
			s.destroyKeeping(ctx, e.rec.ID, durable)
			ids = append(ids, e.rec.ID)
		}
		e.mu.Unlock()
	}
	return ids
}
