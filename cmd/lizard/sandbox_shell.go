package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/coder/websocket"
	"golang.org/x/term"

	"github.com/lizard-build/lizard/internal/api"
	"github.com/lizard-build/lizard/internal/apiclient"
)

// sandboxShell is an interactive terminal in the sandbox: the local
// terminal in raw mode (so Ctrl-C and every other key go to the sandbox as
// bytes, and its pty turns them into signals), window size changes
// forwarded, and the CLI exits with the remote shell's status.
func sandboxShell(ctx context.Context, c *apiclient.Client, args []string) error {
	fs, _ := sandboxFlags("shell")
	cmd := fs.String("cmd", "", "run this command on the terminal instead of a login shell")
	id, err := oneID(fs, args)
	if err != nil {
		return err
	}
	in, out := int(os.Stdin.Fd()), int(os.Stdout.Fd())
	interactive := term.IsTerminal(in)
	cols, rows := 80, 24
	if w, h, err := term.GetSize(out); err == nil {
		cols, rows = w, h
	}
	q := url.Values{"cols": {strconv.Itoa(cols)}, "rows": {strconv.Itoa(rows)}}
	if *cmd != "" {
		q.Set("cmd", *cmd)
	}
	conn, err := dialTerminal(ctx, c, id, q)
	if err != nil {
		return err
	}
	defer conn.CloseNow()
	conn.SetReadLimit(16 << 20)

	if interactive {
		old, err := term.MakeRaw(in)
		if err != nil {
			return fmt.Errorf("putting the terminal in raw mode: %w", err)
		}
		defer term.Restore(in, old)
	}
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	defer signal.Stop(winch)
	go forwardResizes(ctx, conn, out, winch)
	go forwardInput(ctx, conn, os.Stdin)

	for {
		typ, data, err := conn.Read(ctx)
		if err != nil {
			if s := websocket.CloseStatus(err); s != -1 {
				var ce websocket.CloseError
				errors.As(err, &ce)
				return fmt.Errorf("the terminal closed without the shell's exit status (%d %s)", s, ce.Reason)
			}
			return fmt.Errorf("terminal connection: %w", err)
		}
		if typ == websocket.MessageBinary {
			if _, err := os.Stdout.Write(data); err != nil {
				return err
			}
			continue
		}
		var m api.TerminalControl
		if json.Unmarshal(data, &m) == nil && m.Type == "exit" && m.ExitCode != nil {
			conn.Close(websocket.StatusNormalClosure, "")
			return exitWith(*m.ExitCode)
		}
	}
}

// dialTerminal opens the sandbox's terminal route; a refusal before the
// upgrade is the API's JSON error.
func dialTerminal(ctx context.Context, c *apiclient.Client, id string, q url.Values) (*websocket.Conn, error) {
	u := c.Base() + apiclient.SandboxPath(id, "/terminal") + "?" + q.Encode()
	if rest, ok := strings.CutPrefix(u, "http"); ok {
		u = "ws" + rest // http→ws, https→wss
	}
	conn, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{
		HTTPHeader:   http.Header{"X-API-Key": {c.Key()}},
		Subprotocols: []string{api.TerminalProtocol},
	})
	if err == nil {
		return conn, nil
	}
	if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
		return nil, apiclient.ErrorOf(resp)
	}
	return nil, fmt.Errorf("opening the terminal of %s: %w", id, err)
}

// forwardInput sends what is typed as binary messages.
func forwardInput(ctx context.Context, conn *websocket.Conn, r io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if conn.Write(ctx, websocket.MessageBinary, buf[:n]) != nil {
				return
			}
		}
		if err != nil {
			// End of input (a pipe): the remote side gets Ctrl-D, as a
			// terminal would send.
			if errors.Is(err, io.EOF) {
				_ = conn.Write(ctx, websocket.MessageBinary, []byte{4})
			}
			return
		}
	}
}

// forwardResizes sends the terminal's size at every SIGWINCH.
func forwardResizes(ctx context.Context, conn *websocket.Conn, fd int, winch <-chan os.Signal) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-winch:
		}
		w, h, err := term.GetSize(fd)
		if err != nil {
			continue
		}
		msg, _ := json.Marshal(api.TerminalControl{Type: "resize", Cols: w, Rows: h})
		if conn.Write(ctx, websocket.MessageText, msg) != nil {
			return
		}
	}
}
