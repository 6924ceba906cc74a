package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"time"

	"github.com/lizard-build/lizard/internal/runtime"
)

// Recover reconciles the store with the runtime after a (re)start. Every
// sandbox ends up in its old state or its new one, never half-way:
//   - running in the runtime and its agent answers: reattached, with its
//     deadline (a pause or resume cut short counts as not having happened,
//     or as done, by what the runtime holds);
//   - paused in the runtime: paused, deadline stopped;
//   - anything else, records still creating, and runtime sandboxes without a
//     record: destroyed, so nothing is left behind.
//
// Snapshots come back with their pools, and images without a record (a
// snapshot or fork cut short) are removed.
func (s *Service) Recover(ctx context.Context) error {
	var errs []error
	errs = append(errs, s.recoverSnapshots(ctx))
	recs, err := s.cfg.Store.Sandboxes(ctx)
	if err != nil {
		return err
	}
	live, err := s.cfg.Runtime.List(ctx)
	if err != nil {
		return err
	}
	state := map[string]runtime.State{}
	for _, sb := range live {
		state[sb.ID] = sb.State
	}
	known := map[string]bool{}
	for _, r := range recs {
		known[r.ID] = true
		var rec Record
		if err := json.Unmarshal(r.Spec, &rec); err != nil || rec.ID != r.ID {
			s.log.Warn("recover: unreadable record, destroying", "sandbox", r.ID)
			errs = append(errs, s.destroy(ctx, r.ID))
			continue
		}
		if err := s.reattach(ctx, rec, state[r.ID]); err != nil {
			s.log.Info("recover: sandbox did not survive, cleaning up", "sandbox", r.ID, "state", state[r.ID], "status", rec.Status, "why", err)
			errs = append(errs, s.destroy(ctx, r.ID))
		}
	}
	for _, sb := range live {
		if !known[sb.ID] {
			s.log.Info("recover: removing sandbox without a record", "sandbox", sb.ID)
			errs = append(errs, s.cfg.Runtime.Destroy(ctx, sb.ID))
		}
	}
	if s.cfg.Volumes != nil {
		errs = append(errs, s.cfg.Volumes.Reconcile(ctx, func(id string) bool {
			s.mu.Lock()
			defer s.mu.Unlock()
			_, ok := s.sandboxes[id]
			return ok
		}))
	}
	s.mu.Lock()
	var ses []*snapEntry
	for _, se := range s.snapshots {
		ses = append(ses, se)
	}
	s.mu.Unlock()
	for _, se := range ses {
		s.trimPool(ctx, se)
		s.fillPool(se)
	}
	return errors.Join(errs...)
}

var errNotLive = errors.New("not running in the runtime")

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
		if err := waitReady(ctx, ag, 3*time.Second); err != nil {
			return err
		}
		switch rec.Status {
		case StatusPaused, StatusResuming:
			// The resume went through before the crash.
			rec.EndAt = deadline(time.Now().UTC(), rec.RemainingMs)
			rec.RemainingMs = 0
			rec.Status = StatusRunning
		case StatusPausing:
			// The pause did not complete: it never happened.
			rec.Status, rec.RemainingMs = StatusRunning, 0
		}
	default:
		return errNotLive
	}
	rec.Rootfs = s.knownRootfs(rec.Rootfs, rec.ProjectID, rec.Template)
	if err := s.persist(ctx, rec); err != nil {
		return err
	}
	e := &entry{rec: rec, agent: ag, conns: conns}
	s.mu.Lock()
	s.sandboxes[rec.ID] = e
	s.armLocked(e)
	s.mu.Unlock()
	s.log.Info("recover: reattached", "sandbox", rec.ID, "status", rec.Status)
	return nil
}

// recoverSnapshots loads the snapshot records and removes images that have
// none.
func (s *Service) recoverSnapshots(ctx context.Context) error {
	if s.cfg.SnapshotDir == "" {
		return nil
	}
	recs, err := s.cfg.Store.Snapshots(ctx)
	if err != nil {
		return err
	}
	known := map[string]bool{}
	for _, r := range recs {
		var snap Snapshot
		if err := json.Unmarshal(r.Spec, &snap); err != nil || snap.ID != r.ID {
			s.log.Warn("recover: unreadable snapshot record, removing", "snapshot", r.ID)
			s.cfg.Store.DeleteSnapshot(ctx, r.ID)
			continue
		}
		if _, err := os.Stat(filepath.Join(s.snapshotDir(snap.ID), "checkpoint.img")); err != nil {
			s.log.Warn("recover: snapshot image missing, removing the snapshot", "snapshot", snap.ID)
			s.cfg.Store.DeleteSnapshot(ctx, r.ID)
			continue
		}
		known[snap.ID] = true
		if snap.Rootfs == "" {
			snap.Rootfs = s.knownRootfs("", snap.ProjectID, snap.Template)
			s.putSnapshot(ctx, snap)
		}
		s.mu.Lock()
		s.snapshots[snap.ID] = &snapEntry{snap: snap}
		s.mu.Unlock()
	}
	ents, _ := os.ReadDir(s.cfg.SnapshotDir)
	for _, e := range ents {
		if !known[e.Name()] {
			os.RemoveAll(filepath.Join(s.cfg.SnapshotDir, e.Name()))
		}
	}
	return nil
}

// Watch notices sandboxes whose processes died on their own (the whole
// sandbox killed, e.g. for memory): every interval it asks the runtime, logs
// why (out of memory, when the runtime can tell), and frees what they held,
// until ctx is done.
func (s *Service) Watch(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		live, err := s.cfg.Runtime.List(ctx)
		if err != nil {
			continue
		}
		state := map[string]runtime.State{}
		for _, sb := range live {
			state[sb.ID] = sb.State
		}
		s.mu.Lock()
		var dead []*entry
		for id, e := range s.sandboxes {
			if (e.rec.Status == StatusRunning || e.rec.Status == StatusPooled) && state[id] == runtime.StateStopped {
				dead = append(dead, e)
			}
		}
		s.mu.Unlock()
		for _, e := range dead {
			s.reapDead(ctx, e)
		}
	}
}

func (s *Service) reapDead(ctx context.Context, e *entry) {
	if !e.mu.TryLock() {
		return // a lifecycle operation is under way; look again next time
	}
	defer e.mu.Unlock()
	id := e.rec.ID
	why := "stopped: its processes exited"
	if r, ok := s.cfg.Runtime.(runtime.OOMReporter); ok && r.OOMKilled(id) {
		why = "killed: out of memory (OOM)"
	}
	if !s.take(e) {
		return
	}
	s.log.Warn("sandbox died", "sandbox", id, "why", why)
	s.logs.event(id, "%s", why)
	s.destroy(ctx, id)
}
