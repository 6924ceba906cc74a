// Package preview publishes sandbox ports on the preview proxy: which ports
// of a sandbox are exposed, the tokens that admit requests to them, and
// where the proxy sends a request — a lizard preview (resuming a paused
// sandbox), E2B-addressed traffic, a signed E2B file URL, the code
// interpreter's public ports. It keeps its state in the sandbox's record
// (Record.Ports, PreviewToken, PortTokens) through the core's Update and
// otherwise only reads the live table; the connections themselves are the
// core's (sandbox.Service.DialSandbox, DialLoopback, SandboxRun).
package preview

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/proxy"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/template"
)

// Core is what previews need of the sandbox service.
type Core interface {
	Update(ctx context.Context, projectID, id string, fn func(*sandbox.Record) error) (sandbox.Record, error)
	Live(id string) (sandbox.Record, bool)
	EachLive(fn func(sandbox.Record))
	Resume(ctx context.Context, projectID, id string) (sandbox.Record, error)
}

// Service publishes ports. It keeps no state of its own and is safe for
// concurrent use.
type Service struct{ core Core }

// New returns the previews of core's sandboxes.
func New(core Core) *Service { return &Service{core: core} }

var (
	_ proxy.Previews   = (*Service)(nil)
	_ proxy.E2BTargets = (*Service)(nil)
	_ proxy.E2BSigned  = (*Service)(nil)
	_ proxy.HTTPSPorts = (*Service)(nil)
)

func validPort(port int) error {
	if port < 1 || port > 65535 {
		return fmt.Errorf("port %d: must be 1 to 65535: %w", port, errdefs.ErrInvalid)
	}
	if port == agent.Port {
		return fmt.Errorf("port %d is the sandbox agent's and cannot be exposed: %w", port, errdefs.ErrInvalid)
	}
	return nil
}

// ExposeOption changes how Expose publishes a port.
type ExposeOption func(*exposeOptions)

type exposeOptions struct {
	ownToken bool
}

// OwnToken gives the port an access token of its own in place of the
// sandbox's, so that its URL opens that port and no other (the desktop's
// view-only stream must not open the interactive one). The token is made
// once and kept, also while the port is not exposed, so the URL stays the
// same.
func OwnToken() ExposeOption {
	return func(o *exposeOptions) { o.ownToken = true }
}

// Expose publishes a port of the sandbox on the preview proxy and returns
// the token that admits requests to it: the port's own token when it has
// one, else the sandbox's (one per sandbox, shared by its other ports). Both
// stay the same across pause and resume.
func (s *Service) Expose(ctx context.Context, projectID, id string, port int, opts ...ExposeOption) (string, error) {
	var o exposeOptions
	for _, opt := range opts {
		opt(&o)
	}
	if err := validPort(port); err != nil {
		return "", err
	}
	rec, err := s.core.Update(ctx, projectID, id, func(r *sandbox.Record) error {
		if r.PreviewToken == "" {
			r.PreviewToken = newToken()
		}
		if o.ownToken && r.PortTokens[port] == "" {
			if r.PortTokens == nil {
				r.PortTokens = map[int]string{}
			}
			r.PortTokens[port] = newToken()
		}
		if !slices.Contains(r.Ports, port) {
			r.Ports = append(r.Ports, port)
			slices.Sort(r.Ports)
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	return tokenOf(rec, port), nil
}

// Unexpose takes a port off the preview proxy, at once. Unexposing a port
// that is not exposed is a no-op.
func (s *Service) Unexpose(ctx context.Context, projectID, id string, port int) error {
	if err := validPort(port); err != nil {
		return err
	}
	_, err := s.core.Update(ctx, projectID, id, func(r *sandbox.Record) error {
		r.Ports = slices.DeleteFunc(r.Ports, func(p int) bool { return p == port })
		return nil
	})
	return err
}

// tokenOf is the token that admits requests to port.
func tokenOf(r sandbox.Record, port int) string {
	if t := r.PortTokens[port]; t != "" {
		return t
	}
	return r.PreviewToken
}

// exposed returns the record of a sandbox whose port is exposed on the
// preview proxy. An unknown sandbox, one being removed, a pooled copy and
// a port that is not exposed are all ErrNotFound.
func (s *Service) exposed(id string, port int) (sandbox.Record, error) {
	rec, ok := s.core.Live(id)
	if !ok {
		return sandbox.Record{}, sandbox.NotFound(id)
	}
	if !slices.Contains(rec.Ports, port) {
		return sandbox.Record{}, errdefs.WithCode("port_not_exposed", fmt.Errorf("port %d of sandbox %q is not exposed: %w", port, id, errdefs.ErrNotFound))
	}
	return rec, nil
}

// PreviewToken implements proxy.Previews: the token that admits requests
// to an exposed port. It only reads the live table.
func (s *Service) PreviewToken(id string, port int) (string, error) {
	rec, err := s.exposed(id, port)
	if err != nil {
		return "", err
	}
	return tokenOf(rec, port), nil
}

// PreviewAddr implements proxy.Previews: the address of an exposed port. A
// paused sandbox is resumed: whoever opens a preview should not have to
// know. The proxy calls it only once the request's token is checked.
func (s *Service) PreviewAddr(ctx context.Context, id string, port int) (string, error) {
	rec, err := s.exposed(id, port)
	if err != nil {
		return "", err
	}
	if rec.Status == sandbox.StatusPaused {
		if rec, err = s.core.Resume(sandbox.WithCause(ctx, sandbox.CauseTraffic), rec.ProjectID, id); err != nil {
			return "", err
		}
	}
	return rec.PortAddr(port)
}

// CodeInterpreterAddr returns the address of port of a running sandbox
// of a template that runs the code-interpreter server
// (template.NeedsCodeInterpreter), for the proxy's public ports. It only
// reads the live table: a sandbox that is not running is
// errdefs.ErrUnavailable (nothing is resumed); an unknown one, or one of
// another template, is errdefs.ErrNotFound.
func (s *Service) CodeInterpreterAddr(id string, port int) (string, error) {
	rec, ok := s.core.Live(id)
	if !ok || !template.NeedsCodeInterpreter(rec.Template) {
		return "", sandbox.NotFound(id)
	}
	if rec.Status != sandbox.StatusRunning {
		return "", fmt.Errorf("sandbox %q is %s: %w", id, rec.Status, errdefs.ErrUnavailable)
	}
	return rec.PortAddr(port)
}

// E2BTarget implements proxy.E2BTargets: where E2B-addressed traffic to
// port of a sandbox goes. It only reads the live table: a sandbox that is
// not running (paused, pausing, resuming) is ErrUnavailable, as in E2B,
// unless it wakes by traffic (Record.Wakes): then it is a
// target with Asleep set, which the proxy wakes (E2BWake) for a request
// it admits. An unknown one is ErrNotFound.
func (s *Service) E2BTarget(id string, port int) (proxy.E2BTarget, error) {
	if port < 1 || port > 65535 {
		return proxy.E2BTarget{}, fmt.Errorf("port %d: %w", port, errdefs.ErrNotFound)
	}
	rec, ok := s.core.Live(id)
	if !ok || !rec.E2B {
		return proxy.E2BTarget{}, sandbox.NotFound(id)
	}
	envd := port == agent.Port
	if rec.Wakes() {
		return proxy.E2BTarget{Asleep: true, Envd: envd, TrafficToken: rec.TrafficToken, AccessToken: rec.EnvdToken}, nil
	}
	if rec.Status != sandbox.StatusRunning {
		return proxy.E2BTarget{}, fmt.Errorf("sandbox %q is %s: %w", id, rec.Status, errdefs.ErrUnavailable)
	}
	addr, err := rec.PortAddr(port)
	if err != nil {
		return proxy.E2BTarget{}, err
	}
	t := proxy.E2BTarget{Addr: addr, Envd: envd, TrafficToken: rec.TrafficToken, TLS: slices.Contains(rec.Egress.HTTPSPorts, port)}
	if rec.MaskHost != "" && !t.Envd {
		t.Host = strings.ReplaceAll(rec.MaskHost, "${PORT}", strconv.Itoa(port))
	}
	return t, nil
}

// E2BWake implements proxy.E2BWaker: it resumes the sandbox id, paused
// and made with autoResume, for a request the proxy admitted (the resume
// caused by traffic; the core's Resume serves any number of callers with
// one resume).
func (s *Service) E2BWake(ctx context.Context, id string) error {
	rec, ok := s.core.Live(id)
	if !ok || !rec.E2B || !rec.AutoResume {
		return sandbox.NotFound(id)
	}
	if rec.FilesOnly {
		return fmt.Errorf("sandbox %q is paused without its memory: it resumes only when asked: %w", id, errdefs.ErrUnavailable)
	}
	_, err := s.core.Resume(sandbox.WithCause(ctx, sandbox.CauseTraffic), rec.ProjectID, id)
	return err
}

// PortTLS implements proxy.HTTPSPorts: the ports of network.httpsPorts.
func (s *Service) PortTLS(id string, port int) bool {
	rec, ok := s.core.Live(id)
	return ok && slices.Contains(rec.Egress.HTTPSPorts, port)
}

// E2BSignedFile implements proxy.E2BSigned: the running E2B sandbox whose
// envd access token made the signature in q, found by making it with each
// secure sandbox's token (constant-time compared). Whether the signature
// has expired is envd's to say, as for any signed URL.
func (s *Service) E2BSignedFile(q url.Values, operation string) (string, int, bool) {
	sig := []byte(q.Get("signature"))
	path, user, exp := q.Get("path"), q.Get("username"), q.Get("signature_expiration")
	var found string
	s.core.EachLive(func(r sandbox.Record) {
		if !r.E2B || r.EnvdToken == "" || r.Status != sandbox.StatusRunning {
			return
		}
		if subtle.ConstantTimeCompare(sig, []byte(agent.FileSignature(path, operation, user, r.EnvdToken, exp))) == 1 {
			found = r.ID
		}
	})
	return found, agent.Port, found != ""
}

// newToken is 256 random bits, URL-safe.
func newToken() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}
