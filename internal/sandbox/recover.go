package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/runtime"
)

// DefaultRecoverProbeTimeout is how long recovery waits for the agent of a
// sandbox the runtime reports running before it calls the sandbox
// unresponsive. A sandbox is never destroyed for a slow agent: destroying a
// live sandbox is the one mistake recovery must not make.
const DefaultRecoverProbeTimeout = time.Minute

// reprobeMaxDelay is the longest wait between two probes of an
// unresponsive sandbox.
const reprobeMaxDelay = 30 * time.Second

// recoverParallel bounds the agents probed at once.
const recoverParallel = 8

// Recover reconciles the store with the runtime after a (re)start. Every
// sandbox ends up in its old state or its new one, never half-way:
//   - running in the runtime and its agent answers (within
//     Config.RecoverProbeTimeout, retried with backoff): reattached, with
//     its deadline (a pause or resume cut short counts as not having
//     happened, or as done, by what the runtime holds);
//   - running in the runtime but its agent does not answer in time (a
//     starved host, a frozen process): unresponsive, kept as it is and
//     probed again with backoff until it answers (reattached), the runtime
//     says it stopped (destroyed) or it is killed; meanwhile it is listed
//     with status unresponsive and every other call about it answers 503
//     unresponsive with Retry-After;
//   - paused in the runtime: paused, deadline stopped;
//   - anything else, records still creating, warm copies of snapshots that
//     are gone, and runtime sandboxes without a record: destroyed, so
//     nothing is left behind.
//
// Recover returns once paused sandboxes and snapshots are back; running
// sandboxes are probed in the background, several at a time, and until
// theirs is done they answer 503 recovering (see lookup) while the rest of
// the API serves. Snapshots come back with their pools, trimmed to size once
// probing is over, and images without a record (a snapshot or fork cut
// short) are removed.
func (s *Service) Recover(ctx context.Context) error {
	recs, err := s.cfg.Store.Sandboxes(ctx)
	if err != nil {
		s.log.Error("recover: done, nothing recovered", "err", err)
		s.recoveredOnce.Do(func() { close(s.recovered) })
		return err
	}
	// Asking the runtime takes runsc runs, slow on a busy host: until
	// then every sandbox with a record answers 503 recovering, none 404.
	var pending []Record
	var gone []string
	for _, r := range recs {
		var rec Record
		if err := json.Unmarshal(r.Spec, &rec); err != nil || rec.ID != r.ID {
			s.log.Warn("recover: unreadable record, destroying", "sandbox", r.ID)
			gone = append(gone, r.ID)
			continue
		}
		rec.Rootfs = s.knownRootfs(rec.Rootfs, rec.ProjectID, rec.Template)
		// The node's region now (older records hold what a client asked).
		rec.Region = s.cfg.Region
		pending = append(pending, rec)
	}
	s.mu.Lock()
	for _, rec := range pending {
		s.recovering[rec.ID] = rec
	}
	s.bg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.bg.Done()
		s.classify(s.bgCtx, pending, gone)
	}()
	return nil
}

// classify maps each pending record to what the runtime holds (asked until
// it answers): paused sandboxes are reattached at once, running ones are
// probed by finishRecovery, anything else is destroyed.
func (s *Service) classify(ctx context.Context, pending []Record, gone []string) {
	var live []runtime.Sandbox
	for delay := 100 * time.Millisecond; ; delay = min(2*delay, 5*time.Second) {
		var err error
		if live, err = s.cfg.Runtime.List(ctx); err == nil {
			break
		}
		s.log.Error("recover: list the runtime's sandboxes; retrying", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
	}
	state := map[string]runtime.State{}
	for _, sb := range live {
		state[sb.ID] = sb.State
	}
	known := map[string]bool{}
	var probe []Record
	for _, id := range gone {
		known[id] = true
	}
	for _, rec := range pending {
		known[rec.ID] = true
		if state[rec.ID] == runtime.StateRunning && rec.Status != StatusCreating {
			probe = append(probe, rec)
			continue
		}
		err := s.reattach(ctx, rec, state[rec.ID])
		s.mu.Lock()
		delete(s.recovering, rec.ID)
		s.mu.Unlock()
		if err != nil {
			s.log.Info("recover: sandbox did not survive, cleaning up", "sandbox", rec.ID, "state", state[rec.ID], "status", rec.Status, "why", err)
			gone = append(gone, rec.ID)
		}
	}
	var strays []string
	for _, sb := range live {
		if !known[sb.ID] {
			strays = append(strays, sb.ID)
		}
	}
	s.finishRecovery(ctx, probe, gone, strays)
}

// finishRecovery is the background part of Recover: probes the agents of
// the sandboxes in probe, destroys those that do not answer and the
// sandboxes in gone, removes the runtime sandboxes in strays, then detaches
// volumes whose sandbox is gone and trims and fills the warm pools. Cut
// short by Close, it destroys nothing it has not judged: the next start
// judges again.
func (s *Service) finishRecovery(ctx context.Context, probe []Record, gone, strays []string) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, recoverParallel)
	for _, rec := range probe {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			err := s.reattach(ctx, rec, runtime.StateRunning)
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, errAgentSilent) && rec.Status != StatusPooled && !s.runtimeGone(ctx, rec.ID) {
				s.log.Warn("recover: sandbox runs but its agent does not answer; keeping it as unresponsive", "sandbox", rec.ID, "why", err)
				s.keepUnresponsive(rec)
				return
			}
			s.mu.Lock()
			delete(s.recovering, rec.ID)
			s.mu.Unlock()
			if err == nil {
				return
			}
			s.log.Info("recover: sandbox did not survive, cleaning up", "sandbox", rec.ID, "status", rec.Status, "why", err)
			if err := s.destroy(ctx, rec.ID); err != nil {
				s.log.Error("recover: destroy", "sandbox", rec.ID, "err", err)
			}
		}()
	}
	for _, id := range gone {
		if err := s.destroy(ctx, id); err != nil {
			s.log.Error("recover: destroy", "sandbox", id, "err", err)
		}
	}
	for _, id := range strays {
		if s.madeHere(id) {
			// Started by this server after recovery listed the runtime
			// (a create, a ready state being made): not a stray.
			continue
		}
		s.log.Info("recover: removing sandbox without a record", "sandbox", id)
		if err := s.cfg.Runtime.Destroy(ctx, id); err != nil {
			s.log.Error("recover: destroy", "sandbox", id, "err", err)
		}
	}
	wg.Wait()
	if ctx.Err() != nil {
		return
	}
	if s.cfg.Volumes != nil {
		if err := s.cfg.Volumes.Reconcile(ctx, func(id string) bool {
			s.mu.Lock()
			defer s.mu.Unlock()
			_, ok := s.sandboxes[id]
			return ok
		}); err != nil {
			s.log.Error("recover: detach volumes of sandboxes that are gone", "err", err)
		}
	}
	s.log.Info("recover: done", "probed", len(probe), "destroyed", len(gone), "strays", len(strays))
	s.recoveredOnce.Do(func() { close(s.recovered) })
}

// stalled is an unresponsive sandbox: one recovery found running in the
// runtime whose agent did not answer. Its record stays in s.recovering.
type stalled struct {
	since time.Time
	// mu is held while the sandbox is reattached or killed; done is set
	// by whichever of the two happened.
	mu   sync.Mutex
	done bool
}

// unresponsiveErr is the answer for a sandbox kept as unresponsive.
func unresponsiveErr(id string) error {
	return errdefs.WithCode("unresponsive", fmt.Errorf("sandbox %q runs but its agent has not answered since the server restarted (a busy or frozen host); it is kept and probed again: retry later: %w", id, errdefs.ErrUnavailable))
}

// runtimeGone says whether the runtime says sandbox id stopped or does not
// have it: the only evidence on which recovery destroys a sandbox it
// found running. An error of the runtime is no such evidence.
func (s *Service) runtimeGone(ctx context.Context, id string) bool {
	st, ok := s.cfg.Runtime.(runtime.Stater)
	if !ok {
		return false
	}
	// A runsc run that hangs says nothing either.
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	now, err := st.State(ctx, id)
	if err != nil {
		return errors.Is(err, errdefs.ErrNotFound)
	}
	return now == runtime.StateStopped
}

// keepUnresponsive keeps rec, whose sandbox runs but whose agent did not
// answer, and probes it again in the background until it answers, the
// runtime says it is gone, it is killed or the service closes (the next
// start judges it again).
func (s *Service) keepUnresponsive(rec Record) {
	st := &stalled{since: time.Now()}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.unresponsive[rec.ID] = st
	s.bg.Add(1)
	s.mu.Unlock()
	s.logs.event(rec.ID, "unresponsive: the server restarted and the sandbox's agent does not answer; probing it again")
	go func() {
		defer s.bg.Done()
		s.reprobe(s.bgCtx, rec, st)
	}()
}

// reprobe probes an unresponsive sandbox with backoff until it is settled.
func (s *Service) reprobe(ctx context.Context, rec Record, st *stalled) {
	// Its own client for the probes: reattach makes the sandbox's.
	ag, conns := newAgent(rec.AgentAddr, rec.AgentToken)
	defer conns.cut()
	for delay := time.Second; ; delay = min(2*delay, reprobeMaxDelay) {
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		st.mu.Lock()
		done := st.done
		st.mu.Unlock()
		if done {
			return
		}
		gone := s.runtimeGone(ctx, rec.ID)
		answered := !gone && waitReady(ctx, ag, min(10*time.Second, s.cfg.RecoverProbeTimeout)) == nil
		if ctx.Err() != nil {
			return
		}
		if !gone && !answered {
			s.log.Debug("recover: sandbox still unresponsive", "sandbox", rec.ID, "for", time.Since(st.since).Round(time.Second))
			continue
		}
		st.mu.Lock()
		if st.done {
			st.mu.Unlock()
			return
		}
		var err error
		if !gone {
			if err = s.reattach(ctx, rec, runtime.StateRunning); err != nil && !errors.Is(err, errNotLive) && !s.runtimeGone(ctx, rec.ID) {
				st.mu.Unlock()
				s.log.Warn("recover: reattach of an unresponsive sandbox failed; probing again", "sandbox", rec.ID, "err", err)
				continue
			}
		}
		st.done = true
		s.mu.Lock()
		delete(s.recovering, rec.ID)
		delete(s.unresponsive, rec.ID)
		s.mu.Unlock()
		if gone || err != nil {
			s.log.Info("recover: unresponsive sandbox stopped in the runtime, cleaning up", "sandbox", rec.ID, "why", err)
			if err := s.destroy(ctx, rec.ID); err != nil {
				s.log.Error("recover: destroy", "sandbox", rec.ID, "err", err)
			}
		} else {
			s.log.Info("recover: unresponsive sandbox answered, reattached", "sandbox", rec.ID, "after", time.Since(st.since).Round(time.Millisecond))
			s.logs.event(rec.ID, "responsive again: reattached")
		}
		st.mu.Unlock()
		return
	}
}

// stalledRecord returns the record of the project's unresponsive sandbox
// id, with its shown status.
func (s *Service) stalledRecord(projectID, id string) (Record, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.unresponsive[id]; !ok {
		return Record{}, false
	}
	rec, ok := s.recovering[id]
	if !ok || rec.ProjectID != projectID {
		return Record{}, false
	}
	rec.Status = StatusUnresponsive
	return rec, true
}

// killStalled kills the project's sandbox id if it is unresponsive: done
// is false when it is not (or no longer: it was reattached meanwhile), and
// the caller kills it the usual way.
func (s *Service) killStalled(ctx context.Context, projectID, id string) (done bool, err error) {
	s.mu.Lock()
	st, ok := s.unresponsive[id]
	rec := s.recovering[id]
	s.mu.Unlock()
	if !ok || rec.ProjectID != projectID {
		return false, nil
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.done {
		return false, nil
	}
	st.done = true
	s.mu.Lock()
	delete(s.recovering, id)
	delete(s.unresponsive, id)
	s.mu.Unlock()
	s.log.Info("sandbox killed (unresponsive)", "sandbox", id)
	s.emit(EventKilled, rec, causeOf(ctx), "it was unresponsive")
	return true, s.destroy(ctx, id)
}

// madeHere says whether id is a sandbox this server is making or runs:
// recovery's listing of the runtime may include sandboxes started after
// the server came up, which have no record (yet, or ever: a ready state's
// preparation) and must not be taken for strays.
func (s *Service) madeHere(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, making := s.launching[id]
	_, live := s.sandboxes[id]
	return making || live
}

// recoveringErr is the answer for a sandbox whose agent recovery has not
// probed yet: retry shortly.
func recoveringErr(id string) error {
	return errdefs.WithCode("recovering", fmt.Errorf("sandbox %q: the server restarted and is reattaching it; retry shortly: %w", id, errdefs.ErrUnavailable))
}

var errNotLive = errors.New("not running in the runtime")

// errAgentSilent is a probe whose agent did not answer in time: the one
// failure that keeps a sandbox the runtime runs (as unresponsive) rather
// than destroy it. Warm pool copies, which never ran user code, are
// destroyed and made again instead.
var errAgentSilent = errors.New("its agent did not answer")

// knownRootfs fills in the template version of a record from a server that
// did not keep it: the template's current one, which the sandbox was made
// from as long as the template was not rebuilt since; from now on it keeps
// that version from being pruned.
func (s *Service) knownRootfs(rootfs, project, tplName string) string {
	if rootfs != "" {
		return rootfs
	}
	if tpl, err := s.cfg.Templates.Lookup(project, tplName); err == nil {
		return tpl.Rootfs
	}
	return ""
}

// reattach takes rec back given what the runtime holds of it.
func (s *Service) reattach(ctx context.Context, rec Record, st runtime.State) error {
	if rec.Status == StatusCreating {
		return errors.New("its create was cut short")
	}
	if rec.Status == StatusPooled {
		s.mu.Lock()
		keep := s.keepPool
		s.mu.Unlock()
		if keep != nil && !keep(rec.PoolOf) {
			return errors.New("a warm copy of a snapshot that is gone")
		}
	}
	ag, conns := newAgent(rec.AgentAddr, rec.AgentToken)
	switch st {
	case runtime.StatePaused:
		if rec.Status == StatusPooled {
			return errNotLive
		}
		rec.Status, rec.EndAt = StatusPaused, nil
		if rec.RemainingMs == 0 && rec.TimeoutMs > 0 {
			rec.RemainingMs = rec.TimeoutMs
		}
	case runtime.StateRunning:
		if err := s.probe(ctx, rec.ID, ag); err != nil {
			return err
		}
		rec.AgentVersion = ag.Version()
		switch rec.Status {
		case StatusPaused, StatusResuming:
			// The resume went through before the crash.
			if rec.DurableAt != nil {
				rec.DurableAt = nil
				defer s.images.Retire(PauseImageName(rec.ID))
			}
			rec.EndAt = deadline(time.Now().UTC(), rec.RemainingMs)
			rec.RemainingMs = 0
			rec.Status = StatusRunning
		case StatusPausing:
			// The pause did not complete: it never happened.
			rec.Status, rec.RemainingMs = StatusRunning, 0
		}
		rec.FilesOnly = false
	default:
		return errNotLive
	}
	rec.Rootfs = s.knownRootfs(rec.Rootfs, rec.ProjectID, rec.Template)
	if err := s.persist(ctx, rec); err != nil {
		return err
	}
	e := &entry{rec: rec, agent: ag, conns: conns, since: time.Now()}
	s.mu.Lock()
	s.sandboxes[rec.ID] = e
	s.armLocked(e)
	s.mu.Unlock()
	if rec.Status == StatusPaused && rec.DurableAt == nil {
		s.makePauseDurable(e, rec.ID) // the server stopped before it was
	}
	s.log.Info("recover: reattached", "sandbox", rec.ID, "status", rec.Status)
	return nil
}

// probe waits up to Config.RecoverProbeTimeout for the agent of sandbox id
// to answer, backing off to one try a second; every 10 s without an answer
// it asks the runtime, and stops waiting for a sandbox that stopped
// meanwhile.
func (s *Service) probe(ctx context.Context, id string, ag *agent.Client) error {
	end := time.Now().Add(s.cfg.RecoverProbeTimeout)
	for {
		err := waitReady(ctx, ag, min(10*time.Second, time.Until(end)))
		if err == nil || ctx.Err() != nil {
			return err
		}
		if !time.Now().Before(end) {
			return fmt.Errorf("%w: %w", errAgentSilent, err)
		}
		if st, ok := s.cfg.Runtime.(runtime.Stater); ok {
			if now, serr := st.State(ctx, id); serr == nil && now != runtime.StateRunning {
				return fmt.Errorf("%w: %s while its agent was probed", errNotLive, now)
			}
		}
	}
}

// Watch notices sandboxes whose processes died on their own (the whole
// sandbox killed, e.g. for memory): every interval it asks the runtime, logs
// why (out of memory, when the runtime can tell), and frees what they held,
// until ctx is done. A sandbox is declared dead only on evidence taken after
// it came up, twice: the listing must have begun after it started, and the
// runtime's own word on that one sandbox, asked after the listing, must
// agree. A sandbox missing from a listing is never taken for dead.
func (s *Service) Watch(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		began := time.Now()
		live, err := s.cfg.Runtime.List(ctx)
		if err != nil {
			continue
		}
		s.mu.Lock()
		var dead []*entry
		for _, sb := range live {
			if e, ok := s.sandboxes[sb.ID]; ok && sb.State == runtime.StateStopped && s.mayDieLocked(e, began) {
				dead = append(dead, e)
			}
		}
		s.mu.Unlock()
		for _, e := range dead {
			s.reapDead(ctx, e, began)
		}
	}
}

// mayDieLocked says whether e can be judged by a listing begun at began:
// it runs (or waits in a pool) and came up before. Caller holds s.mu.
func (s *Service) mayDieLocked(e *entry, began time.Time) bool {
	return !e.gone && (e.rec.Status == StatusRunning || e.rec.Status == StatusPooled) && e.since.Before(began)
}

func (s *Service) reapDead(ctx context.Context, e *entry, began time.Time) {
	if !e.mu.TryLock() {
		return // a lifecycle operation is under way; look again next time
	}
	defer e.mu.Unlock()
	s.mu.Lock()
	ok := s.mayDieLocked(e, began)
	s.mu.Unlock()
	if !ok {
		return
	}
	id := e.rec.ID
	if st, ok := s.cfg.Runtime.(runtime.Stater); ok {
		if now, err := st.State(ctx, id); err != nil || now != runtime.StateStopped {
			return
		}
	}
	why := "stopped: its processes exited"
	if r, ok := s.cfg.Runtime.(runtime.OOMReporter); ok && r.OOMKilled(id) {
		why = "killed: out of memory (OOM)"
	}
	if !s.take(e) {
		return
	}
	s.log.Warn("sandbox died", "sandbox", id, "why", why)
	s.logs.event(id, "%s", why)
	s.emit(EventDied, s.recordOf(e), "", why)
	s.destroy(context.WithoutCancel(ctx), id)
}
