package sandbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// checkpointer returns the runtime's checkpoint capability or a clear error.
func (s *Service) checkpointer(feature string) error {
	if s.cp == nil {
		return NoCheckpoints(feature)
	}
	return nil
}

// NoCheckpoints is the refusal of feature by a server whose runtime
// cannot checkpoint sandboxes.
func NoCheckpoints(feature string) error {
	return errdefs.WithCode("feature_unavailable", fmt.Errorf("%s: this server's runtime cannot checkpoint sandboxes: %w", feature, errdefs.ErrInvalid))
}

// Pause checkpoints the sandbox — memory, processes, files — and frees its
// processes and memory. Its deadline stops until Resume. Pausing a paused
// sandbox is a no-op. A failed pause leaves it running with pauseError set.
func (s *Service) Pause(ctx context.Context, projectID, id string) error {
	return s.pause(ctx, projectID, id, false, false)
}

// PauseFiles pauses the sandbox keeping its files only (E2B's keepMemory
// false): its processes end and its memory and runtime are released
// entirely; its writable layer (and volume) is kept. Resume boots it
// afresh over those files with the same id, tokens, metadata, envs,
// network and template start command. Pausing a paused sandbox (either
// way) is a no-op.
func (s *Service) PauseFiles(ctx context.Context, projectID, id string) error {
	return s.pause(ctx, projectID, id, false, true)
}

// pause is Pause, or PauseFiles when files. timedOut is a pause by the
// sandbox's own deadline (autoPause): its next run gets its whole timeout
// back rather than the millisecond it had left, set under the same lock
// as the pause, so that a resume cannot come in between and have its
// deadline overwritten.
func (s *Service) pause(ctx context.Context, projectID, id string, timedOut, files bool) (err error) {
	defer s.observe(opPause, time.Now(), &err)
	if err := s.checkpointer("pause"); err != nil {
		return err
	}
	if files && s.fp == nil {
		return errdefs.WithCode("feature_unavailable", fmt.Errorf("pause without memory: this server's runtime cannot: %w", errdefs.ErrInvalid))
	}
	ctx, cancel := detach(ctx)
	defer cancel()
	if err := s.cfg.Disk.Check(); err != nil {
		return fmt.Errorf("pause sandbox %q: %w", id, err)
	}
	e, err := s.lockLive(projectID, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		if _, ok := s.orphan(ctx, projectID, id); ok {
			return nil // paused (and durable) already, its node gone
		}
	}
	if err != nil {
		return err
	}
	defer e.mu.Unlock()
	if e.rec.Status == StatusPaused {
		s.mu.Unlock()
		return nil
	}
	e.rec.Status = StatusPausing
	e.rec.FilesOnly = files
	e.rec.PauseError = ""
	e.rec.RemainingMs = 0
	switch {
	case timedOut:
		e.rec.RemainingMs = max(e.rec.TimeoutMs, 1000)
	case e.rec.EndAt != nil:
		e.rec.RemainingMs = max(time.Until(*e.rec.EndAt).Milliseconds(), 1)
	}
	if e.timer != nil {
		e.timer.Stop()
	}
	rec := e.rec
	s.mu.Unlock()
	if err := s.persist(ctx, rec); err != nil {
		s.setRunning(e, "")
		return err
	}

	start := time.Now()
	if files {
		err = s.fp.PauseFiles(ctx, id)
	} else {
		err = s.cp.Pause(ctx, id)
	}
	if err != nil {
		s.log.Error("pause failed; the sandbox keeps running", "sandbox", id, "err", err)
		s.logs.event(id, "pause failed: %v", err)
		s.setRunning(e, err.Error())
		return fmt.Errorf("pause sandbox %q: %w", id, err)
	}
	s.mu.Lock()
	e.rec.Status = StatusPaused
	e.rec.EndAt = nil
	rec = e.rec
	// The connections to its agent died with its processes.
	cut := e.conns.cut()
	s.mu.Unlock()
	if cut > 0 {
		s.log.Debug("sandbox connections cut", "sandbox", id, "conns", cut, "why", "paused")
	}
	how := ""
	if files {
		how = "files only"
	}
	s.log.Info("sandbox paused", "sandbox", id, "took", time.Since(start), "filesOnly", files)
	if files {
		s.logs.event(id, "paused (files only: its processes ended)")
	} else {
		s.logs.event(id, "paused")
	}
	by := causeOf(ctx)
	if timedOut {
		by = CauseTimeout
	}
	s.emit(EventPaused, rec, by, how)
	if err := s.persist(context.WithoutCancel(ctx), rec); err != nil {
		return err
	}
	s.makePauseDurable(e, id)
	return nil
}

// setRunning puts e back to running after a pause that did not happen.
func (s *Service) setRunning(e *entry, pauseError string) {
	s.mu.Lock()
	e.rec.FilesOnly = false
	s.mu.Unlock()
	s.setStatus(e, StatusRunning, pauseError)
}

// setStatus puts e back to status (running after a failed pause, paused
// after a failed resume) with its deadline, and records why.
func (s *Service) setStatus(e *entry, status, pauseError string) {
	s.mu.Lock()
	e.rec.Status = status
	e.rec.PauseError = pauseError
	s.armLocked(e)
	rec := e.rec
	s.mu.Unlock()
	if err := s.persist(context.Background(), rec); err != nil {
		s.log.Error("persist sandbox", "sandbox", rec.ID, "err", err)
	}
}

// Resume restores a paused sandbox where it stopped: same processes and
// pids, files, network address and agent token. Resuming a running sandbox
// is a no-op (the Python client's connect() relies on it).
func (s *Service) Resume(ctx context.Context, projectID, id string) (_ Record, err error) {
	defer s.observe(opResume, time.Now(), &err)
	ctx, cancel := detach(ctx)
	defer cancel()
	e, err := s.lockLive(projectID, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		if rec, ok := s.orphan(ctx, projectID, id); ok {
			return s.adopt(ctx, rec)
		}
	}
	if err != nil {
		return Record{}, err
	}
	defer e.mu.Unlock()
	if e.rec.Status != StatusPaused {
		rec := e.rec
		s.mu.Unlock()
		return rec, nil
	}
	s.mu.Unlock()
	if err := s.checkpointer("resume"); err != nil {
		return Record{}, err
	}
	s.mu.Lock()
	vol := e.rec.VolumeID
	s.mu.Unlock()
	if vol != "" && s.cfg.Volumes != nil {
		// After a reboot the volume is no longer mounted on the host.
		if err := s.cfg.Volumes.Mount(ctx, vol); err != nil {
			return Record{}, fmt.Errorf("resume sandbox %q: mount its volume: %w", id, err)
		}
	}
	if err := s.beginResume(ctx, e); err != nil {
		return Record{}, err
	}
	start := time.Now()
	s.mu.Lock()
	e.since = start
	s.mu.Unlock()
	s.setStatus(e, StatusResuming, "")
	// The upload reads the image that the resume consumes.
	s.images.StopUpload(PauseImageName(id))
	if dir := s.pauseImage(id); dir != "" {
		err = s.images.Materialize(ctx, PauseImageName(id), dir)
	}
	if err == nil {
		err = s.cp.Resume(ctx, id)
	}
	if err != nil {
		s.log.Error("resume failed; the sandbox stays paused", "sandbox", id, "err", err)
		s.resumeFailed(e, id)
		return Record{}, fmt.Errorf("resume sandbox %q: %w", id, err)
	}
	s.mu.Lock()
	ag, files := e.agent, e.rec.FilesOnly
	s.mu.Unlock()
	err = waitReady(ctx, ag, s.agentWait(time.Since(start)))
	if err == nil && files {
		// Booted afresh: envd learns its settings again.
		s.mu.Lock()
		rec := e.rec
		s.mu.Unlock()
		err = giveEnvdToken(ctx, ag, rec)
	}
	if err != nil {
		// It runs but does not answer: pause it again so nothing is lost.
		if files {
			s.fp.PauseFiles(context.WithoutCancel(ctx), id)
		} else {
			s.cp.Pause(context.WithoutCancel(ctx), id)
		}
		s.mu.Lock()
		e.rec.DurableAt = nil
		s.mu.Unlock()
		s.setStatus(e, StatusPaused, "")
		s.images.Retire(PauseImageName(id))
		s.makePauseDurable(e, id)
		return Record{}, fmt.Errorf("resume sandbox %q: agent did not answer: %w", id, err)
	}
	s.mu.Lock()
	e.rec.AgentVersion = ag.Version()
	e.rec.Status = StatusRunning
	e.rec.EndAt = nil
	if e.rec.RemainingMs > 0 {
		e.rec.EndAt = deadline(time.Now().UTC(), e.rec.RemainingMs)
	}
	e.rec.RemainingMs = 0
	e.rec.DurableAt = nil
	e.rec.FilesOnly = false
	s.armLocked(e)
	rec := e.rec
	s.mu.Unlock()
	// Its image is gone: its objects stay only as the base of its next
	// pause's upload, which stores what changed.
	s.images.Retire(PauseImageName(id))
	s.log.Info("sandbox resumed", "sandbox", id, "took", time.Since(start), "booted", files)
	how := ""
	if files {
		how = "booted over its files"
		s.logs.event(id, "resumed: booted over its files")
	} else {
		s.logs.event(id, "resumed")
	}
	s.emit(EventResumed, rec, causeOf(ctx), how)
	err = s.persist(context.WithoutCancel(ctx), rec)
	if files {
		s.restartCommand(ctx, rec)
	}
	return rec, err
}

// restartCommand starts the template's start command again in a sandbox
// booted over its files (a files-only pause's resume), as a create does.
func (s *Service) restartCommand(ctx context.Context, rec Record) {
	tpl, err := s.cfg.Templates.Lookup(rec.ProjectID, rec.Template)
	if err != nil {
		s.logs.event(rec.ID, "start command: template %s: %v", rec.Template, err)
		return
	}
	if len(tpl.StartCommand) > 0 {
		s.startCommand(ctx, rec, tpl.StartCommand)
	}
}
