package sandbox

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"maps"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/proxy"
	"github.com/lizard-build/lizard/internal/template"
)

var _ proxy.Previews = (*Service)(nil)

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
	e, err := s.lockLive(projectID, id)
	if err != nil {
		return "", err
	}
	defer e.mu.Unlock()
	if e.rec.PreviewToken == "" {
		e.rec.PreviewToken = previewToken()
	}
	if o.ownToken && e.rec.PortTokens[port] == "" {
		tokens := maps.Clone(e.rec.PortTokens)
		if tokens == nil {
			tokens = map[int]string{}
		}
		tokens[port] = previewToken()
		e.rec.PortTokens = tokens
	}
	if !slices.Contains(e.rec.Ports, port) {
		e.rec.Ports = append(slices.Clone(e.rec.Ports), port)
		slices.Sort(e.rec.Ports)
	}
	rec := e.rec
	s.mu.Unlock()
	return rec.previewTokenOf(port), s.persist(ctx, rec)
}

// previewTokenOf is the token that admits requests to port.
func (r Record) previewTokenOf(port int) string {
	if t := r.PortTokens[port]; t != "" {
		return t
	}
	return r.PreviewToken
}

// Unexpose takes a port off the preview proxy, at once. Unexposing a port
// that is not exposed is a no-op.
func (s *Service) Unexpose(ctx context.Context, projectID, id string, port int) error {
	if err := validPort(port); err != nil {
		return err
	}
	// Not on a sandbox killed meanwhile: persisting would bring its record
	// back.
	e, err := s.lockLive(projectID, id)
	if err != nil {
		return err
	}
	defer e.mu.Unlock()
	e.rec.Ports = slices.DeleteFunc(slices.Clone(e.rec.Ports), func(p int) bool { return p == port })
	rec := e.rec
	s.mu.Unlock()
	return s.persist(ctx, rec)
}

// exposed returns the record of a sandbox whose port is exposed on the
// preview proxy. An unknown sandbox, one being removed, a pooled copy and
// a port that is not exposed are all ErrNotFound.
func (s *Service) exposed(id string, port int) (Record, error) {
	rec, ok := s.live(id)
	if !ok {
		return Record{}, notFound(id)
	}
	if !slices.Contains(rec.Ports, port) {
		return Record{}, errdefs.WithCode("port_not_exposed", fmt.Errorf("port %d of sandbox %q is not exposed: %w", port, id, errdefs.ErrNotFound))
	}
	return rec, nil
}

// live returns the record of a sandbox of any project that is in the live
// table, not being removed and not a pooled copy.
func (s *Service) live(id string) (Record, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.sandboxes[id]
	if !ok || e.gone || e.rec.Status == StatusPooled {
		return Record{}, false
	}
	return e.rec, true
}

// PreviewToken implements proxy.Previews: the token that admits requests
// to an exposed port. It only reads the live table.
func (s *Service) PreviewToken(id string, port int) (string, error) {
	rec, err := s.exposed(id, port)
	if err != nil {
		return "", err
	}
	return rec.previewTokenOf(port), nil
}

// PreviewAddr implements proxy.Previews: the address of an exposed port. A
// paused sandbox is resumed: whoever opens a preview should not have to
// know. The proxy calls it only once the request's token is checked.
func (s *Service) PreviewAddr(ctx context.Context, id string, port int) (string, error) {
	rec, err := s.exposed(id, port)
	if err != nil {
		return "", err
	}
	if rec.Status == StatusPaused {
		if rec, err = s.Resume(ctx, rec.ProjectID, id); err != nil {
			return "", err
		}
	}
	return rec.portAddr(port)
}

// CodeInterpreterAddr returns the address of port of a running sandbox
// of a template that runs the code-interpreter server
// (template.NeedsCodeInterpreter), for the proxy's public ports. It only
// reads the live table: a sandbox that is not running is
// errdefs.ErrUnavailable (nothing is resumed); an unknown one, or one of
// another template, is errdefs.ErrNotFound.
func (s *Service) CodeInterpreterAddr(id string, port int) (string, error) {
	rec, ok := s.live(id)
	if !ok || !template.NeedsCodeInterpreter(rec.Template) {
		return "", notFound(id)
	}
	if rec.Status != StatusRunning {
		return "", fmt.Errorf("sandbox %q is %s: %w", id, rec.Status, errdefs.ErrUnavailable)
	}
	return rec.portAddr(port)
}

// portAddr is the address of port of the sandbox: its agent's host.
func (r Record) portAddr(port int) (string, error) {
	host, _, err := net.SplitHostPort(r.AgentAddr)
	if err != nil {
		return "", fmt.Errorf("sandbox %q has no address: %w", r.ID, errdefs.ErrUnavailable)
	}
	return net.JoinHostPort(host, strconv.Itoa(port)), nil
}

// previewToken is 256 random bits, URL-safe.
func previewToken() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

var _ proxy.SandboxDialer = (*Service)(nil)

// DialSandbox implements proxy.SandboxDialer: a connection to addr of a
// running sandbox that is one of its agent's, so that a kill or pause cuts
// it (a request in flight ends at once instead of hanging on a network
// stack that is gone).
func (s *Service) DialSandbox(ctx context.Context, id, addr string) (net.Conn, error) {
	s.mu.Lock()
	e, ok := s.sandboxes[id]
	if !ok || e.gone || e.rec.Status != StatusRunning || e.conns == nil {
		s.mu.Unlock()
		return nil, fmt.Errorf("sandbox %q is not running: %w", id, errdefs.ErrUnavailable)
	}
	conns := e.conns
	s.mu.Unlock()
	return conns.dial(ctx, "tcp", addr)
}

var _ proxy.Runs = (*Service)(nil)

// SandboxRun implements proxy.Runs: a sandbox's run changes whenever its
// network stack is brought back from a checkpoint (a resume), so the proxy
// never reuses a connection of its life before the pause.
func (s *Service) SandboxRun(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.sandboxes[id]
	if !ok {
		return ""
	}
	return strconv.FormatInt(e.since.UnixNano(), 36)
}

var _ proxy.E2BTargets = (*Service)(nil)

// E2BTarget implements proxy.E2BTargets: where E2B-addressed traffic to
// port of a sandbox goes. It only reads the live table: a sandbox that is
// not running (paused, pausing, resuming) is ErrUnavailable and is never
// resumed by traffic, as in E2B; an unknown one is ErrNotFound.
func (s *Service) E2BTarget(id string, port int) (proxy.E2BTarget, error) {
	if port < 1 || port > 65535 {
		return proxy.E2BTarget{}, fmt.Errorf("port %d: %w", port, errdefs.ErrNotFound)
	}
	rec, ok := s.live(id)
	if !ok || !rec.E2B {
		return proxy.E2BTarget{}, notFound(id)
	}
	if rec.Status != StatusRunning {
		return proxy.E2BTarget{}, fmt.Errorf("sandbox %q is %s: %w", id, rec.Status, errdefs.ErrUnavailable)
	}
	addr, err := rec.portAddr(port)
	if err != nil {
		return proxy.E2BTarget{}, err
	}
	t := proxy.E2BTarget{Addr: addr, Envd: port == agent.Port, TrafficToken: rec.TrafficToken}
	if rec.MaskHost != "" && !t.Envd {
		t.Host = strings.ReplaceAll(rec.MaskHost, "${PORT}", strconv.Itoa(port))
	}
	return t, nil
}

var _ proxy.E2BSigned = (*Service)(nil)

// E2BSignedFile implements proxy.E2BSigned: the running E2B sandbox whose
// envd access token made the signature in q, found by making it with each
// secure sandbox's token (constant-time compared). Whether the signature
// has expired is envd's to say, as for any signed URL.
func (s *Service) E2BSignedFile(q url.Values, operation string) (string, int, bool) {
	sig := []byte(q.Get("signature"))
	path, user, exp := q.Get("path"), q.Get("username"), q.Get("signature_expiration")
	s.mu.Lock()
	var found string
	for id, e := range s.sandboxes {
		if e.gone || !e.rec.E2B || e.rec.EnvdToken == "" || e.rec.Status != StatusRunning {
			continue
		}
		if subtle.ConstantTimeCompare(sig, []byte(agent.FileSignature(path, operation, user, e.rec.EnvdToken, exp))) == 1 {
			found = id
		}
	}
	s.mu.Unlock()
	return found, agent.Port, found != ""
}

var _ proxy.LoopbackDialer = (*Service)(nil)

// DialLoopback implements proxy.LoopbackDialer: a connection to port on
// the loopback address of a running sandbox, through its agent, for
// servers that listen on 127.0.0.1 only. The connection is one of the
// agent's, so a kill or pause cuts it. The proxy calls it only for
// requests it has admitted.
func (s *Service) DialLoopback(ctx context.Context, id string, port int) (net.Conn, error) {
	if port == agent.Port {
		return nil, fmt.Errorf("port %d is the agent's: %w", port, errdefs.ErrInvalid)
	}
	s.mu.Lock()
	e, ok := s.sandboxes[id]
	if !ok || e.gone || e.rec.Status != StatusRunning || e.agent == nil || e.conns == nil {
		s.mu.Unlock()
		return nil, fmt.Errorf("sandbox %q is not running: %w", id, errdefs.ErrUnavailable)
	}
	ag, conns, version := e.agent, e.conns, e.rec.AgentVersion
	s.mu.Unlock()
	if version < agent.ForwardVersion {
		// The agent of an older image has no GET /forward.
		return nil, fmt.Errorf("sandbox %q: its agent (protocol %d) cannot reach its loopback address: %w", id, version, errdefs.ErrUnavailable)
	}
	return ag.DialLoopback(ctx, conns.dial, port)
}
