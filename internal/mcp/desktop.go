package mcp

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/lizard-build/lizard/internal/apiclient"
)

// The desktop tools drive the desktop template's desktop as the dashboard
// and the SDKs do: the API's desktop route starts it, the template's
// lizard-desktop takes screenshots and xdotool sends input, both run
// through the API's exec.

const (
	// desktopProgram is the desktop template's script (start, status,
	// stop, screenshot).
	desktopProgram = "lizard-desktop"
	// display is the desktop's X display.
	display = ":0"
	// maxScreenshot bounds a screenshot's PNG.
	maxScreenshot = 32 << 20
)

type clickIn struct {
	SandboxID string `json:"sandboxId" jsonschema:"the sandbox's id: a sandbox of the desktop template"`
	X         int    `json:"x" jsonschema:"the x coordinate, in pixels from the left of the screenshot"`
	Y         int    `json:"y" jsonschema:"the y coordinate, in pixels from the top of the screenshot"`
	Button    string `json:"button,omitempty" jsonschema:"the mouse button"`
	Double    bool   `json:"double,omitempty" jsonschema:"a double click"`
}

type typeIn struct {
	SandboxID string `json:"sandboxId" jsonschema:"the sandbox's id: a sandbox of the desktop template"`
	Text      string `json:"text" jsonschema:"the text to type, as on a keyboard, into the focused window"`
}

type keyIn struct {
	SandboxID string `json:"sandboxId" jsonschema:"the sandbox's id: a sandbox of the desktop template"`
	Keys      string `json:"keys" jsonschema:"keys to press one after the other, separated by spaces, each an X key name or a combination: Return, Escape, Tab, BackSpace, ctrl+c, alt+F4, ctrl+shift+t"`
}

var buttons = map[string]string{"left": "1", "middle": "2", "right": "3"}

func desktopIDs(p props) { sandboxIDs(p) }

func (t *tools) addDesktopTools(s *sdk.Server) {
	addTool(s, "desktop_screenshot", "Screenshot the desktop",
		"Take a PNG screenshot of a desktop-template sandbox's screen (starting the desktop if it is not running); coordinates for desktop_click are its pixels.",
		reads, desktopIDs, t.screenshot)
	addTool(s, "desktop_click", "Click on the desktop",
		"Move the mouse to (x, y) on a desktop-template sandbox's screen and click.",
		adds, func(p props) {
			desktopIDs(p)
			p.rangeOf("x", 0, 16384)
			p.rangeOf("y", 0, 16384)
			p.enum("button", "left", "middle", "right")
			p.byDefault("button", "left")
		}, func(ctx context.Context, req *sdk.CallToolRequest, in clickIn) (*sdk.CallToolResult, error) {
			repeat := "1"
			if in.Double {
				repeat = "2"
			}
			x, y := strconv.Itoa(in.X), strconv.Itoa(in.Y)
			if err := t.xdotool(ctx, req, in.SandboxID, "mousemove", "--sync", x, y, "click", "--repeat", repeat, buttons[in.Button]); err != nil {
				return nil, err
			}
			return textResult(fmt.Sprintf("clicked %s at (%d, %d)", in.Button, in.X, in.Y), nil), nil
		})
	addTool(s, "desktop_type", "Type on the desktop",
		"Type text into the focused window of a desktop-template sandbox, as on a keyboard.",
		adds, func(p props) { desktopIDs(p); p.nonEmpty("text") },
		func(ctx context.Context, req *sdk.CallToolRequest, in typeIn) (*sdk.CallToolResult, error) {
			if err := t.xdotool(ctx, req, in.SandboxID, "type", "--delay", "12", "--", in.Text); err != nil {
				return nil, err
			}
			return textResult(fmt.Sprintf("typed %d characters", len([]rune(in.Text))), nil), nil
		})
	addTool(s, "desktop_key", "Press keys on the desktop",
		"Press keys or key combinations (Return, ctrl+c, alt+Tab) on a desktop-template sandbox, one after the other.",
		adds, func(p props) { desktopIDs(p); p.nonEmpty("keys") },
		func(ctx context.Context, req *sdk.CallToolRequest, in keyIn) (*sdk.CallToolResult, error) {
			keys := strings.Fields(in.Keys)
			if len(keys) == 0 {
				return nil, errors.New("keys: no key given")
			}
			if err := t.xdotool(ctx, req, in.SandboxID, append([]string{"key", "--delay", "50", "--"}, keys...)...); err != nil {
				return nil, err
			}
			return textResult("pressed "+strings.Join(keys, " "), nil), nil
		})
}

// xdotool runs xdotool with args on the sandbox's display.
func (t *tools) xdotool(ctx context.Context, req *sdk.CallToolRequest, id string, args ...string) error {
	c, err := t.clientOf(req)
	if err != nil {
		return err
	}
	ex, err := execute(ctx, c, id, append([]string{"xdotool"}, args...), execOpts{envs: map[string]string{"DISPLAY": display}, user: "root", timeout: time.Minute}, outputCap, nil)
	if err != nil {
		return err
	}
	return desktopFailure(id, "xdotool", ex)
}

// desktopFailure is the error of a desktop command that failed, nil if
// it did not.
func desktopFailure(id, what string, ex *execution) error {
	switch ex.exitCode {
	case 0:
		return nil
	case 127:
		return fmt.Errorf("sandbox %s has no desktop (create the sandbox from the desktop template)", id)
	}
	msg := strings.TrimSpace(ex.stderr.String())
	if strings.Contains(msg, "Can't open display") {
		msg = "the desktop is not running: take a desktop_screenshot first, which starts it"
	}
	return fmt.Errorf("%s failed (exit code %d): %s", what, ex.exitCode, msg)
}

func (t *tools) screenshot(ctx context.Context, req *sdk.CallToolRequest, in sandboxRef) (*sdk.CallToolResult, error) {
	c, err := t.clientOf(req)
	if err != nil {
		return nil, err
	}
	p := startProgress(ctx, req, 0, "taking a screenshot")
	defer p.end()
	var d struct {
		Running bool `json:"running"`
	}
	if _, err := c.CallInto(ctx, http.MethodGet, apiclient.SandboxPath(in.SandboxID, "/desktop"), nil, &d); err != nil {
		return nil, err
	}
	if !d.Running {
		p.say("starting the desktop")
		if _, err := c.Call(ctx, http.MethodPost, apiclient.SandboxPath(in.SandboxID, "/desktop"), map[string]any{}); err != nil {
			return nil, err
		}
	}
	ex, err := execute(ctx, c, in.SandboxID, []string{desktopProgram, "screenshot", "--path"}, execOpts{user: "root", timeout: time.Minute}, outputCap, nil)
	if err != nil {
		return nil, err
	}
	if err := desktopFailure(in.SandboxID, desktopProgram+" screenshot", ex); err != nil {
		return nil, err
	}
	path := lastLine(ex.stdout.String())
	png, err := readSandboxFile(ctx, c, in.SandboxID, path, "root", maxScreenshot)
	rmctx, cancel := detached(ctx)
	c.Call(rmctx, http.MethodDelete, apiclient.SandboxPath(in.SandboxID, "/files"), map[string]string{"path": path, "user": "root"})
	cancel()
	if err != nil {
		return nil, err
	}
	w, h := pngSize(png)
	return &sdk.CallToolResult{
		Content: []sdk.Content{
			&sdk.TextContent{Text: fmt.Sprintf("the screen of sandbox %s, %d×%d pixels", in.SandboxID, w, h)},
			&sdk.ImageContent{Data: png, MIMEType: "image/png"},
		},
		StructuredContent: map[string]int{"width": w, "height": h},
	}, nil
}

// pngSize reads a PNG's width and height from its header; 0, 0 if it is
// not a PNG.
func pngSize(b []byte) (int, int) {
	if len(b) < 24 || string(b[1:4]) != "PNG" || string(b[12:16]) != "IHDR" {
		return 0, 0
	}
	return int(binary.BigEndian.Uint32(b[16:20])), int(binary.BigEndian.Uint32(b[20:24]))
}

// readSandboxFile reads a file of the sandbox through the API as user (""
// for the API's default), refusing one larger than limit.
func readSandboxFile(ctx context.Context, c *apiclient.Client, id, path, user string, limit int64) ([]byte, error) {
	resp, err := c.Request(ctx, http.MethodGet, apiclient.SandboxPath(id, "/files?path="+url.QueryEscape(path)+userQuery(user)), nil, nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s is larger than %d MiB: read parts of it with run_command (head -c, tail -c, sed -n)", path, limit>>20)
	}
	return b, nil
}
