package schedule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/events"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/store"
)

// hold is the runs of one sandbox under way on this node: the first wakes
// a paused sandbox, the last puts it back to sleep.
type hold struct {
	mu    sync.Mutex // held while waking or putting to sleep
	runs  int
	woken bool // a run of ours resumed it
	files bool // it slept without its memory: it goes back so
}

// Run runs the schedules of this node's sandboxes until ctx ends, which
// cuts the runs under way short (the next start records them
// interrupted); it returns once they have stopped. It first ends the runs a stopped server
// left (interrupted) and puts back to sleep the sandboxes they woke.
func (s *Service) Run(ctx context.Context) {
	defer s.wg.Wait()
	var asleep []store.ScheduleRun // runs whose sandbox should go back to sleep
	for {
		left, err := s.cfg.Store.InterruptRuns(ctx, s.cfg.Node, time.Now().UTC())
		if err == nil {
			for _, r := range left {
				s.log.Warn("schedule run interrupted by a stop of the server", "schedule", r.ScheduleID, "run", r.ID, "sandbox", r.SandboxID)
				s.finished(r)
				if r.Woke && !r.Slept {
					asleep = append(asleep, r)
				}
			}
			break
		}
		s.log.Error("schedules: end the runs a stop left", "err", err)
		if !sleep(ctx, s.cfg.Poll) {
			return
		}
	}
	t := time.NewTicker(s.cfg.Poll)
	defer t.Stop()
	for {
		asleep = s.putBack(ctx, asleep)
		s.poll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// putBack pauses the sandboxes that interrupted runs woke, once recovery
// has them running again; it returns those still to do.
func (s *Service) putBack(ctx context.Context, runs []store.ScheduleRun) []store.ScheduleRun {
	var left []store.ScheduleRun
	for _, r := range runs {
		rec, err := s.cfg.Core.Get(r.ProjectID, r.SandboxID)
		switch {
		case isGone(err) || err == nil && rec.Status == sandbox.StatusPaused:
		case err != nil || rec.Status != sandbox.StatusRunning:
			left = append(left, r) // recovering, or between states
		default:
			if s.handOver(r.SandboxID) {
				continue // a new run has it: that run puts it back
			}
			if err := s.cfg.Core.Pause(sandbox.WithCause(ctx, sandbox.CauseSchedule), r.ProjectID, r.SandboxID); err != nil {
				s.log.Error("schedules: put back to sleep the sandbox an interrupted run woke", "sandbox", r.SandboxID, "err", err)
				continue
			}
			r.Slept = true
			if err := s.cfg.Store.UpdateRun(ctx, s.fence(), r, nil); err != nil {
				s.log.Error("schedules: record the sleep", "run", r.ID, "err", err)
			}
		}
	}
	return left
}

// handOver gives the runs holding sandbox id, if any, the job of putting
// it back to sleep after them, and reports whether there were any.
func (s *Service) handOver(id string) bool {
	s.mu.Lock()
	h := s.awake[id]
	s.mu.Unlock()
	if h == nil {
		return false
	}
	h.mu.Lock()
	h.woken = true
	h.mu.Unlock()
	return true
}

// poll claims and starts the due runs of this node's sandboxes.
func (s *Service) poll(ctx context.Context) {
	now := time.Now().UTC()
	due, err := s.cfg.Store.DueSchedules(ctx, now)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Error("schedules: list the due ones", "err", err)
		}
		return
	}
	for _, sc := range due {
		rec, ok := s.cfg.Core.Live(sc.SandboxID)
		if !ok || rec.ProjectID != sc.ProjectID || rec.Status != sandbox.StatusRunning && rec.Status != sandbox.StatusPaused {
			continue // another node's, or between states: a later poll
		}
		var spec Spec
		if err := json.Unmarshal(sc.Spec, &spec); err != nil {
			s.log.Error("schedules: bad spec", "schedule", sc.ID, "err", err)
			continue
		}
		c := store.RunClaim{Fence: s.fence(), Run: store.ScheduleRun{ID: store.NewID("run_", 16), ScheduleID: sc.ID, SandboxID: sc.SandboxID,
			ProjectID: sc.ProjectID, Node: s.cfg.Node, Status: store.RunRunning, StartedAt: now}}
		switch {
		case sc.RunRequested != nil:
			c.Due, c.Requested = *sc.RunRequested, true
		case sc.NextRunAt != nil:
			// Due times that passed while no server ran them are
			// skipped and counted: one run stands for them all.
			c.Due, c.Next, c.Missed = *sc.NextRunAt, spec.Next(now), spec.Missed(*sc.NextRunAt, now)
			if c.Next.IsZero() { // a cron that never matches again
				c.Next = now.AddDate(100, 0, 0)
			}
		default:
			continue
		}
		c.Run.Due = c.Due
		res, err := s.cfg.Store.ClaimRun(ctx, c)
		switch {
		case err != nil:
			s.log.Error("schedules: claim a run", "schedule", sc.ID, "err", err)
		case res == store.ClaimOverlapped:
			s.log.Info("schedule run skipped: the last one is still running", "schedule", sc.ID, "due", c.Due)
		case res == store.Claimed:
			if c.Missed > 0 {
				s.log.Info("schedule runs skipped while no server ran them", "schedule", sc.ID, "skipped", c.Missed)
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				s.run(ctx, spec, c.Run)
			}()
		}
	}
}

// run wakes the sandbox if it sleeps, runs the schedule's command or
// prompt, puts the sandbox back to sleep if the run woke it and no other
// run holds it, and records the run.
func (s *Service) run(ctx context.Context, spec Spec, r store.ScheduleRun) {
	start := time.Now()
	s.log.Info("schedule run", "schedule", r.ScheduleID, "run", r.ID, "sandbox", r.SandboxID, "due", r.Due)
	woke, err := s.acquire(ctx, r)
	r.Woke = woke
	if woke {
		if err := s.cfg.Store.UpdateRun(ctx, s.fence(), r, nil); err != nil {
			s.log.Error("schedules: record the wake", "run", r.ID, "err", err)
		}
	}
	var out output
	code := -1
	if err == nil {
		code, err = s.exec(ctx, spec, r, &out)
	}
	if ctx.Err() != nil {
		// The server is stopping: the run stays running in the store,
		// and the next start records it interrupted and puts the
		// sandbox back to sleep if it woke it.
		s.let(r.SandboxID)
		s.log.Warn("schedule run cut short by the server's stop", "schedule", r.ScheduleID, "run", r.ID)
		return
	}
	r.Slept = s.release(ctx, r)
	end := time.Now().UTC()
	d := end.Sub(start).Milliseconds()
	r.EndedAt, r.DurationMs, r.Output = &end, &d, out.String()
	failed := true
	switch {
	case errors.Is(err, errTimeout):
		r.Status, r.Error = store.RunTimeout, fmt.Sprintf("stopped after timeoutSeconds (%d s)", spec.TimeoutSeconds)
	case err != nil:
		r.Status, r.Error = store.RunFailed, err.Error()
	case code == 0:
		r.Status, failed = store.RunSucceeded, false
	default:
		r.Status, r.Error = store.RunFailed, fmt.Sprintf("exit code %d", code)
	}
	if code >= 0 {
		r.ExitCode = &code
	}
	if err := s.cfg.Store.UpdateRun(ctx, s.fence(), r, &store.RunEnd{Failed: failed, DisableAfter: DisableAfter,
		DisabledReason: fmt.Sprintf("switched off after %d failed runs in a row (the last: %s)", DisableAfter, r.Status)}); err != nil && !isGone(err) {
		s.log.Error("schedules: record the run's end", "run", r.ID, "err", err)
	}
	s.log.Info("schedule run ended", "schedule", r.ScheduleID, "run", r.ID, "status", r.Status, "woke", r.Woke, "slept", r.Slept,
		"took", time.Since(start).Round(time.Millisecond))
	s.finished(r)
}

// finished tells Config.Runs of a run that ended.
func (s *Service) finished(r store.ScheduleRun) {
	if s.cfg.Runs == nil {
		return
	}
	ev := events.ScheduleRun{ProjectID: r.ProjectID, SandboxID: r.SandboxID, ScheduleID: r.ScheduleID, RunID: r.ID,
		Status: r.Status, Woke: r.Woke, Slept: r.Slept, StartedAt: r.StartedAt, ExitCode: r.ExitCode, Error: r.Error}
	if r.EndedAt != nil {
		ev.EndedAt = *r.EndedAt
	}
	s.cfg.Runs.ScheduleRunFinished(ev)
}

var errTimeout = errors.New("timeout")

// acquire holds the sandbox awake for r, resuming it if it is paused; it
// reports whether this run woke it.
func (s *Service) acquire(ctx context.Context, r store.ScheduleRun) (bool, error) {
	s.mu.Lock()
	h := s.awake[r.SandboxID]
	if h == nil {
		h = &hold{}
		s.awake[r.SandboxID] = h
	}
	h.runs++
	s.mu.Unlock()
	h.mu.Lock()
	defer h.mu.Unlock()
	rec, err := s.cfg.Core.Get(r.ProjectID, r.SandboxID)
	if err != nil {
		return false, err
	}
	if rec.Status != sandbox.StatusPaused {
		return false, nil
	}
	if _, err := s.cfg.Core.Resume(sandbox.WithCause(ctx, sandbox.CauseSchedule), r.ProjectID, r.SandboxID); err != nil {
		return false, fmt.Errorf("wake the sandbox: %w", err)
	}
	h.woken, h.files = true, rec.FilesOnly
	return true, nil
}

// let lets go of the sandbox without putting it back to sleep.
func (s *Service) let(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h := s.awake[id]; h != nil {
		if h.runs--; h.runs == 0 {
			delete(s.awake, id)
		}
	}
}

// release lets go of the sandbox; the last run of those that woke it
// pauses it again, and reports so.
func (s *Service) release(ctx context.Context, r store.ScheduleRun) bool {
	s.mu.Lock()
	h := s.awake[r.SandboxID]
	h.runs--
	last := h.runs == 0
	s.mu.Unlock()
	if !last {
		return false
	}
	h.mu.Lock()
	slept := false
	if h.woken {
		pause := s.cfg.Core.Pause
		if h.files {
			pause = s.cfg.Core.PauseFiles
		}
		if err := pause(sandbox.WithCause(ctx, sandbox.CauseSchedule), r.ProjectID, r.SandboxID); err != nil {
			if !isGone(err) {
				s.log.Error("schedules: put the sandbox back to sleep", "sandbox", r.SandboxID, "run", r.ID, "err", err)
			}
		} else {
			slept = true
		}
		h.woken = false
	}
	h.mu.Unlock()
	s.mu.Lock()
	if h.runs == 0 && s.awake[r.SandboxID] == h {
		delete(s.awake, r.SandboxID)
	}
	s.mu.Unlock()
	return slept
}

// exec runs the schedule's command or its agent's prompt as root, in
// /workspace when the sandbox has a volume, else in root's home, and
// returns its exit code.
func (s *Service) exec(ctx context.Context, spec Spec, r store.ScheduleRun, out *output) (int, error) {
	rec, err := s.cfg.Core.Get(r.ProjectID, r.SandboxID)
	if err != nil {
		return -1, err
	}
	req := sandbox.ExecRequest{Cmd: []string{spec.Command}, Shell: true, User: "root", TimeoutMs: int64(spec.TimeoutSeconds) * 1000}
	if rec.VolumeID != "" {
		req.Workdir = "/workspace"
	}
	if spec.Prompt != "" {
		cli, ok := agents[spec.Agent]
		if !ok {
			return -1, fmt.Errorf("agent %q is not one lizard runs (%v)", spec.Agent, AgentNames())
		}
		// The sandbox's own envs (its model credentials) come first; the
		// agent's settings and the schedule's words are added.
		req.Cmd = []string{"command -v " + spec.Agent + " >/dev/null || { echo 'agent " + spec.Agent + " is not installed in this sandbox' >&2; exit 127; }\n" + cli.script}
		req.Envs = map[string]string{"LIZARD_PROMPT": spec.Prompt, "LIZARD_MODEL": spec.Model, "LIZARD_EFFORT": spec.ReasoningEffort}
		for k, v := range cli.env {
			req.Envs[k] = v
		}
	}
	ctx, cancel := context.WithTimeout(ctx, time.Duration(spec.TimeoutSeconds)*time.Second+time.Minute)
	defer cancel()
	code, timedOut := -1, false
	err = s.cfg.Core.Exec(ctx, r.ProjectID, r.SandboxID, req, func(ev agent.Event) error {
		switch {
		case ev.Line != nil:
			out.add(*ev.Line, !ev.Partial)
		case ev.ExitCode != nil:
			code = *ev.ExitCode
			timedOut = ev.Error == "timeout"
		}
		return nil
	})
	switch {
	case timedOut:
		return code, errTimeout
	case err != nil:
		return -1, err
	}
	return code, nil
}

// output keeps the last OutputCap bytes of a run's output.
type output struct {
	b   []byte
	cut int64
}

func (o *output) add(line string, newline bool) {
	o.b = append(o.b, line...)
	if newline {
		o.b = append(o.b, '\n')
	}
	if over := len(o.b) - OutputCap; over > 0 {
		o.cut += int64(over)
		o.b = append(o.b[:0], o.b[over:]...)
	}
}

func (o *output) String() string {
	s := strings.ToValidUTF8(string(o.b), "\uFFFD")
	if o.cut > 0 {
		return fmt.Sprintf("[… %d bytes cut: the last %d bytes follow]\n", o.cut, OutputCap) + s
	}
	return s
}
