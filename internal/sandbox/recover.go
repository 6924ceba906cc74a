package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/runtime"
)

// Recover reconciles the store with the runtime after a (re)start: sandboxes
// that are still running and whose agent answers are taken back with their
// deadlines; records without a live sandbox and runtime sandboxes without a
// record are destroyed, so nothing is left behind.
func (s *Service) Recover(ctx context.Context) error {
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
	var errs []error
	for _, r := range recs {
		known[r.ID] = true
		var rec Record
		if err := json.Unmarshal(r.Spec, &rec); err != nil || rec.ID != r.ID {
			s.log.Warn("recover: unreadable record, destroying", "sandbox", r.ID)
			errs = append(errs, s.destroy(ctx, r.ID))
			continue
		}
		if state[r.ID] != runtime.StateRunning || r.Status != StatusRunning {
			s.log.Info("recover: sandbox did not survive, cleaning up", "sandbox", r.ID, "state", state[r.ID], "status", r.Status)
			errs = append(errs, s.destroy(ctx, r.ID))
			continue
		}
		ag := agent.NewClient("http://"+rec.AgentAddr, rec.AgentToken, s.client)
		if err := waitReady(ctx, ag, 3*time.Second); err != nil {
			s.log.Warn("recover: agent does not answer, destroying", "sandbox", r.ID, "err", err)
			errs = append(errs, s.destroy(ctx, r.ID))
			continue
		}
		e := &entry{rec: rec, agent: ag}
		s.mu.Lock()
		s.sandboxes[rec.ID] = e
		s.armLocked(e)
		s.mu.Unlock()
		s.log.Info("recover: reattached", "sandbox", rec.ID)
	}
	for _, sb := range live {
		if !known[sb.ID] {
			s.log.Info("recover: removing sandbox without a record", "sandbox", sb.ID)
			errs = append(errs, s.cfg.Runtime.Destroy(ctx, sb.ID))
		}
	}
	return errors.Join(errs...)
}
