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
	if err := CheckEnvs("envs", req.Envs); err != nil {
		return err
	}
	ag, rec, err := s.Wake(ctx, projectID, id)
	if err != nil {
		return err
	}
	env := commandDefaults(rec, &req.User, &req.Workdir, req.Envs)
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

// commandDefaults fills in the user and workdir a template built from a
// Dockerfile sets for commands, unless the request says, and returns the
// create-time envs overridden by the request's.
func commandDefaults(rec Record, user, workdir *string, envs map[string]string) map[string]string {
	if *user == "" {
		*user = rec.User
	}
	if *workdir == "" {
		*workdir = rec.Workdir
	}
	if len(rec.Envs) == 0 {
		return envs
	}
	env := mergeEnv(nil, rec.Envs)
	for k, v := range envs {
		env[k] = v
	}
	return env
}

// StartProcess starts an interactive process (a pty or a stdin pipe, see
// agent.StartRequest) with the sandbox's defaults for user, workdir and
// envs, as Exec does, and returns the agent that runs it with its pid. The
// process is not tied to ctx; the caller attaches to it through the agent.
func (s *Service) StartProcess(ctx context.Context, projectID, id string, req agent.StartRequest) (*agent.Client, int, error) {
	if err := CheckEnvs("envs", req.Env); err != nil {
		return nil, 0, err
	}
	ag, rec, err := s.Wake(ctx, projectID, id)
	if err != nil {
		return nil, 0, err
	}
	req.Env = commandDefaults(rec, &req.User, &req.Workdir, req.Env)
	pid, err := ag.Start(ctx, req)
	if err != nil {
		return nil, 0, err
	}
	s.logs.add(id, LogLine{Type: "lifecycle", Message: "started " + strings.Join(req.Cmd, " "), Pid: pid})
	return ag, pid, nil
}

func sortRecords(rs []Record) {
	sort.Slice(rs, func(i, j int) bool {
		if !rs[i].StartedAt.Equal(rs[j].StartedAt) {
			return rs[i].StartedAt.Before(rs[j].StartedAt)
		}
		return rs[i].ID < rs[j].ID
	})
}
