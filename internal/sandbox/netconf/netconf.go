// Package netconf is a sandbox's network configuration as a feature over
// the sandbox core: it reads it, replaces it while the sandbox lives (E2B's
// updateNetwork, the Lizard API's PUT …/network) — in the record through
// the core's Update and on the wire through the runtime (EgressSetter),
// under the sandbox's lifecycle lock, so both change together or neither
// does —, checks the placeholders a configuration names against the
// project's secrets and the sandbox's workload tokens, tells the egress
// proxy which sandbox an address is (egress.Sources) and reads its egress
// log. It keeps no state of its own. cmd/lizard wires it; the API and the
// E2B edge call it.
package netconf

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	"github.com/lizard-build/lizard/internal/egress"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/network"
	"github.com/lizard-build/lizard/internal/runtime"
	"github.com/lizard-build/lizard/internal/sandbox"
)

// Core is what the feature needs of the sandbox service.
type Core interface {
	Get(projectID, id string) (sandbox.Record, error)
	Live(id string) (sandbox.Record, bool)
	Update(ctx context.Context, projectID, id string, fn func(*sandbox.Record) error) (sandbox.Record, error)
}

// Addresses tells which sandbox an address is and its configuration as
// enforced (*network.Manager).
type Addresses interface {
	Lookup(a netip.Addr) (network.Source, bool)
}

// Logs are the egress proxy's logs (*egress.Log).
type Logs interface {
	Entries(id string) []egress.Entry
}

// SecretChecker tells whether a project has a secret: a configuration
// naming ${e2b.secrets.NAME} of a secret the project does not have is
// refused (400) when it is set.
type SecretChecker interface {
	SecretExists(ctx context.Context, projectID, name string) (bool, error)
}

// TokenChecker tells whether a sandbox has a workload token registered
// (E2B's iam.tokens): a network update naming
// ${e2b.identity.tokens.NAME} of a token the sandbox does not have is
// refused.
type TokenChecker interface {
	TokenExists(ctx context.Context, projectID, sandboxID, name string) (bool, error)
}

// Config wires the feature.
type Config struct {
	Core Core
	// Runtime applies a configuration to a sandbox that exists.
	Runtime runtime.EgressSetter
	// Addresses and Logs: nil on a node without an egress proxy (Source
	// knows nobody, Log is empty).
	Addresses Addresses
	Logs      Logs
	// Secrets and Tokens check placeholders; nil: the server has none, and
	// a configuration naming one of the kind is refused.
	Secrets SecretChecker
	Tokens  TokenChecker
}

// Service is the feature. It is safe for concurrent use.
type Service struct{ cfg Config }

// New returns the feature over cfg.Core.
func New(cfg Config) *Service { return &Service{cfg: cfg} }

var (
	_ egress.Sources = (*Service)(nil)
	_ Logs           = (*egress.Log)(nil)
)

// Network returns project's sandbox id's configuration (placeholders as
// written; Settings hides the SOCKS5 password).
func (s *Service) Network(projectID, id string) (network.Egress, error) {
	rec, err := s.cfg.Core.Get(projectID, id)
	if err != nil {
		return network.Egress{}, err
	}
	return rec.Egress, nil
}

// SetNetwork replaces the egress part of project's sandbox id's
// configuration (allowOut, denyOut, rules, egressProxy) with n's, keeping
// what is not egress (httpsPorts, the node API). New connections follow
// it once SetNetwork returns. The sandbox may be running or paused; a
// failure leaves the old configuration, in the record and on the wire.
func (s *Service) SetNetwork(ctx context.Context, projectID, id string, n network.Egress) (network.Egress, error) {
	if s.cfg.Runtime == nil {
		return network.Egress{}, errdefs.WithCode("feature_unavailable", fmt.Errorf("network updates: this server's runtime cannot change a sandbox's network: %w", errdefs.ErrInvalid))
	}
	if _, err := s.cfg.Core.Get(projectID, id); err != nil {
		return network.Egress{}, err
	}
	if err := s.check(ctx, projectID, id, n, nil); err != nil {
		return network.Egress{}, err
	}
	rec, err := s.cfg.Core.Update(ctx, projectID, id, func(r *sandbox.Record) error {
		next := r.Egress.WithSettings(n)
		if err := s.cfg.Runtime.SetEgress(ctx, r.ID, next); err != nil {
			return err
		}
		r.Egress = next
		return nil
	})
	if err != nil {
		return network.Egress{}, err
	}
	return rec.Egress, nil
}

// Check refuses a new sandbox's configuration that names a secret the
// project does not have, or a workload token not among tokens (the
// create's iam.tokens).
func (s *Service) Check(ctx context.Context, projectID string, e network.Egress, tokens []string) error {
	return s.check(ctx, projectID, "", e, tokens)
}

// check looks up each placeholder of e: secrets in the project, tokens in
// tokens (sandboxID "") or registered to the sandbox.
func (s *Service) check(ctx context.Context, projectID, sandboxID string, e network.Egress, tokens []string) error {
	for _, ph := range e.Placeholders() {
		var ok bool
		var err error
		switch ph.Kind {
		case network.SecretPlaceholder:
			if s.cfg.Secrets == nil {
				return invalid("network.rules: %s names a secret, and this server keeps none", ph)
			}
			ok, err = s.cfg.Secrets.SecretExists(ctx, projectID, ph.Name)
			if err == nil && !ok {
				return invalid("network.rules: %s names secret %q, which the project does not have", ph, ph.Name)
			}
		case network.TokenPlaceholder:
			switch {
			case sandboxID == "":
				if !slices.Contains(tokens, ph.Name) {
					return invalid("network.rules: %s names workload token %q, which iam.tokens does not register", ph, ph.Name)
				}
				continue
			case s.cfg.Tokens == nil:
				return invalid("network.rules: %s names a workload token, and this server mints none", ph)
			}
			ok, err = s.cfg.Tokens.TokenExists(ctx, projectID, sandboxID, ph.Name)
			if err == nil && !ok {
				return invalid("network.rules: %s names workload token %q, which the sandbox does not have", ph, ph.Name)
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// Log returns project's sandbox id's egress log, oldest first.
func (s *Service) Log(projectID, id string) ([]egress.Entry, error) {
	if _, err := s.cfg.Core.Get(projectID, id); err != nil {
		return nil, err
	}
	if s.cfg.Logs == nil {
		return []egress.Entry{}, nil
	}
	return s.cfg.Logs.Entries(id), nil
}

// Source implements egress.Sources: the sandbox at address a, with the
// configuration the network enforces for it, and its project from the
// live table. A sandbox recovery has not reattached yet is not known.
func (s *Service) Source(a netip.Addr) (egress.Source, bool) {
	if s.cfg.Addresses == nil {
		return egress.Source{}, false
	}
	src, ok := s.cfg.Addresses.Lookup(a)
	if !ok {
		return egress.Source{}, false
	}
	rec, ok := s.cfg.Core.Live(src.ID)
	if !ok {
		return egress.Source{}, false
	}
	return egress.Source{SandboxID: rec.ID, ProjectID: rec.ProjectID, Egress: src.Egress, Learned: src.Learned}, true
}

// Exists implements egress.Sources.
func (s *Service) Exists(id string) bool {
	_, ok := s.cfg.Core.Live(id)
	return ok
}

func invalid(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, errdefs.ErrInvalid)...)
}
