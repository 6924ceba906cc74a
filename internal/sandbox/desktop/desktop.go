// Package desktop drives a sandbox's desktop. The desktop runs in the
// sandbox (the desktop template's lizard-desktop starts Xvfb, openbox,
// x11vnc and websockify); this package starts and stops it through the
// sandbox's agent, publishes its two noVNC pages on the preview proxy, each
// with a token of its own, and keeps the size last started in the
// sandbox's record (Record.Desktop).
package desktop

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/sandbox/preview"
)

const (
	// Port serves noVNC for the interactive VNC server.
	Port = 6080
	// ViewOnlyPort serves noVNC for the view-only VNC server, which
	// ignores every input (x11vnc -viewonly).
	ViewOnlyPort = 6081

	DefaultWidth  = 1280
	DefaultHeight = 800
	MinWidth      = 640
	MaxWidth      = 3840
	MinHeight     = 480
	MaxHeight     = 2160

	// callTimeoutMs bounds one lizard-desktop call: a start waits for up
	// to 20 s per component it starts.
	callTimeoutMs = 120_000
)

// Size is a desktop's screen size in pixels.
type Size = sandbox.DesktopSize

// Desktop is the state of a sandbox's desktop.
type Desktop struct {
	Running bool
	// Size is the running desktop's, or the last started one's; nil if the
	// desktop was never started.
	Size *Size
	// Token and ViewOnlyToken admit requests to Port and ViewOnlyPort; ""
	// if the desktop was never started.
	Token, ViewOnlyToken string
}

// Core is what the desktop needs of the sandbox service.
type Core interface {
	Get(projectID, id string) (sandbox.Record, error)
	Exec(ctx context.Context, projectID, id string, req sandbox.ExecRequest, onEvent func(agent.Event) error) error
	Update(ctx context.Context, projectID, id string, fn func(*sandbox.Record) error) (sandbox.Record, error)
}

// Ports publishes the desktop's pages (preview.Service).
type Ports interface {
	Expose(ctx context.Context, projectID, id string, port int, opts ...preview.ExposeOption) (string, error)
	Unexpose(ctx context.Context, projectID, id string, port int) error
}

// Service drives desktops. It is safe for concurrent use: the starts and
// stops of one sandbox's desktop are serialized.
type Service struct {
	core  Core
	ports Ports

	mu    sync.Mutex
	locks map[string]*sandboxLock // by sandbox id, while someone holds it
}

type sandboxLock struct {
	sync.Mutex
	users int
}

// New returns the desktops of core's sandboxes, published through ports.
func New(core Core, ports Ports) *Service {
	return &Service{core: core, ports: ports, locks: map[string]*sandboxLock{}}
}

// lock serializes the desktop calls of one sandbox; the returned func
// unlocks. A sandbox's lock is forgotten once nobody holds or waits for it.
func (s *Service) lock(id string) func() {
	s.mu.Lock()
	l := s.locks[id]
	if l == nil {
		l = &sandboxLock{}
		s.locks[id] = l
	}
	l.users++
	s.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		s.mu.Lock()
		if l.users--; l.users == 0 {
			delete(s.locks, id)
		}
		s.mu.Unlock()
	}
}

// ValidSize checks a requested size; 0x0 means the default.
func ValidSize(width, height int) (Size, error) {
	if width == 0 && height == 0 {
		return Size{Width: DefaultWidth, Height: DefaultHeight}, nil
	}
	if width == 0 || height == 0 {
		return Size{}, fmt.Errorf("width and height: pass both or neither: %w", errdefs.ErrInvalid)
	}
	if width < MinWidth || width > MaxWidth {
		return Size{}, fmt.Errorf("width %d: must be %d to %d: %w", width, MinWidth, MaxWidth, errdefs.ErrInvalid)
	}
	if height < MinHeight || height > MaxHeight {
		return Size{}, fmt.Errorf("height %d: must be %d to %d: %w", height, MinHeight, MaxHeight, errdefs.ErrInvalid)
	}
	return Size{Width: width, Height: height}, nil
}

// Start starts the sandbox's desktop at size (if it is not running: a
// running desktop keeps its size) and publishes its pages.
func (s *Service) Start(ctx context.Context, projectID, id string, size Size) (Desktop, error) {
	// The first lizard-desktop call answers for an unknown sandbox, or
	// another project's: Exec finds it as the project's or not at all.
	defer s.lock(id)()
	running, got, err := s.lizardDesktop(ctx, projectID, id, "start", strconv.Itoa(size.Width), strconv.Itoa(size.Height))
	if err != nil {
		return Desktop{}, err
	}
	if !running {
		return Desktop{}, fmt.Errorf("sandbox %q: the desktop stopped as it started: %w", id, errdefs.ErrUnavailable)
	}
	token, err := s.ports.Expose(ctx, projectID, id, Port, preview.OwnToken())
	if err != nil {
		return Desktop{}, err
	}
	viewToken, err := s.ports.Expose(ctx, projectID, id, ViewOnlyPort, preview.OwnToken())
	if err != nil {
		return Desktop{}, err
	}
	if _, err := s.core.Update(ctx, projectID, id, func(r *sandbox.Record) error {
		r.Desktop = &got
		return nil
	}); err != nil {
		return Desktop{}, err
	}
	return Desktop{Running: true, Size: &got, Token: token, ViewOnlyToken: viewToken}, nil
}

// State answers whether the desktop runs, and its size and tokens, without
// starting it.
func (s *Service) State(ctx context.Context, projectID, id string) (Desktop, error) {
	defer s.lock(id)()
	running, got, err := s.lizardDesktop(ctx, projectID, id, "status")
	if err != nil {
		return Desktop{}, err
	}
	rec, err := s.core.Get(projectID, id)
	if err != nil {
		return Desktop{}, err
	}
	d := Desktop{Running: running, Token: rec.PortTokens[Port], ViewOnlyToken: rec.PortTokens[ViewOnlyPort]}
	switch {
	case running:
		d.Size = &got
	case rec.Desktop != nil:
		last := *rec.Desktop
		d.Size = &last
	}
	return d, nil
}

// Stop takes the desktop's pages off the proxy and stops it. The tokens
// are kept: the next start has the same URLs.
func (s *Service) Stop(ctx context.Context, projectID, id string) error {
	defer s.lock(id)()
	// A template without a desktop fails here, before anything changes.
	if _, _, err := s.lizardDesktop(ctx, projectID, id, "status"); err != nil {
		return err
	}
	for _, port := range []int{Port, ViewOnlyPort} {
		if err := s.ports.Unexpose(ctx, projectID, id, port); err != nil {
			return err
		}
	}
	_, _, err := s.lizardDesktop(ctx, projectID, id, "stop")
	return err
}

// lizardDesktop runs lizard-desktop in the sandbox as root and reads the
// state it prints last: "running W H" or "stopped". Exit 127 (no such
// program) means the sandbox's template has no desktop.
func (s *Service) lizardDesktop(ctx context.Context, projectID, id string, args ...string) (bool, Size, error) {
	var stdout, stderr []string
	exit := -1
	errText := ""
	err := s.core.Exec(ctx, projectID, id, sandbox.ExecRequest{Cmd: append([]string{"lizard-desktop"}, args...), TimeoutMs: callTimeoutMs},
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
		return false, Size{}, err
	}
	if exit == 127 {
		return false, Size{}, errdefs.WithCode("desktop_not_supported", fmt.Errorf(
			"sandbox %q has no desktop: create it from the desktop template: %w", id, errdefs.ErrInvalid))
	}
	if exit != 0 {
		msg := strings.TrimSpace(strings.Join(stderr, "\n"))
		if msg == "" {
			msg = errText
		}
		return false, Size{}, fmt.Errorf("sandbox %q: lizard-desktop %s: exit %d: %s: %w", id, args[0], exit, msg, errdefs.ErrUnavailable)
	}
	last := ""
	if len(stdout) > 0 {
		last = strings.TrimSpace(stdout[len(stdout)-1])
	}
	running, size, err := parseState(last)
	if err != nil {
		return false, Size{}, fmt.Errorf("sandbox %q: lizard-desktop %s: %w", id, args[0], err)
	}
	return running, size, nil
}

// parseState reads lizard-desktop's "running W H" or "stopped".
func parseState(line string) (bool, Size, error) {
	f := strings.Fields(line)
	if len(f) == 1 && f[0] == "stopped" {
		return false, Size{}, nil
	}
	if len(f) == 3 && f[0] == "running" {
		w, errW := strconv.Atoi(f[1])
		h, errH := strconv.Atoi(f[2])
		if err := errors.Join(errW, errH); err == nil && w > 0 && h > 0 {
			return true, Size{Width: w, Height: h}, nil
		}
	}
	return false, Size{}, fmt.Errorf("unexpected state %q: %w", line, errdefs.ErrUnavailable)
}
