package sandbox

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/runtime"
	"github.com/lizard-build/lizard/internal/sandbox/ready"
	"github.com/lizard-build/lizard/internal/template"
)

// Ready states (package ready): the core makes them with what they need of
// it, looks one up at create and restores the new sandbox from it.

// ReadyState is a template's saved ready state.
type ReadyState = ready.State

// ReadyTimeout bounds the wait for a ready command to pass.
const ReadyTimeout = ready.Timeout

// newReady returns the ready states of s, or nil when its runtime cannot
// checkpoint or it keeps none.
func (s *Service) newReady() *ready.States {
	if s.cp == nil || s.cfg.ReadyDir == "" {
		return nil
	}
	return ready.New(ready.Config{
		Dir: s.cfg.ReadyDir, Runtime: s.cfg.Runtime, Checkpointer: s.cp, Log: s.log,
		Mounts:  func(tpl string) []runtime.Mount { return s.mounts(tpl, nil) },
		Booting: s.booting,
		AgentUp: func(ctx context.Context, addr, token string, boot time.Duration) (*agent.Client, error) {
			ag, _ := newAgent(addr, token)
			return ag, waitReady(ctx, ag, s.agentWait(boot))
		},
		Go: func(fn func(ctx context.Context)) {
			s.mu.Lock()
			s.goLocked(fn)
			s.mu.Unlock()
		},
	})
}

func (z Size) readySize() ready.Size { return ready.Size{Name: z.Name, Resources: z.resources()} }

// PrepareReady makes the ready state of template tpl (a version, which
// need not be the current one yet) at size ("" for the default), unless it
// exists; progress (may be nil) gets a line per stage. A start command that
// exits, or does not pass its ready command in time, is an error naming its
// exit status and last output.
func (s *Service) PrepareReady(ctx context.Context, tpl template.Template, size string, progress io.Writer) (ReadyState, error) {
	if s.ready == nil {
		return ReadyState{}, errdefs.WithCode("feature_unavailable", fmt.Errorf("ready states: this server's runtime cannot checkpoint: %w", errdefs.ErrUnavailable))
	}
	sz, err := LookupSize(size)
	if err != nil {
		return ReadyState{}, err
	}
	return s.ready.Prepare(ctx, tpl, sz.readySize(), progress)
}

// PrepareTemplates makes, in the background, the default size's ready
// state of every template with a start command that has none, and removes
// the states of versions and templates that are gone (ready.States).
func (s *Service) PrepareTemplates(list func() ([]template.Template, error)) {
	if s.ready == nil {
		return
	}
	sz, _ := LookupSize(DefaultSize)
	s.ready.PrepareTemplates(list, sz.readySize())
}

// createFromReady starts rec as a copy of tpl's ready state at size, if it
// has one; ok is false when it has none or the restore failed (the state
// is then dropped, and made again in the background).
func (s *Service) createFromReady(ctx context.Context, rec Record, tpl template.Template, sz Size) (Record, bool, error) {
	st, dir, ok := s.ready.Lookup(tpl, sz.Name)
	if !ok {
		s.ready.PrepareLater(tpl, sz.readySize())
		return Record{}, false, nil
	}
	// A refusal is the create's answer, not a reason to drop the state.
	if err := s.admit(ctx, rec.ProjectID, holds(StatusRunning, rec.CPUs, rec.MemoryMB)); err != nil {
		return Record{}, true, err
	}
	rec.Rootfs = tpl.Rootfs
	out, err := s.launch(ctx, rec, func(ctx context.Context, rec *Record) (runtime.Sandbox, error) {
		return s.cp.Restore(ctx, runtime.Spec{ID: rec.ID, Rootfs: tpl.Rootfs, AgentToken: rec.AgentToken,
			Resources: sz.resources(), Egress: rec.Egress, Mounts: s.mounts(tpl.Name, nil)}, dir)
	}, st.AgentToken)
	if err == nil {
		s.logs.event(out.ID, "started from the ready state of template %s: its start command (pid %d) has run since %s",
			tpl.Name, st.StartPid, st.CreatedAt.Format(time.RFC3339))
		return out, true, nil
	}
	if ctx.Err() != nil || refused(err) {
		return Record{}, true, err
	}
	if errdefs.Code(err) == "incompatible_checkpoint" {
		// Made by another runsc build or on another CPU: kept (nothing of
		// a checkpoint is deleted for that), and the create boots instead.
		s.log.Warn("ready state made by another runsc build or CPU; starting the command in a new sandbox", "template", tpl.Name, "size", sz.Name, "err", err)
		return Record{}, false, nil
	}
	s.log.Warn("restore of a ready state failed; dropping it and starting the command in a new sandbox", "template", tpl.Name, "size", sz.Name, "err", err)
	s.ready.Drop(dir)
	return Record{}, false, nil
}
