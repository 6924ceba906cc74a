// Package apiclient is the Go client of lizard's HTTP API: one request path
// that sends the API key, the API's JSON errors as *Error, and streams of
// Server-Sent Events. `lizard sandbox …` (cmd/lizard) and the MCP server
// (internal/mcp) call the API through it, as the SDKs and the dashboard do,
// so that there is no second way into the sandbox service; InProcess serves
// its requests with the server's own API handler, without a network hop.
// It imports nothing of lizard's; anything may import it.
package apiclient

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Client is a client of one lizard API with one API key.
type Client struct {
	base string
	key  string
	hc   *http.Client
}

// New returns a client of the API at base (an http:// or https:// URL)
// that sends key. hc nil is a plain http.Client.
func New(base, key string, hc *http.Client) (*Client, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("API URL %q: must be an http:// or https:// URL", base)
	}
	if key == "" {
		return nil, errors.New("no API key")
	}
	if hc == nil {
		hc = &http.Client{}
	}
	return &Client{base: strings.TrimRight(base, "/"), key: key, hc: hc}, nil
}

// Base is the API's URL, without a trailing slash.
func (c *Client) Base() string { return c.base }

// Key is the API key the client sends.
func (c *Client) Key() string { return c.key }

// Error is an error answer of the API: its status, its stable code and the
// message it gives the client.
type Error struct {
	Status  int
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string {
	if e.Code == "" {
		return fmt.Sprintf("API answered %d: %s", e.Status, e.Message)
	}
	return fmt.Sprintf("%s (%d %s)", e.Message, e.Status, e.Code)
}

// ErrorOf reads an error answer (at most 64 KiB of it) into an *Error; a
// body that is not the API's JSON becomes the message as it is.
func ErrorOf(resp *http.Response) *Error {
	e := &Error{Status: resp.StatusCode}
	if resp.Body == nil {
		return e
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if json.Unmarshal(b, e) != nil || e.Message == "" {
		e.Message = strings.TrimSpace(string(b))
	}
	return e
}

// Request sends one request. in is sent as JSON unless it is an io.Reader
// (sent as is) or nil. A non-2xx answer becomes an *Error; a 2xx one is
// the caller's to read and close.
func (c *Client) Request(ctx context.Context, method, path string, in any, hdr http.Header) (*http.Response, error) {
	var body io.Reader
	ctype := ""
	switch v := in.(type) {
	case nil:
	case io.Reader:
		body, ctype = v, "application/octet-stream"
	default:
		b, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		body, ctype = bytes.NewReader(b), "application/json"
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return nil, err
	}
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	req.Header.Set("X-API-Key", c.key)
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer resp.Body.Close()
	return nil, ErrorOf(resp)
}

// Call sends in and returns the answer's body (empty for 204).
func (c *Client) Call(ctx context.Context, method, path string, in any) (json.RawMessage, error) {
	resp, err := c.Request(ctx, method, path, in, nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("reading the answer to %s %s: %w", method, path, err)
	}
	return b, nil
}

// CallInto decodes the answer into out and returns it raw too.
func (c *Client) CallInto(ctx context.Context, method, path string, in, out any) (json.RawMessage, error) {
	b, err := c.Call(ctx, method, path, in)
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, out); err != nil {
		return nil, fmt.Errorf("decoding the answer to %s %s: %w", method, path, err)
	}
	return b, nil
}

// ErrStop, returned by an Events callback, ends the stream without error.
var ErrStop = errors.New("stop")

// Events sends a request answered with Server-Sent Events and calls fn
// with each event's data until the stream ends or fn returns an error
// (ErrStop ends it cleanly). A stream cut short by ctx ends without error:
// the caller knows its ctx.
func (c *Client) Events(ctx context.Context, method, path string, in any, fn func(data []byte) error) error {
	resp, err := c.Request(ctx, method, path, in, http.Header{"Accept": {"text/event-stream"}})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data:")
		if !ok {
			continue
		}
		if err := fn([]byte(strings.TrimSpace(data))); err != nil {
			if errors.Is(err, ErrStop) {
				return nil
			}
			return err
		}
	}
	if err := sc.Err(); err != nil && ctx.Err() == nil {
		return fmt.Errorf("reading the event stream: %w", err)
	}
	return nil
}

// LogLine is a line of a sandbox's log (GET /api/sandboxes/{id}/logs).
type LogLine struct {
	Timestamp time.Time `json:"timestamp"`
	// Type is lifecycle, stdout or stderr.
	Type    string `json:"type"`
	Message string `json:"message"`
	// Pid is the command's that wrote an output line.
	Pid int `json:"pid"`
	// Background marks output a process wrote after its exec returned.
	Background bool `json:"background"`
}

// SandboxPath is the API path of a sandbox, with rest appended.
func SandboxPath(id string, rest ...string) string {
	return "/api/sandboxes/" + url.PathEscape(id) + strings.Join(rest, "")
}
