package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/store"
)

// maxOutput caps each stream of a plain (non-streamed) exec reply.
const maxOutput = 512 << 10

// command is exec's cmd: a string run by a shell, or an argv array.
type command struct {
	argv  []string
	shell bool
}

func (c *command) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		c.argv, c.shell = []string{s}, true
		return nil
	}
	var argv []string
	if err := json.Unmarshal(b, &argv); err != nil {
		return fmt.Errorf("cmd: must be a string or an array of strings: %w", errdefs.ErrInvalid)
	}
	c.argv = argv
	return nil
}

type execRequest struct {
	Cmd       *command          `json:"cmd"`
	Envs      map[string]string `json:"envs"`
	User      string            `json:"user"`
	Workdir   string            `json:"workdir"`
	TimeoutMs int64             `json:"timeoutMs"`
	PidEvent  bool              `json:"pidEvent"`
}

type execReply struct {
	Stdout    string `json:"stdout"`
	Stderr    string `json:"stderr"`
	ExitCode  int    `json:"exitCode"`
	Truncated bool   `json:"truncated,omitempty"`
}

func (s *server) exec(w http.ResponseWriter, r *http.Request, p store.Project) error {
	var req execRequest
	if err := decode(w, r, maxBody, &req); err != nil {
		return err
	}
	if req.Cmd == nil {
		return fmt.Errorf("cmd: required, a string or an array of strings: %w", errdefs.ErrInvalid)
	}
	sreq := sandbox.ExecRequest{
		Cmd: req.Cmd.argv, Shell: req.Cmd.shell, Envs: req.Envs, User: req.User,
		Workdir: req.Workdir, TimeoutMs: req.TimeoutMs,
	}
	id := r.PathValue("id")
	if strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
		return s.execStream(w, r, p, id, sreq, req.PidEvent)
	}
	var out execReply
	var stdout, stderr strings.Builder
	err := s.sandboxes.Exec(r.Context(), p.ID, id, sreq, func(ev agent.Event) error {
		switch {
		case ev.Line != nil:
			b := &stdout
			if ev.Stream == "stderr" {
				b = &stderr
			}
			line := *ev.Line
			if !ev.Partial {
				line += "\n"
			}
			if b.Len()+len(line) > maxOutput {
				out.Truncated = true
				if room := maxOutput - b.Len(); room > 0 {
					b.WriteString(line[:room])
				}
				return nil
			}
			b.WriteString(line)
		case ev.ExitCode != nil:
			out.ExitCode = *ev.ExitCode
		}
		return nil
	})
	if err != nil {
		return err
	}
	out.Stdout, out.Stderr = stdout.String(), stderr.String()
	writeJSON(w, http.StatusOK, out)
	return nil
}

// execStream answers with Server-Sent Events, one per agent event, flushed
// as they come. Once the stream has begun an error can no longer change the
// status, so it ends the stream with an exit event carrying the error.
func (s *server) execStream(w http.ResponseWriter, r *http.Request, p store.Project, id string, req sandbox.ExecRequest, pidEvent bool) error {
	if _, err := s.sandboxes.Get(p.ID, id); err != nil {
		return err
	}
	rc := http.NewResponseController(w)
	started := false
	begin := func() {
		if started {
			return
		}
		started = true
		startEventStream(w)
	}
	send := func(v any) error {
		begin()
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			return err
		}
		return rc.Flush()
	}
	sawExit := false
	err := s.sandboxes.Exec(r.Context(), p.ID, id, req, func(ev agent.Event) error {
		switch {
		case ev.Pid != nil:
			if pidEvent {
				return send(map[string]int{"pid": *ev.Pid})
			}
			begin()
			return rc.Flush()
		case ev.Line != nil:
			return send(map[string]string{"stream": ev.Stream, "line": *ev.Line})
		case ev.ExitCode != nil:
			sawExit = true
			if ev.Error != "" && ev.Error != "timeout" {
				if err := send(map[string]string{"stream": "stderr", "line": ev.Error}); err != nil {
					return err
				}
			}
			return send(map[string]int{"exitCode": *ev.ExitCode})
		}
		return nil
	})
	if err == nil && !sawExit {
		err = fmt.Errorf("the command's stream ended without an exit status: %w", errdefs.ErrUnavailable)
	}
	if err != nil && started {
		if r.Context().Err() == nil {
			_, _, msg := statusOf(err)
			send(map[string]string{"stream": "stderr", "line": "lizard: " + msg})
			send(map[string]int{"exitCode": -1})
		}
		return nil
	}
	return err
}

func (s *server) listProcesses(w http.ResponseWriter, r *http.Request, p store.Project) error {
	ag, _, err := s.sandboxes.Wake(r.Context(), p.ID, r.PathValue("id"))
	if err != nil {
		return err
	}
	procs, err := ag.Processes(r.Context())
	if err != nil {
		return err
	}
	if procs == nil {
		procs = []agent.Process{}
	}
	writeJSON(w, http.StatusOK, procs)
	return nil
}

// signals are the names process signal accepts.
var signals = map[string]bool{
	"SIGTERM": true, "SIGKILL": true, "SIGINT": true, "SIGHUP": true, "SIGQUIT": true, "SIGUSR1": true, "SIGUSR2": true,
}

func (s *server) signalProcess(w http.ResponseWriter, r *http.Request, p store.Project) error {
	var req struct {
		Pid    *int   `json:"pid"`
		Signal string `json:"signal"`
	}
	if err := decode(w, r, maxBody, &req); err != nil {
		return err
	}
	if req.Pid == nil || *req.Pid <= 0 {
		return fmt.Errorf("pid: required, a positive process id: %w", errdefs.ErrInvalid)
	}
	if req.Signal == "" {
		req.Signal = "SIGTERM"
	}
	if !signals[req.Signal] {
		return fmt.Errorf("signal %q: must be one of SIGTERM SIGKILL SIGINT SIGHUP SIGQUIT SIGUSR1 SIGUSR2: %w", req.Signal, errdefs.ErrInvalid)
	}
	ag, _, err := s.sandboxes.Wake(r.Context(), p.ID, r.PathValue("id"))
	if err != nil {
		return err
	}
	if err := ag.Signal(r.Context(), *req.Pid, req.Signal); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
