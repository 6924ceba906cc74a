package sandbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/errdefs"
)

// The desktop runs in the sandbox (the desktop template's lizard-desktop
// starts Xvfb, openbox, x11vnc and websockify); the service starts and stops
// it through the agent and publishes its two noVNC pages on the preview
// proxy, each with a token of its own.
const (
	// DesktopPort serves noVNC for the interactive VNC server.
	DesktopPort = 6080
	// DesktopViewOnlyPort serves noVNC for the view-only VNC server, which
	// ignores every input (x11vnc -viewonly).
	DesktopViewOnlyPort = 6081

	DefaultDesktopWidth  = 1280
	DefaultDesktopHeight = 800
	MinDesktopWidth      = 640
	MaxDesktopWidth      = 3840
	MinDesktopHeight     = 480
	MaxDesktopHeight     = 2160

	// desktopTimeoutMs bounds one lizard-desktop call: a start waits for up
	// to 20 s per component it starts.
	desktopTimeoutMs = 120_000
)

// DesktopSize is a desktop's screen size in pixels.
type DesktopSize struct {
	Width  int `json:"width"`
	Height int `json:"height"`
}

// Desktop is the state of a sandbox's desktop.
type Desktop struct {
	Running bool
	// Size is the running desktop's, or the last started one's; nil if the
	// desktop was never started.
	Size *DesktopSize
	// Token and ViewOnlyToken admit requests to DesktopPort and
	// DesktopViewOnlyPort; "" if the desktop was never started.
	Token, ViewOnlyToken string
}

// ValidDesktopSize checks a requested size; 0x0 means the default.
func ValidDesktopSize(width, height int) (DesktopSize, error) {
	if width == 0 && height == 0 {
		return DesktopSize{DefaultDesktopWidth, DefaultDesktopHeight}, nil
	}
	if width == 0 || height == 0 {
		return DesktopSize{}, fmt.Errorf("width and height: pass both or neither: %w", errdefs.ErrInvalid)
	}
	if width < MinDesktopWidth || width > MaxDesktopWidth {
		return DesktopSize{}, fmt.Errorf("width %d: must be %d to %d: %w", width, MinDesktopWidth, MaxDesktopWidth, errdefs.ErrInvalid)
	}
	if height < MinDesktopHeight || height > MaxDesktopHeight {
		return DesktopSize{}, fmt.Errorf("height %d: must be %d to %d: %w", height, MinDesktopHeight, MaxDesktopHeight, errdefs.ErrInvalid)
	}
	return DesktopSize{width, height}, nil
}

// StartDesktop starts the sandbox's desktop at size (if it is not running:
// a running desktop keeps its size) and publishes its pages.
func (s *Service) StartDesktop(ctx context.Context, projectID, id string, size DesktopSize) (Desktop, error) {
	e, err := s.lookup(projectID, id)
	if err != nil {
		return Desktop{}, err
	}
	e.desktop.Lock()
	defer e.desktop.Unlock()
	running, got, err := s.lizardDesktop(ctx, projectID, id, "start", strconv.Itoa(size.Width), strconv.Itoa(size.Height))
	if err != nil {
		return Desktop{}, err
	}
	if !running {
		return Desktop{}, fmt.Errorf("sandbox %q: the desktop stopped as it started: %w", id, errdefs.ErrUnavailable)
	}
	token, err := s.Expose(ctx, projectID, id, DesktopPort, OwnToken())
	if err != nil {
		return Desktop{}, err
	}
	viewToken, err := s.Expose(ctx, projectID, id, DesktopViewOnlyPort, OwnToken())
	if err != nil {
		return Desktop{}, err
	}
	if err := s.setDesktopSize(ctx, e, id, got); err != nil {
		return Desktop{}, err
	}
	return Desktop{Running: true, Size: &got, Token: token, ViewOnlyToken: viewToken}, nil
}

// DesktopState answers whether the desktop runs, and its size and tokens,
// without starting it.
func (s *Service) DesktopState(ctx context.Context, projectID, id string) (Desktop, error) {
	e, err := s.lookup(projectID, id)
	if err != nil {
		return Desktop{}, err
	}
	e.desktop.Lock()
	defer e.desktop.Unlock()
	running, got, err := s.lizardDesktop(ctx, projectID, id, "status")
	if err != nil {
		return Desktop{}, err
	}
	s.mu.Lock()
	rec := e.rec
	s.mu.Unlock()
	d := Desktop{Running: running, Token: rec.PortTokens[DesktopPort], ViewOnlyToken: rec.PortTokens[DesktopViewOnlyPort]}
	switch {
	case running:
		d.Size = &got
	case rec.Desktop != nil:
		last := *rec.Desktop
		d.Size = &last
	}
	return d, nil
}

// StopDesktop takes the desktop's pages off the proxy and stops it. The
// tokens are kept: the next start has the same URLs.
func (s *Service) StopDesktop(ctx context.Context, projectID, id string) error {
	e, err := s.lookup(projectID, id)
	if err != nil {
		return err
	}
	e.desktop.Lock()
	defer e.desktop.Unlock()
	// A template without a desktop fails here, before anything changes.
	if _, _, err := s.lizardDesktop(ctx, projectID, id, "status"); err != nil {
		return err
	}
	for _, port := range []int{DesktopPort, DesktopViewOnlyPort} {
		if err := s.Unexpose(ctx, projectID, id, port); err != nil {
			return err
		}
	}
	_, _, err = s.lizardDesktop(ctx, projectID, id, "stop")
	return err
}

func (s *Service) setDesktopSize(ctx context.Context, e *entry, id string, size DesktopSize) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	s.mu.Lock()
	if e.gone {
		s.mu.Unlock()
		return notFound(id)
	}
	e.rec.Desktop = &size
	rec := e.rec
	s.mu.Unlock()
	return s.persist(ctx, rec)
}

// lizardDesktop runs lizard-desktop in the sandbox as root and reads the
// state it prints last: "running W H" or "stopped". Exit 127 (no such
// program) means the sandbox's template has no desktop.
func (s *Service) lizardDesktop(ctx context.Context, projectID, id string, args ...string) (bool, DesktopSize, error) {
	var stdout, stderr []string
	exit := -1
	errText := ""
	err := s.Exec(ctx, projectID, id, ExecRequest{Cmd: append([]string{"lizard-desktop"}, args...), TimeoutMs: desktopTimeoutMs},
		func(ev agent.Event) error {
			switch {
			case ev.Line != nil && ev.Stream == "stdout":
				stdout = append(stdout, *ev.Line)
			case ev.Line != nil && len(stderr) < 20:
				stderr = append(stderr, *ev.Line)
			case ev.ExitCode != nil:
				exit, errText = *ev.ExitCode, ev.Error
			}
			return nil
		})
	if err != nil {
		return false, DesktopSize{}, err
	}
	if exit == 127 {
		return false, DesktopSize{}, errdefs.WithCode("desktop_not_supported", fmt.Errorf(
			"sandbox %q has no desktop: create it from the desktop template: %w", id, errdefs.ErrInvalid))
	}
	if exit != 0 {
		msg := strings.TrimSpace(strings.Join(stderr, "\n"))
		if msg == "" {
			msg = errText
		}
		return false, DesktopSize{}, fmt.Errorf("sandbox %q: lizard-desktop %s: exit %d: %s: %w", id, args[0], exit, msg, errdefs.ErrUnavailable)
	}
	last := ""
	if len(stdout) > 0 {
		last = strings.TrimSpace(stdout[len(stdout)-1])
	}
	running, size, err := parseDesktopState(last)
	if err != nil {
		return false, DesktopSize{}, fmt.Errorf("sandbox %q: lizard-desktop %s: %w", id, args[0], err)
	}
	return running, size, nil
}

// parseDesktopState reads lizard-desktop's "running W H" or "stopped".
func parseDesktopState(line string) (bool, DesktopSize, error) {
	f := strings.Fields(line)
	if len(f) == 1 && f[0] == "stopped" {
		return false, DesktopSize{}, nil
	}
	if len(f) == 3 && f[0] == "running" {
		w, errW := strconv.Atoi(f[1])
		h, errH := strconv.Atoi(f[2])
		if err := errors.Join(errW, errH); err == nil && w > 0 && h > 0 {
			return true, DesktopSize{w, h}, nil
		}
	}
	return false, DesktopSize{}, fmt.Errorf("unexpected state %q: %w", line, errdefs.ErrUnavailable)
}
