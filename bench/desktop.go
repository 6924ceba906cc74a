package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/coder/websocket"
)

// desktopResult is how long the desktop takes to come up and to photograph.
type desktopResult struct {
	coldStart, vnc, warmStart, screenshot []time.Duration
}

// benchDesktopTable measures the desktop on n sandboxes of the desktop
// template and prints the table to w:
//   - cold start: POST …/desktop on a fresh sandbox (Xvfb, openbox, two
//     x11vnc, two websockify, the pages exposed), the first start a user pays;
//   - VNC answers: from the start's answer to the RFB greeting of the
//     interactive VNC server over noVNC's WebSocket through the preview
//     proxy, which a browser opening the desktop's URL waits for;
//   - warm start: the same after a stop, in the same sandbox;
//   - screenshot: what the SDK's desktop.screenshot() does — lizard-desktop
//     screenshot --path, read the PNG, delete it — of a 1280x800 screen.
func benchDesktopTable(w io.Writer, s *server, n int) error {
	var r desktopResult
	for range n {
		if err := benchDesktopOnce(s, &r); err != nil {
			return err
		}
	}
	return printStatsTable(w, "desktop", []statsRow{
		{"start on a fresh sandbox", r.coldStart},
		{"VNC greeting through the proxy, after the start", r.vnc},
		{"start after a stop", r.warmStart},
		{"screenshot (1280x800 PNG, read, delete)", r.screenshot},
	})
}

func benchDesktopOnce(s *server, r *desktopResult) error {
	var sb struct {
		SandboxID string `json:"sandboxId"`
	}
	if err := s.post("/api/sandboxes", map[string]any{"template": "desktop", "timeoutMs": 600000}, &sb); err != nil {
		return fmt.Errorf("create a desktop sandbox (is the desktop template built?): %w", err)
	}
	defer s.kill(sb.SandboxID)
	base := "/api/sandboxes/" + sb.SandboxID
	start := func() (time.Duration, error) {
		var d struct {
			Running bool `json:"running"`
		}
		t := time.Now()
		if err := s.post(base+"/desktop", map[string]any{"width": 1280, "height": 800}, &d); err != nil {
			return 0, err
		}
		if !d.Running {
			return 0, fmt.Errorf("desktop start answered running false")
		}
		return time.Since(t), nil
	}
	var desk struct {
		Running bool   `json:"running"`
		URL     string `json:"url"`
	}
	t := time.Now()
	if err := s.post(base+"/desktop", map[string]any{"width": 1280, "height": 800}, &desk); err != nil {
		return err
	}
	if !desk.Running {
		return fmt.Errorf("desktop start answered running false")
	}
	r.coldStart = append(r.coldStart, time.Since(t))
	t = time.Now()
	if err := s.vncGreeting(desk.URL); err != nil {
		return err
	}
	r.vnc = append(r.vnc, time.Since(t))
	for range 3 {
		t := time.Now()
		stdout, err := s.output(sb.SandboxID, map[string]any{"cmd": []string{"lizard-desktop", "screenshot", "--path"}})
		if err != nil {
			return err
		}
		path := strings.TrimSpace(stdout)
		q := "?path=" + url.QueryEscape(path)
		var png []byte
		if err := s.call("GET", base+"/files"+q, nil, &png); err != nil {
			return err
		}
		if err := s.call("DELETE", base+"/files"+q, nil, nil); err != nil {
			return err
		}
		r.screenshot = append(r.screenshot, time.Since(t))
		if !bytes.HasPrefix(png, []byte("\x89PNG")) {
			return fmt.Errorf("screenshot %s is not a PNG (%d bytes)", path, len(png))
		}
	}
	if err := s.call("DELETE", base+"/desktop", nil, nil); err != nil {
		return err
	}
	d, err := start()
	if err != nil {
		return err
	}
	r.warmStart = append(r.warmStart, d)
	return nil
}

// vncGreeting opens noVNC's WebSocket (websockify) of the desktop page at
// pageURL through the preview proxy, as the page does, and reads the VNC
// server's RFB greeting.
func (s *server) vncGreeting(pageURL string) error {
	u, err := url.Parse(pageURL)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws://"+s.proxy+"/websockify", &websocket.DialOptions{
		Host:         u.Host,
		HTTPHeader:   http.Header{"X-Lizard-Access-Token": {u.Query().Get("lizard_token")}},
		Subprotocols: []string{"binary"},
	})
	if err != nil {
		return fmt.Errorf("noVNC's WebSocket through the proxy: %w", err)
	}
	defer c.CloseNow()
	_, greeting, err := c.Read(ctx)
	if err != nil {
		return fmt.Errorf("read the VNC greeting: %w", err)
	}
	if !bytes.HasPrefix(greeting, []byte("RFB 003.")) {
		return fmt.Errorf("the VNC server greeted %q", greeting)
	}
	return nil
}
