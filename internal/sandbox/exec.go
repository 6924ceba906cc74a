package sandbox

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/errdefs"
)

// Exec limits.
const (
	DefaultExecTimeoutMs = 60_000
	MaxExecTimeoutMs     = 600_000
)

// ExecRequest is one command as the API receives it.
type ExecRequest struct {
	Cmd       []string
	Shell     bool
	Envs      map[string]string
	User      string
	Workdir   string
	TimeoutMs int64 // 0: DefaultExecTimeoutMs
}

// Exec runs a command in the sandbox, handing each agent event to onEvent as
// it arrives. Create-time envs apply first; the request's win.
func (s *Service) Exec(ctx context.Context, projectID, id string, req ExecRequest, onEvent func(agent.Event) error) (err error) {
	defer s.observe(opExec, time.Now(), &err)
	if len(req.Cmd) == 0 || (req.Shell && req.Cmd[0] == "") {
		return fmt.Errorf("cmd: must be a non-empty string or argv array: %w", errdefs.ErrInvalid)
	}
	if req.TimeoutMs == 0 {
		req.TimeoutMs = DefaultExecTimeoutMs
	}
	if req.TimeoutMs < 0 || req.TimeoutMs > MaxExecTimeoutMs {
		return fmt.Errorf("timeoutMs %d: must be 1 to %d (600 s): %w", req.TimeoutMs, MaxExecTimeoutMs, errdefs.ErrInvalid)
	}
	if err := validateEnvs(req.Envs); err != nil {
		return err
	}
	ag, rec, err := s.Agent(projectID, id)
	if err != nil {
		return err
	}
	// A template built from a Dockerfile sets who commands run as, and
	// where, unless the request says.
	if req.User == "" {
		req.User = rec.User
	}
	if req.Workdir == "" {
		req.Workdir = rec.Workdir
	}
	env := req.Envs
	if len(rec.Envs) > 0 {
		env = mergeEnv(nil, rec.Envs)
		for k, v := range req.Envs {
			env[k] = v
		}
	}
	// Every command's output goes to the sandbox's log too, with its pid.
	pid := 0
	return ag.Exec(ctx, agent.ExecRequest{
		Cmd: req.Cmd, Shell: req.Shell, Env: env, User: req.User, Workdir: req.Workdir, TimeoutMs: req.TimeoutMs,
	}, func(ev agent.Event) error {
		switch {
		case ev.Pid != nil:
			pid = *ev.Pid
			s.logs.add(id, LogLine{Type: "lifecycle", Message: "exec " + strings.Join(req.Cmd, " "), Pid: pid})
		case ev.Line != nil:
			s.logs.add(id, LogLine{Type: ev.Stream, Message: *ev.Line, Pid: pid})
		case ev.ExitCode != nil:
			s.logs.add(id, LogLine{Type: "lifecycle", Message: strings.TrimSpace(fmt.Sprintf("exit %d %s", *ev.ExitCode, ev.Error)), Pid: pid})
		}
		return onEvent(ev)
	})
}

func sortRecords(rs []Record) {
	sort.Slice(rs, func(i, j int) bool {
		if !rs[i].StartedAt.Equal(rs[j].StartedAt) {
			return rs[i].StartedAt.Before(rs[j].StartedAt)
		}
		return rs[i].ID < rs[j].ID
	})
}
