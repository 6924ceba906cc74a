package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
)

// The terminal route's WebSocket subprotocols: the server always answers
// TerminalProtocol; a client that cannot set headers (a browser) may offer
// its API key as one more entry, TerminalKeyProtocol followed by the key.
const (
	TerminalProtocol    = "lizard.terminal.v1"
	TerminalKeyProtocol = "lizard.key."
)

// Terminal limits.
const (
	maxTerminalSize = 10000 // cols and rows
	maxTerminalMsg  = 1 << 20
	// hangupTimeout bounds the SIGHUP sent when the client leaves first.
	hangupTimeout = 10 * time.Second
)

// loginShell starts the user's login shell: bash when the template has it.
const loginShell = `if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi`

// TerminalControl is a text message of the terminal route: a resize from
// the client, the exit from the server.
type TerminalControl struct {
	Type     string `json:"type"` // "resize" or "exit"
	Cols     int    `json:"cols,omitempty"`
	Rows     int    `json:"rows,omitempty"`
	ExitCode *int   `json:"exitCode,omitempty"`
}

// browserKey lets a WebSocket client that cannot set headers authenticate:
// without X-API-Key or Authorization, the key is taken from a
// Sec-WebSocket-Protocol entry TerminalKeyProtocol+KEY, or the api_key
// query parameter.
func browserKey(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-API-Key") == "" && r.Header.Get("Authorization") == "" {
			key := r.URL.Query().Get("api_key")
			for _, h := range r.Header.Values("Sec-WebSocket-Protocol") {
				for _, p := range strings.Split(h, ",") {
					if k, ok := strings.CutPrefix(strings.TrimSpace(p), TerminalKeyProtocol); ok {
						key = k
					}
				}
			}
			if key != "" {
				r.Header.Set("X-API-Key", key)
			}
		}
		next.ServeHTTP(w, r)
	})
}

// terminal is GET /api/sandboxes/{id}/terminal?cols=&rows=&cmd=: a login
// shell (or cmd) on a pty in the sandbox, over a WebSocket. Binary messages
// are terminal bytes both ways; text messages are TerminalControl. Every
// refusal (bad size, unknown sandbox, not a WebSocket) is a JSON error
// before the upgrade.
func (s *server) terminal(w http.ResponseWriter, r *http.Request, p store.Project) error {
	q := r.URL.Query()
	cols, err := terminalSize(q.Get("cols"), "cols", 80)
	if err != nil {
		return err
	}
	rows, err := terminalSize(q.Get("rows"), "rows", 24)
	if err != nil {
		return err
	}
	cmd := q.Get("cmd")
	if strings.IndexByte(cmd, 0) >= 0 {
		return fmt.Errorf("cmd: contains a NUL byte: %w", errdefs.ErrInvalid)
	}
	if cmd == "" {
		cmd = loginShell
	}
	id := r.PathValue("id")
	if _, err := s.sandboxes.Get(p.ID, id); err != nil {
		return err
	}
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		return errdefs.WithCode("websocket_required",
			fmt.Errorf("this route is a WebSocket: send Upgrade: websocket: %w", errdefs.ErrInvalid))
	}
	ag, pid, err := s.sandboxes.StartProcess(r.Context(), p.ID, id, agent.StartRequest{
		ExecRequest: agent.ExecRequest{
			Cmd: []string{cmd}, Shell: true, Tag: "terminal",
			Env: map[string]string{"TERM": "xterm-256color"},
		},
		Pty: &agent.PtySize{Cols: cols, Rows: rows},
	})
	if err != nil {
		return err
	}
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{TerminalProtocol}})
	if err != nil {
		// Accept has answered the client.
		s.hangup(ag, id, pid)
		return nil
	}
	s.relayTerminal(r.Context(), c, ag, id, pid)
	return nil
}

func terminalSize(v, field string, def int) (int, error) {
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > maxTerminalSize {
		return 0, fmt.Errorf("%s %q: must be a number from 1 to %d: %w", field, v, maxTerminalSize, errdefs.ErrInvalid)
	}
	return n, nil
}

// relayTerminal copies the pty's output to the client and the client's
// input and resizes to the pty until the process exits (then the client
// gets the exit message and a normal close) or the client leaves (then the
// process tree gets SIGHUP, as on a terminal's hangup).
func (s *server) relayTerminal(ctx context.Context, c *websocket.Conn, ag *agent.Client, id string, pid int) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c.SetReadLimit(maxTerminalMsg)
	var wg sync.WaitGroup
	exited := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer cancel()
		err := ag.Output(ctx, pid, func(o agent.Output) error {
			if o.ExitCode != nil {
				close(exited)
				msg, _ := json.Marshal(TerminalControl{Type: "exit", ExitCode: o.ExitCode})
				return c.Write(ctx, websocket.MessageText, msg)
			}
			if len(o.Data) == 0 {
				return nil
			}
			return c.Write(ctx, websocket.MessageBinary, o.Data)
		})
		switch {
		case err == nil:
			c.Close(websocket.StatusNormalClosure, "exited")
		case ctx.Err() == nil:
			s.log.Warn("terminal output lost", "sandbox", id, "pid", pid, "err", err)
			c.Close(websocket.StatusInternalError, "lost the terminal's output")
		}
	}()
	s.terminalInput(ctx, c, ag, pid)
	cancel()
	wg.Wait()
	select {
	case <-exited:
	default:
		s.hangup(ag, id, pid)
		c.CloseNow()
	}
}

// terminalInput forwards the client's messages until the connection ends.
func (s *server) terminalInput(ctx context.Context, c *websocket.Conn, ag *agent.Client, pid int) {
	for {
		typ, data, err := c.Read(ctx)
		if err != nil {
			return
		}
		if typ == websocket.MessageBinary {
			if err := ag.WriteStdin(ctx, pid, data); err != nil && !exitedErr(err) {
				return
			}
			continue
		}
		var m TerminalControl
		if err := json.Unmarshal(data, &m); err != nil || m.Type != "resize" {
			c.Close(websocket.StatusUnsupportedData, `text messages must be {"type":"resize","cols":N,"rows":N}`)
			return
		}
		if m.Cols < 1 || m.Cols > maxTerminalSize || m.Rows < 1 || m.Rows > maxTerminalSize {
			c.Close(websocket.StatusPolicyViolation, fmt.Sprintf("resize: cols and rows must be 1 to %d", maxTerminalSize))
			return
		}
		if err := ag.Resize(ctx, pid, m.Cols, m.Rows); err != nil && !exitedErr(err) {
			return
		}
	}
}

// exitedErr is the agent refusing input because the process has exited:
// the output side is about to send the exit, so reading goes on.
func exitedErr(err error) bool { return errors.Is(err, errdefs.ErrConflict) }

// hangup signals the terminal's process tree that its terminal is gone.
func (s *server) hangup(ag *agent.Client, id string, pid int) {
	ctx, cancel := context.WithTimeout(context.Background(), hangupTimeout)
	defer cancel()
	if err := ag.Signal(ctx, pid, "SIGHUP"); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		s.log.Warn("terminal hangup failed", "sandbox", id, "pid", pid, "err", err)
	}
}
