package schedule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/events"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/store"
)

// Core is what schedules need of the sandbox service (*sandbox.Service).
type Core interface {
	// Get finds a project's sandbox (paused ones too).
	Get(projectID, id string) (sandbox.Record, error)
	// Live reads a sandbox of this node's live table.
	Live(id string) (sandbox.Record, bool)
	Exec(ctx context.Context, projectID, id string, req sandbox.ExecRequest, onEvent func(agent.Event) error) error
	Pause(ctx context.Context, projectID, id string) error
	PauseFiles(ctx context.Context, projectID, id string) error
	Resume(ctx context.Context, projectID, id string) (sandbox.Record, error)
}

var _ Core = (*sandbox.Service)(nil)

// Config wires the schedules.
type Config struct {
	Core  Core
	Store store.Schedules
	// Limits are a project's limits (its schedules, and per sandbox);
	// nil: none.
	Limits func(ctx context.Context, projectID string) (store.Limits, error)
	// Node names this node in cluster mode ("" on a single server), and
	// Fence is its current incarnation, which every claim and run
	// update carries (nil on a single server).
	Node  string
	Fence func() store.Fence
	// Poll is how often the store is asked for due schedules (default
	// DefaultPoll).
	Poll time.Duration
	// Runs is told of each run that ended (the event log); nil: no one.
	Runs   RunEvents
	Logger *slog.Logger
}

// RunEvents is told of the runs that end (*events.Log): it must return
// at once.
type RunEvents interface {
	ScheduleRunFinished(events.ScheduleRun)
}

// DefaultPoll is how often a node looks for due schedules.
const DefaultPoll = time.Second

// DisableAfter is how many runs in a row may fail before a schedule
// switches itself off (disabledReason says so; runSchedule or an update
// with enabled: true switches it back on).
const DisableAfter = 5

// OutputCap is how much of a run's output its record keeps: the last
// OutputCap bytes of stdout and stderr as they came, interleaved.
const OutputCap = 64 << 10

// Service keeps schedules and runs them.
type Service struct {
	cfg Config
	log *slog.Logger

	mu    sync.Mutex
	awake map[string]*hold // sandbox id → the runs holding it awake
	wg    sync.WaitGroup
}

// New makes the schedules' service; Run starts running them.
func New(cfg Config) *Service {
	if cfg.Poll <= 0 {
		cfg.Poll = DefaultPoll
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Service{cfg: cfg, log: cfg.Logger, awake: map[string]*hold{}}
}

// View is a schedule as the API answers it (the SDK's SandboxSchedule).
type View struct {
	ID                  string     `json:"id"`
	SandboxID           string     `json:"sandboxId"`
	Name                *string    `json:"name"`
	Every               *string    `json:"every"`
	EverySeconds        *int64     `json:"everySeconds"`
	Cron                *string    `json:"cron"`
	Timezone            string     `json:"timezone"`
	Kind                string     `json:"kind"`
	Prompt              *string    `json:"prompt"`
	Command             *string    `json:"command"`
	Agent               *string    `json:"agent"`
	Model               *string    `json:"model"`
	ReasoningEffort     *string    `json:"reasoningEffort"`
	TimeoutSeconds      int        `json:"timeoutSeconds"`
	KeepMemory          bool       `json:"keepMemory"`
	Enabled             bool       `json:"enabled"`
	DisabledReason      *string    `json:"disabledReason"`
	NextRunAt           *time.Time `json:"nextRunAt"`
	Running             bool       `json:"running"`
	LastRunAt           *time.Time `json:"lastRunAt"`
	LastStatus          *string    `json:"lastStatus"`
	ConsecutiveFailures int        `json:"consecutiveFailures"`
	SkippedCount        int        `json:"skippedCount"`
	CreatedAt           time.Time  `json:"createdAt"`
}

// RunView is a run as the API answers it (the SDK's SandboxScheduleRun).
type RunView struct {
	ID             string     `json:"id"`
	ScheduleID     string     `json:"scheduleId"`
	SandboxID      string     `json:"sandboxId"`
	Status         string     `json:"status"`
	Woke           bool       `json:"woke"`
	Slept          bool       `json:"slept"`
	DueAt          time.Time  `json:"dueAt"`
	StartedAt      time.Time  `json:"startedAt"`
	EndedAt        *time.Time `json:"endedAt"`
	Finished       bool       `json:"finished"`
	DurationMs     *int64     `json:"durationMs"`
	ExitCode       *int       `json:"exitCode"`
	PromptID       *string    `json:"promptId"`
	ConversationID *string    `json:"conversationId"`
	Output         *string    `json:"output"`
	Error          *string    `json:"error"`
}

func orNil[T comparable](v T) *T {
	var zero T
	if v == zero {
		return nil
	}
	return &v
}

func viewOf(sc store.Schedule) View {
	var s Spec
	_ = json.Unmarshal(sc.Spec, &s) // written by this package
	v := View{ID: sc.ID, SandboxID: sc.SandboxID, Name: orNil(s.Name), Every: orNil(s.Every), EverySeconds: orNil(s.EverySeconds),
		Cron: orNil(s.Cron), Timezone: s.Timezone, Kind: s.Kind(), Prompt: orNil(s.Prompt), Command: orNil(s.Command),
		Agent: orNil(s.Agent), Model: orNil(s.Model), ReasoningEffort: orNil(s.ReasoningEffort), TimeoutSeconds: s.TimeoutSeconds,
		KeepMemory: true, Enabled: sc.Enabled, DisabledReason: orNil(sc.DisabledReason), NextRunAt: sc.NextRunAt,
		Running: sc.Running, LastRunAt: sc.LastRunAt, LastStatus: orNil(sc.LastStatus),
		ConsecutiveFailures: sc.ConsecutiveFailures, SkippedCount: sc.SkippedCount, CreatedAt: sc.CreatedAt}
	if sc.RunRequested != nil && sc.Enabled {
		v.NextRunAt = sc.RunRequested
	}
	return v
}

func runViewOf(r store.ScheduleRun) RunView {
	return RunView{ID: r.ID, ScheduleID: r.ScheduleID, SandboxID: r.SandboxID, Status: r.Status, Woke: r.Woke, Slept: r.Slept,
		DueAt: r.Due, StartedAt: r.StartedAt, EndedAt: r.EndedAt, Finished: r.EndedAt != nil, DurationMs: r.DurationMs,
		ExitCode: r.ExitCode, Output: orNil(r.Output), Error: orNil(r.Error)}
}

// Create adds a schedule to a project's sandbox from the body p.
func (s *Service) Create(ctx context.Context, projectID, sandboxID string, p Patch) (View, error) {
	rec, err := s.cfg.Core.Get(projectID, sandboxID)
	if err != nil {
		return View{}, err
	}
	now := time.Now().UTC()
	spec, enabled, err := p.Apply(Spec{}, true, now)
	if err != nil {
		return View{}, err
	}
	if err := s.checkAgent(ctx, rec, &spec); err != nil {
		return View{}, err
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return View{}, err
	}
	sc := store.Schedule{ID: store.NewID("sch_", 16), ProjectID: projectID, SandboxID: sandboxID, Spec: b, Enabled: enabled, CreatedAt: now}
	if enabled {
		next := spec.Next(now)
		sc.NextRunAt = &next
	}
	var lim store.Limits
	if s.cfg.Limits != nil {
		if lim, err = s.cfg.Limits(ctx, projectID); err != nil {
			return View{}, err
		}
	}
	if err := s.cfg.Store.InsertSchedule(ctx, sc, lim.SchedulesPerSandbox, lim.Schedules); err != nil {
		return View{}, err
	}
	s.log.Info("schedule created", "schedule", sc.ID, "sandbox", sandboxID, "kind", spec.Kind(), "every", spec.Every, "cron", spec.Cron, "timezone", spec.Timezone)
	return viewOf(sc), nil
}

// checkAgent resolves a prompt schedule's agent (the template's when it
// names none) and refuses one the sandbox lacks: a running sandbox is
// asked; a paused one is judged by its template when that is an agent's
// (a run finds out otherwise, and fails naming it).
func (s *Service) checkAgent(ctx context.Context, rec sandbox.Record, spec *Spec) error {
	if spec.Prompt == "" {
		return nil
	}
	if spec.Agent == "" {
		spec.Agent = DefaultAgent(rec.Template)
	}
	if spec.Agent == "" {
		return invalid("agent", "template %q has no coding agent of its own: give agent (%v), or use the claude or codex template", rec.Template, AgentNames())
	}
	lacks := errdefs.WithCode("agent_not_found", invalid("agent", "%q is not installed in sandbox %s (template %s): use the %s template, or install it",
		spec.Agent, rec.ID, rec.Template, agents[spec.Agent].template))
	switch rec.Status {
	case sandbox.StatusRunning:
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		code := -1
		err := s.cfg.Core.Exec(ctx, rec.ProjectID, rec.ID, sandbox.ExecRequest{Cmd: []string{agentProbe(spec.Agent)}, Shell: true, User: "root",
			TimeoutMs: 20_000}, func(ev agent.Event) error {
			if ev.ExitCode != nil {
				code = *ev.ExitCode
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("check agent %s in sandbox %s: %w", spec.Agent, rec.ID, err)
		}
		if code != 0 {
			return lacks
		}
	case sandbox.StatusPaused:
		if d := DefaultAgent(rec.Template); d != "" && d != spec.Agent {
			return lacks
		}
	}
	return nil
}

// find returns a project's schedule; another project's is not found.
func (s *Service) find(ctx context.Context, projectID, id string) (store.Schedule, error) {
	sc, err := s.cfg.Store.Schedule(ctx, id)
	if err == nil && sc.ProjectID != projectID {
		return store.Schedule{}, store.ScheduleNotFound(id)
	}
	return sc, err
}

// Get returns a project's schedule.
func (s *Service) Get(ctx context.Context, projectID, id string) (View, error) {
	sc, err := s.find(ctx, projectID, id)
	if err != nil {
		return View{}, err
	}
	return viewOf(sc), nil
}

// List lists a project's schedules, or one sandbox's.
func (s *Service) List(ctx context.Context, projectID, sandboxID string) ([]View, error) {
	l, err := s.cfg.Store.Schedules(ctx, projectID, sandboxID)
	return mapped(l, viewOf), err
}

// mapped is l with f applied to each element (nil for nil).
func mapped[T, V any](l []T, f func(T) V) []V {
	if l == nil {
		return nil
	}
	out := make([]V, 0, len(l))
	for _, v := range l {
		out = append(out, f(v))
	}
	return out
}

// OfSandbox lists a project's sandbox's schedules; an unknown sandbox is
// not found.
func (s *Service) OfSandbox(ctx context.Context, projectID, sandboxID string) ([]View, error) {
	if _, err := s.cfg.Core.Get(projectID, sandboxID); err != nil {
		return nil, err
	}
	return s.List(ctx, projectID, sandboxID)
}

// Update changes a schedule's settings with the body p. A change of when
// it runs, or switching it on, sets its next due time anew; switching it
// on clears its failures.
func (s *Service) Update(ctx context.Context, projectID, id string, p Patch) (View, error) {
	sc, err := s.find(ctx, projectID, id)
	if err != nil {
		return View{}, err
	}
	var old Spec
	if err := json.Unmarshal(sc.Spec, &old); err != nil {
		return View{}, fmt.Errorf("schedule %s: %w", id, err)
	}
	now := time.Now().UTC()
	spec, enabled, err := p.Apply(old, sc.Enabled, now)
	if err != nil {
		return View{}, err
	}
	if spec.Prompt != "" && (spec.Agent != old.Agent || old.Prompt == "" || spec.Agent == "") {
		// The sandbox is asked where it lives; elsewhere (another
		// node's, in a cluster) a run finds out.
		if rec, err := s.cfg.Core.Get(projectID, sc.SandboxID); err == nil {
			if err := s.checkAgent(ctx, rec, &spec); err != nil {
				return View{}, err
			}
		} else if spec.Agent == "" {
			return View{}, invalid("agent", "give agent (%v)", AgentNames())
		}
	}
	timing := spec.EverySeconds != old.EverySeconds || spec.Cron != old.Cron || spec.Timezone != old.Timezone
	switch {
	case !enabled:
		sc.NextRunAt = nil
	case !sc.Enabled || timing || sc.NextRunAt == nil:
		next := spec.Next(now)
		sc.NextRunAt = &next
	}
	if enabled && !sc.Enabled {
		sc.ConsecutiveFailures, sc.DisabledReason = 0, ""
	}
	if sc.Spec, err = json.Marshal(spec); err != nil {
		return View{}, err
	}
	sc.Enabled = enabled
	if err := s.cfg.Store.SetSchedule(ctx, sc); err != nil {
		return View{}, err
	}
	return s.Get(ctx, projectID, id)
}

// Delete removes a project's schedule and its runs; a run in progress
// goes on to its end, unrecorded.
func (s *Service) Delete(ctx context.Context, projectID, id string) error {
	if _, err := s.find(ctx, projectID, id); err != nil {
		return err
	}
	return s.cfg.Store.DeleteSchedule(ctx, id)
}

// RunNow asks for a run of the schedule now, switching it back on; the
// node that holds its sandbox runs it within a poll or two.
func (s *Service) RunNow(ctx context.Context, projectID, id string) (View, error) {
	if _, err := s.find(ctx, projectID, id); err != nil {
		return View{}, err
	}
	if err := s.cfg.Store.RequestRun(ctx, id, time.Now().UTC()); err != nil {
		return View{}, err
	}
	return s.Get(ctx, projectID, id)
}

// MaxRuns is the most runs Runs lists.
const MaxRuns = store.KeptRuns

// Runs lists a schedule's last runs (limit: 1 to MaxRuns, 0 for 20),
// newest first.
func (s *Service) Runs(ctx context.Context, projectID, id string, limit int) ([]RunView, error) {
	if limit < 0 || limit > MaxRuns {
		return nil, invalid("limit", "%d: must be 1 to %d", limit, MaxRuns)
	}
	if limit == 0 {
		limit = 20
	}
	if _, err := s.find(ctx, projectID, id); err != nil {
		return nil, err
	}
	l, err := s.cfg.Store.Runs(ctx, id, limit)
	return mapped(l, runViewOf), err
}

// fence is the claim's fence: nil on a single server.
func (s *Service) fence() *store.Fence {
	if s.cfg.Fence == nil {
		return nil
	}
	f := s.cfg.Fence()
	return &f
}

// isGone: the sandbox or the schedule went during a run.
func isGone(err error) bool { return errors.Is(err, errdefs.ErrNotFound) }
