package api

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
)

// The lizard CLI in a sandbox (docs/API-EXTENSIONS.md, "lizardToken"): a
// create may give the sandbox an API key of its own project; its commands
// then get the key and where this node's API is, as the CLI reads them.
const (
	envAPIKey = "LIZARD_API_KEY"
	envAPIURL = "LIZARD_API_URL"
)

// lizardToken checks the key a create would give its sandbox, token (a
// valid key of p, the caller's project), and returns the sandbox's envs:
// envs with LIZARD_API_KEY and LIZARD_API_URL laid over them. The key is
// in no message: refusals name the field only.
func (s *server) lizardToken(p store.Project, token string, envs map[string]string) (map[string]string, error) {
	if s.sandboxURL == "" {
		return nil, errdefs.WithCode("feature_unavailable", fmt.Errorf(
			"lizardToken: this server's sandboxes cannot reach its API (it listens on a port chosen at start): %w", errdefs.ErrInvalid))
	}
	k, err := s.keys.Lookup(token)
	if errors.Is(err, errdefs.ErrUnauthenticated) {
		return nil, errdefs.WithCode("invalid_lizard_token", fmt.Errorf(
			"lizardToken: not an API key of this server (unknown or revoked): %w", errdefs.ErrInvalid))
	}
	if err != nil {
		return nil, fmt.Errorf("lizardToken: %w", err)
	}
	if k.Project.ID != p.ID {
		return nil, errdefs.WithCode("lizard_token_project", fmt.Errorf(
			"lizardToken: the key is another project's; a sandbox of project %q may only be given a key of that project: %w", p.Slug, errdefs.ErrPermission))
	}
	out := make(map[string]string, len(envs)+2)
	maps.Copy(out, envs)
	out[envAPIKey], out[envAPIURL] = token, s.sandboxURL
	return out, nil
}

// sandboxSide serves the requests that reach the API from the node's
// sandboxes, at the SandboxURL's address, the /api/ routes only: what the
// lizard CLI calls. The dashboard, E2B's API, /metrics and the health
// checks are not for them.
func (s *server) sandboxSide(h http.Handler) http.Handler {
	u, err := url.Parse(s.sandboxURL)
	if s.sandboxURL == "" || err != nil {
		return h
	}
	side, err := netip.ParseAddrPort(u.Host)
	if err != nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if arrivedAt(r, side) && !strings.HasPrefix(r.URL.Path, "/api/") {
			writeError(w, r, s.log, errdefs.WithCode("route_not_found",
				fmt.Errorf("no route %s %s from a sandbox (only /api/ routes): %w", r.Method, r.URL.Path, errdefs.ErrNotFound)))
			return
		}
		h.ServeHTTP(w, r)
	})
}

// arrivedAt says whether r came in on a connection to addr.
func arrivedAt(r *http.Request, addr netip.AddrPort) bool {
	la, ok := r.Context().Value(http.LocalAddrContextKey).(*net.TCPAddr)
	if !ok {
		return false
	}
	ap := la.AddrPort()
	return ap.Addr().Unmap() == addr.Addr() && ap.Port() == addr.Port()
}
