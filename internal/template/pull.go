package template

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/netguard"
)

// Image pulls run on the host, so they must not reach what sandboxes
// cannot: a FROM naming a registry on a loopback, link-local or private
// address is refused before any connection, unless the operator allows
// that registry (--registry-allow): the rule of package netguard.
// Credentials come only from the operator's file, never from root's Docker
// configuration.

// Codes of the pull errors clients get. Their messages are fixed: what
// went wrong (an error text, whether something listens) goes to the log.
const (
	CodeRegistryRefused = "registry_refused"
	CodeImagePullFailed = "image_pull_failed"
)

// PullPolicy is what image pulls may reach and the credentials they use.
// The zero value (and nil) allows public addresses only, anonymously.
type PullPolicy struct {
	guard *netguard.Policy            // the registries allowed beyond public addresses
	auths map[string]authn.AuthConfig // registry host → credentials
}

// NewPullPolicy makes the policy of --registry-allow HOST[:PORT] entries
// and a --registry-auth file in Docker's config.json format ("auths"; ""
// for none).
func NewPullPolicy(allow []string, authFile string) (*PullPolicy, error) {
	guard, err := netguard.New("--registry-allow", allow)
	if err != nil {
		return nil, err
	}
	p := &PullPolicy{guard: guard, auths: map[string]authn.AuthConfig{}}
	if authFile == "" {
		return p, nil
	}
	b, err := os.ReadFile(authFile)
	if err != nil {
		return nil, fmt.Errorf("--registry-auth: %w", err)
	}
	var cfg struct {
		Auths       map[string]authn.AuthConfig `json:"auths"`
		CredsStore  string                      `json:"credsStore"`
		CredHelpers map[string]string           `json:"credHelpers"`
	}
	if err := json.Unmarshal(b, &cfg); err != nil {
		return nil, fmt.Errorf("--registry-auth %s: not a Docker config.json: %v: %w", authFile, err, errdefs.ErrInvalid)
	}
	if cfg.CredsStore != "" || len(cfg.CredHelpers) > 0 {
		return nil, fmt.Errorf("--registry-auth %s: credential helpers (credsStore, credHelpers) are not supported; put the credentials in \"auths\": %w", authFile, errdefs.ErrInvalid)
	}
	for k, v := range cfg.Auths {
		p.auths[registryKey(k)] = v
	}
	return p, nil
}

// registryKey is the registry host an "auths" key names: keys may be
// URLs ("https://index.docker.io/v1/"), and Docker Hub has several names.
func registryKey(k string) string {
	k = strings.ToLower(k)
	k = strings.TrimPrefix(strings.TrimPrefix(k, "https://"), "http://")
	k, _, _ = strings.Cut(k, "/")
	if k == "docker.io" || k == "registry-1.docker.io" {
		k = "index.docker.io"
	}
	return k
}

// Resolve is the policy's authn.Keychain: the file's credentials of the
// registry, else anonymous.
func (p *PullPolicy) Resolve(r authn.Resource) (authn.Authenticator, error) {
	if p != nil {
		if c, ok := p.auths[registryKey(r.RegistryStr())]; ok {
			return authn.FromConfig(c), nil
		}
	}
	return authn.Anonymous, nil
}

// guardOf is p's netguard policy (none: public addresses only).
func (p *PullPolicy) guardOf() *netguard.Policy {
	if p == nil {
		return nil
	}
	return p.guard
}

// checkRegistry refuses registry (host[:port]) unless it is allowed or
// every address its host resolves to is public (netguard.ErrRefused).
func (p *PullPolicy) checkRegistry(ctx context.Context, registry string) error {
	return p.guardOf().Check(ctx, registry)
}

// transport is the HTTP transport of pulls: it dials allowed registries as
// they are, and anything else only at public addresses (netguard). It uses
// no proxy: a proxy would connect where the check cannot see.
func (p *PullPolicy) transport() http.RoundTripper {
	return &http.Transport{
		DialContext:           p.guardOf().DialContext(&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}),
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          100,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: 1 * time.Second,
	}
}
