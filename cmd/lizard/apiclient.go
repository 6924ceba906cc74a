package main

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
	"os"
	"strings"
)

// defaultAPIURL is `lizard serve`'s default address; LIZARD_API_URL
// overrides it, as for the SDKs.
const defaultAPIURL = "http://127.0.0.1:8080"

// apiClient is the CLI's one HTTP client of the lizard API.
type apiClient struct {
	base string
	key  string
	hc   *http.Client
}

// newAPIClient reads LIZARD_API_URL and LIZARD_API_KEY.
func newAPIClient() (*apiClient, error) {
	key := os.Getenv("LIZARD_API_KEY")
	if key == "" {
		return nil, errors.New("LIZARD_API_KEY is not set (create a key with `lizard keys create --project P`)")
	}
	base := os.Getenv("LIZARD_API_URL")
	if base == "" {
		base = defaultAPIURL
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("LIZARD_API_URL %q: must be an http:// or https:// URL", base)
	}
	return &apiClient{base: strings.TrimRight(base, "/"), key: key, hc: &http.Client{}}, nil
}

// apiError is an error answer of the API.
type apiError struct {
	Status  int
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *apiError) Error() string {
	if e.Code == "" {
		return fmt.Sprintf("API answered %d: %s", e.Status, e.Message)
	}
	return fmt.Sprintf("%s (%d %s)", e.Message, e.Status, e.Code)
}

// request sends one request. in is sent as JSON unless it is an io.Reader
// (sent as is) or nil. A non-2xx answer becomes an *apiError.
func (c *apiClient) request(ctx context.Context, method, path string, in any, hdr http.Header) (*http.Response, error) {
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
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	e := &apiError{Status: resp.StatusCode}
	if json.Unmarshal(b, e) != nil || e.Message == "" {
		e.Message = strings.TrimSpace(string(b))
	}
	return nil, e
}

// call sends in and returns the answer's body (nil for 204).
func (c *apiClient) call(ctx context.Context, method, path string, in any) (json.RawMessage, error) {
	resp, err := c.request(ctx, method, path, in, nil)
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

// callInto decodes the answer into out and returns it raw too (for --json).
func (c *apiClient) callInto(ctx context.Context, method, path string, in, out any) (json.RawMessage, error) {
	b, err := c.call(ctx, method, path, in)
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, out); err != nil {
		return nil, fmt.Errorf("decoding the answer to %s %s: %w", method, path, err)
	}
	return b, nil
}

// events sends a request answered with Server-Sent Events and calls fn
// with each event's data until the stream ends or fn returns an error
// (errStop ends it cleanly).
func (c *apiClient) events(ctx context.Context, method, path string, in any, fn func(data []byte) error) error {
	resp, err := c.request(ctx, method, path, in, http.Header{"Accept": {"text/event-stream"}})
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
			if errors.Is(err, errStop) {
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

// errStop ends an event stream without error.
var errStop = errors.New("stop")

// printJSON prints an answer of the API as it came, indented.
func printJSON(raw json.RawMessage) error {
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		buf.Reset()
		buf.Write(raw)
	}
	buf.WriteByte('\n')
	_, err := os.Stdout.Write(buf.Bytes())
	return err
}

// exitStatus makes the CLI exit with a remote command's status, without a
// message.
type exitStatus int

func (e exitStatus) Error() string { return fmt.Sprintf("exit status %d", int(e)) }
