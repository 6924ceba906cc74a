package sandbox

import (
	"context"
	"fmt"
	"net"
	"strconv"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/proxy"
)

// The connections the preview proxy makes to a sandbox go through the
// sandbox's agent connections (conns.go), so that a kill or a pause cuts
// them; the previews themselves (which ports, which tokens) are
// internal/sandbox/preview's.

// PortAddr is the address of port of the sandbox: its agent's host.
func (r Record) PortAddr(port int) (string, error) {
	host, _, err := net.SplitHostPort(r.AgentAddr)
	if err != nil {
		return "", fmt.Errorf("sandbox %q has no address: %w", r.ID, errdefs.ErrUnavailable)
	}
	return net.JoinHostPort(host, strconv.Itoa(port)), nil
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
