package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/tracing"
)

// maxErrorBody bounds how much of an error answer the client reads.
const maxErrorBody = 64 << 10

// Client is the node's handle on one sandbox's agent. Its errors wrap an
// errdefs class: the agent's error code decides it, and failures to reach
// the agent are errdefs.ErrUnavailable.
type Client struct {
	base    string
	token   string
	hc      *http.Client
	version atomic.Int32 // last reported by Health; 0 until asked
}

// NewClient returns a client for the agent at baseURL (e.g.
// "http://10.250.0.5:49983") using token. hc nil means a plain client; it
// should have no overall Timeout, which would cut long exec streams (use
// contexts instead).
func NewClient(baseURL, token string, hc *http.Client) *Client {
	if hc == nil {
		hc = &http.Client{}
	}
	return &Client{base: strings.TrimRight(baseURL, "/"), token: token, hc: hc}
}

// Health asks whether the agent is up.
func (c *Client) Health(ctx context.Context) (Health, error) {
	var h Health
	err := c.call(ctx, http.MethodGet, "/health", nil, nil, &h)
	if err == nil {
		if h.Version == 0 {
			h.Version = 1 // an agent from before versions were reported
		}
		c.version.Store(int32(h.Version))
	}
	return h, err
}

// Version is the protocol version the agent reported at its last Health
// (1 for an agent that reports none); 0 before the first answer.
func (c *Client) Version() int { return int(c.version.Load()) }

// BackgroundLogs returns the output background processes wrote after
// their exec's stream ended, from line number after on.
func (c *Client) BackgroundLogs(ctx context.Context, after int64) (LogsReply, error) {
	var rep LogsReply
	err := c.callQuery(ctx, "/logs", url.Values{"after": {strconv.FormatInt(after, 10)}}, &rep)
	return rep, err
}

// SetToken makes the agent accept only token from now on; the client uses
// it too. Call it before the client is shared: it is not safe to run
// concurrently with other calls.
func (c *Client) SetToken(ctx context.Context, token string) error {
	if err := c.call(ctx, http.MethodPost, "/token", nil, TokenRequest{Token: token}, nil); err != nil {
		return err
	}
	c.token = token
	return nil
}

// SetEnvdToken gives envd (E2B's protocol, served beside the agent's own)
// the access token it must require in X-Access-Token when secure; without
// secure it requires none. It keeps the command defaults envd was given.
func (c *Client) SetEnvdToken(ctx context.Context, token string, secure bool) error {
	return c.SetEnvd(ctx, EnvdRequest{Token: token, Secure: secure, KeepDefaults: true})
}

// SetEnvd configures envd: its access token and the sandbox's command
// defaults (user, workdir, envs) for E2B clients.
func (c *Client) SetEnvd(ctx context.Context, req EnvdRequest) error {
	return c.call(ctx, http.MethodPost, "/envd/token", nil, req, nil)
}

// Exec runs a command and calls fn with each event as it arrives: {pid}
// first, then output lines, then the exit code. It returns after the exit
// event, or fn's error as soon as fn returns one (the command keeps running
// in the sandbox).
func (c *Client) Exec(ctx context.Context, req ExecRequest, fn func(Event) error) error {
	body, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("encoding exec request: %w: %w", err, errdefs.ErrInvalid)
	}
	resp, err := c.do(ctx, http.MethodPost, "/exec", nil, bytes.NewReader(body), "application/json")
	if err != nil {
		return err
	}
	return readStream(resp, "exec", func(ev Event) (bool, error) { return ev.ExitCode != nil, fn(ev) })
}

// readStream decodes an NDJSON stream of T into fn until fn says the last
// event came (then it reads the stream's end, so the connection can be
// reused) or returns an error. A stream that ends before is ErrUnavailable.
func readStream[T any](resp *http.Response, what string, fn func(T) (last bool, err error)) error {
	defer resp.Body.Close()
	// A Decoder has no line-length limit: output lines can be long.
	dec := json.NewDecoder(resp.Body)
	for {
		var ev T
		if err := dec.Decode(&ev); err != nil {
			if errors.Is(err, io.EOF) {
				return fmt.Errorf("agent %s stream ended before the exit code: %w", what, errdefs.ErrUnavailable)
			}
			return fmt.Errorf("reading agent %s stream: %w: %w", what, err, errdefs.ErrUnavailable)
		}
		last, err := fn(ev)
		if err != nil {
			return err
		}
		if last {
			io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			return nil
		}
	}
}

// Start starts a process that outlives the call (on a pty with req.Pty,
// with a stdin pipe with req.Stdin) and returns its pid. Attach to its
// output with Output.
func (c *Client) Start(ctx context.Context, req StartRequest) (int, error) {
	var rep StartReply
	if err := c.call(ctx, http.MethodPost, "/processes", nil, req, &rep); err != nil {
		return 0, err
	}
	return rep.Pid, nil
}

// Output attaches to the output of a process of Start and calls fn with
// each event: the output the agent kept, live output, the exit last. It
// returns after the exit event, or fn's error (the process runs on; so it
// does when ctx ends).
func (c *Client) Output(ctx context.Context, pid int, fn func(Output) error) error {
	resp, err := c.do(ctx, http.MethodGet, procPath(pid, "output"), nil, nil, "")
	if err != nil {
		return err
	}
	return readStream(resp, "output", func(o Output) (bool, error) { return o.ExitCode != nil, fn(o) })
}

// WriteStdin sends data to the stdin (or pty) of a process of Start.
func (c *Client) WriteStdin(ctx context.Context, pid int, data []byte) error {
	resp, err := c.do(ctx, http.MethodPost, procPath(pid, "stdin"), nil, bytes.NewReader(data), "application/octet-stream")
	if err != nil {
		return err
	}
	return drain(resp)
}

// CloseStdin closes the stdin pipe of a process of Start.
func (c *Client) CloseStdin(ctx context.Context, pid int) error {
	return c.call(ctx, http.MethodDelete, procPath(pid, "stdin"), nil, nil, nil)
}

// Resize sets the pty size of a process of Start.
func (c *Client) Resize(ctx context.Context, pid, cols, rows int) error {
	return c.call(ctx, http.MethodPost, procPath(pid, "resize"), nil, ResizeRequest{Cols: cols, Rows: rows}, nil)
}

func procPath(pid int, op string) string {
	return "/processes/" + strconv.Itoa(pid) + "/" + op
}

// Processes lists the running exec-started processes.
func (c *Client) Processes(ctx context.Context) ([]Process, error) {
	var ps []Process
	if err := c.call(ctx, http.MethodGet, "/processes", nil, nil, &ps); err != nil {
		return nil, err
	}
	if ps == nil {
		ps = []Process{}
	}
	return ps, nil
}

// Signal sends sig (e.g. "SIGTERM") to the process tree of pid.
func (c *Client) Signal(ctx context.Context, pid int, sig string) error {
	return c.call(ctx, http.MethodPost, "/processes/signal", nil, SignalRequest{Pid: pid, Signal: sig}, nil)
}

// ReadFile streams the file at path, read as user. The caller closes it; a
// download cut short surfaces as a read error.
func (c *Client) ReadFile(ctx context.Context, path, user string) (io.ReadCloser, error) {
	resp, err := c.do(ctx, http.MethodGet, "/files", fileQuery(path, user), nil, "")
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// WriteFile replaces the file at path, as user, with the bytes of r,
// creating parent directories.
func (c *Client) WriteFile(ctx context.Context, path, user string, r io.Reader) error {
	if r == nil {
		r = http.NoBody
	}
	resp, err := c.do(ctx, http.MethodPut, "/files", fileQuery(path, user), r, "application/octet-stream")
	if err != nil {
		return err
	}
	return drain(resp)
}

// Remove removes path, recursively for a directory, as user.
func (c *Client) Remove(ctx context.Context, path, user string) error {
	resp, err := c.do(ctx, http.MethodDelete, "/files", fileQuery(path, user), nil, "")
	if err != nil {
		return err
	}
	return drain(resp)
}

// List lists the directory path as user.
func (c *Client) List(ctx context.Context, path, user string) ([]FileEntry, error) {
	var es []FileEntry
	if err := c.callQuery(ctx, "/files/list", fileQuery(path, user), &es); err != nil {
		return nil, err
	}
	if es == nil {
		es = []FileEntry{}
	}
	return es, nil
}

// Stat describes path (a symlink itself, not its target) as user.
func (c *Client) Stat(ctx context.Context, path, user string) (FileStat, error) {
	var st FileStat
	err := c.callQuery(ctx, "/files/stat", fileQuery(path, user), &st)
	return st, err
}

// Move renames from to to as user, creating to's parent directories.
func (c *Client) Move(ctx context.Context, from, to, user string) error {
	return c.call(ctx, http.MethodPost, "/files/move", nil, MoveRequest{From: from, To: to, User: user}, nil)
}

// Watch starts a watcher of path (with recursive, of every directory under
// it too) that user must be able to read, and returns its id.
func (c *Client) Watch(ctx context.Context, path string, recursive bool, user string) (string, error) {
	var rep WatchReply
	req := WatchRequest{Path: path, Recursive: recursive, User: user}
	if err := c.call(ctx, http.MethodPost, "/watch", nil, req, &rep); err != nil {
		return "", err
	}
	return rep.WatcherID, nil
}

// WatchEvents drains the events watcher id has queued; never nil.
func (c *Client) WatchEvents(ctx context.Context, id string) ([]WatchEvent, error) {
	var evs []WatchEvent
	if err := c.callQuery(ctx, "/watch/events", url.Values{"watcherId": {id}}, &evs); err != nil {
		return nil, err
	}
	if evs == nil {
		evs = []WatchEvent{}
	}
	return evs, nil
}

// Unwatch closes watcher id.
func (c *Client) Unwatch(ctx context.Context, id string) error {
	return c.call(ctx, http.MethodDelete, "/watch", url.Values{"watcherId": {id}}, nil, nil)
}

func fileQuery(path, user string) url.Values {
	q := url.Values{"path": {path}}
	if user != "" {
		q.Set("user", user)
	}
	return q
}

// call sends in (if not nil) as JSON and decodes the answer into out (if
// not nil).
func (c *Client) call(ctx context.Context, method, path string, query url.Values, in, out any) error {
	var body io.Reader
	ctype := ""
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encoding %s request: %w: %w", path, err, errdefs.ErrInvalid)
		}
		body, ctype = bytes.NewReader(b), "application/json"
	}
	resp, err := c.do(ctx, method, path, query, body, ctype)
	if err != nil {
		return err
	}
	if out == nil {
		return drain(resp)
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		resp.Body.Close()
		return fmt.Errorf("decoding agent answer to %s %s: %w: %w", method, path, err, errdefs.ErrUnavailable)
	}
	return drain(resp)
}

func (c *Client) callQuery(ctx context.Context, path string, query url.Values, out any) error {
	return c.call(ctx, http.MethodGet, path, query, nil, out)
}

// do sends one request and returns a 2xx answer; any other answer becomes
// an error of the agent's class.
func (c *Client) do(ctx context.Context, method, path string, query url.Values, body io.Reader, ctype string) (resp *http.Response, err error) {
	// The span lasts until the answer's body is closed (an exec's
	// stream), and is named by the route: never the query, which holds
	// paths.
	ctx, span := tracing.StartClient(ctx, "agent "+method+" "+route(path))
	defer func() {
		if err != nil {
			tracing.End(span, err)
			return
		}
		if span.IsRecording() {
			span.SetAttributes(semconv.HTTPResponseStatusCode(resp.StatusCode))
			resp.Body = &spanBody{ReadCloser: resp.Body, span: span}
		}
	}()
	u := c.base + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, fmt.Errorf("agent request %s %s: %w: %w", method, u, err, errdefs.ErrInvalid)
	}
	req.Header.Set(TokenHeader, c.token)
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err = c.hc.Do(req)
	if err != nil {
		// The error names the agent's address: for the log only.
		return nil, errdefs.WithCause(errdefs.ErrUnavailable, fmt.Sprintf("agent %s %s: the sandbox's agent did not answer", method, path), err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		defer resp.Body.Close()
		return nil, responseError(resp)
	}
	return resp, nil
}

// route is path with its process ids as {pid}.
func route(path string) string {
	parts := strings.Split(path, "/")
	for i, p := range parts {
		if p != "" && strings.Trim(p, "0123456789") == "" {
			parts[i] = "{pid}"
		}
	}
	return strings.Join(parts, "/")
}

// spanBody ends an agent call's span when its answer is closed.
type spanBody struct {
	io.ReadCloser
	span trace.Span
	once sync.Once
}

func (b *spanBody) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(func() { b.span.End() })
	return err
}

// drain reads and closes a body the caller has no use for, so the
// connection can be reused.
func drain(resp *http.Response) error {
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return fmt.Errorf("reading agent answer: %w: %w", err, errdefs.ErrUnavailable)
	}
	return nil
}

// responseError turns a non-2xx answer into "message: class".
func responseError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	var e Error
	if err := json.Unmarshal(b, &e); err != nil || e.Message == "" {
		e.Message = strings.TrimSpace(string(b))
		if e.Message == "" {
			e.Message = "agent answered " + resp.Status
		}
	}
	return fmt.Errorf("%s: %w", e.Message, errorClass(e.Code, resp.StatusCode))
}

// errorClass maps the agent's error code, or without one its status, to an
// errdefs class.
func errorClass(code string, status int) error {
	switch code {
	case "invalid":
		return errdefs.ErrInvalid
	case "not_found":
		return errdefs.ErrNotFound
	case "permission":
		return errdefs.ErrPermission
	case "conflict":
		return errdefs.ErrConflict
	case "too_large":
		return errdefs.ErrTooLarge
	case "unauthenticated":
		return errdefs.ErrUnauthenticated
	case "":
		return statusClass(status)
	}
	return errdefs.ErrUnavailable
}

func statusClass(status int) error {
	switch status {
	case http.StatusBadRequest:
		return errdefs.ErrInvalid
	case http.StatusUnauthorized:
		return errdefs.ErrUnauthenticated
	case http.StatusForbidden:
		return errdefs.ErrPermission
	case http.StatusNotFound:
		return errdefs.ErrNotFound
	case http.StatusConflict:
		return errdefs.ErrConflict
	case http.StatusRequestEntityTooLarge:
		return errdefs.ErrTooLarge
	}
	return errdefs.ErrUnavailable
}

// DialLoopback returns a connection to port on the sandbox's loopback
// address, through the agent (GET /forward/{port}, an upgrade): how the
// node reaches a server bound to 127.0.0.1 only. dial makes the
// connection to the agent, so the caller decides how it is tracked. An
// agent without the route (older than protocol version 3) and nothing
// listening on the port are ErrNotFound.
func (c *Client) DialLoopback(ctx context.Context, dial func(ctx context.Context, network, addr string) (net.Conn, error), port int) (net.Conn, error) {
	u, err := url.Parse(c.base + "/forward/" + strconv.Itoa(port))
	if err != nil {
		return nil, fmt.Errorf("agent forward: %w: %w", err, errdefs.ErrInvalid)
	}
	conn, err := dial(ctx, "tcp", u.Host)
	if err != nil {
		return nil, fmt.Errorf("agent forward: %w: %w", err, errdefs.ErrUnavailable)
	}
	// The upgrade is made on a connection of its own, which then belongs
	// to the caller: net/http's client would hand back a body, not a conn.
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	req, _ := http.NewRequest(http.MethodGet, u.String(), nil)
	req.Header.Set(TokenHeader, c.token)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", ForwardUpgrade)
	br := bufio.NewReader(conn)
	var resp *http.Response
	if err = req.Write(conn); err == nil {
		resp, err = http.ReadResponse(br, req)
	}
	if err != nil {
		conn.Close()
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("agent forward: %w: %w", err, errdefs.ErrUnavailable)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer conn.Close()
		return nil, responseError(resp)
	}
	if !stop() {
		conn.Close()
		return nil, fmt.Errorf("agent forward: %w: %w", ctx.Err(), errdefs.ErrUnavailable)
	}
	if br.Buffered() == 0 {
		return conn, nil
	}
	return &bufferedConn{Conn: conn, r: br}, nil
}

// bufferedConn reads first what the reader of the upgrade's answer took
// beyond it.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// CloseWrite half-closes the connection, as a *net.TCPConn does.
func (c *bufferedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}
