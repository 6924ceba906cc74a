package template

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// Image pulls run on the host, so they must not reach what sandboxes
// cannot: a FROM naming a registry on a loopback, link-local or private
// address (the host's own services, the cloud's metadata service, the
// operator's network) is refused before any connection, unless the
// operator allows that registry. The check is made on every address the
// registry's name resolves to, and again on the address each connection
// dials (redirects and DNS answers that change between the two included).
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
	allow map[string]bool             // "host" (any port) or "host:port", lower case
	auths map[string]authn.AuthConfig // registry host → credentials
}

// NewPullPolicy makes the policy of --registry-allow HOST[:PORT] entries
// and a --registry-auth file in Docker's config.json format ("auths"; ""
// for none).
func NewPullPolicy(allow []string, authFile string) (*PullPolicy, error) {
	p := &PullPolicy{allow: map[string]bool{}, auths: map[string]authn.AuthConfig{}}
	for _, a := range allow {
		a = strings.ToLower(strings.TrimSpace(a))
		host := a
		if h, port, err := net.SplitHostPort(a); err == nil {
			if port == "" || strings.Trim(port, "0123456789") != "" {
				return nil, fmt.Errorf("--registry-allow %q: want HOST or HOST:PORT: %w", a, errdefs.ErrInvalid)
			}
			host = h
		}
		if host == "" || strings.ContainsAny(host, "/ @") {
			return nil, fmt.Errorf("--registry-allow %q: want HOST or HOST:PORT: %w", a, errdefs.ErrInvalid)
		}
		p.allow[a] = true
	}
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

// allowed reports whether the operator allowed registry host:port
// (port may be "").
func (p *PullPolicy) allowed(host, port string) bool {
	if p == nil {
		return false
	}
	host = strings.ToLower(strings.Trim(host, "[]"))
	if p.allow[host] {
		return true
	}
	return port != "" && p.allow[net.JoinHostPort(host, port)]
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

// refusedAddr reports whether a pull may not connect to a: the host's own
// addresses, link-local (169.254.0.0/16: cloud metadata) and private
// ranges, and what is not a unicast address.
func refusedAddr(a netip.Addr) bool {
	a = a.Unmap()
	return !a.IsValid() || a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsPrivate() || a.IsUnspecified() ||
		a.IsMulticast() || a.IsLinkLocalMulticast() || a.IsInterfaceLocalMulticast() ||
		sharedAddressSpace.Contains(a) || thisNetwork.Contains(a)
}

var (
	sharedAddressSpace = netip.MustParsePrefix("100.64.0.0/10") // carrier-grade NAT
	thisNetwork        = netip.MustParsePrefix("0.0.0.0/8")
)

// errRefused is the cause of a refused address, for the log.
var errRefused = errors.New("address refused")

// checkRegistry refuses registry (host[:port]) unless it is allowed or
// every address its host resolves to is public.
func (p *PullPolicy) checkRegistry(ctx context.Context, registry string) error {
	host, port := registry, ""
	if h, pt, err := net.SplitHostPort(registry); err == nil {
		host, port = h, pt
	}
	if p.allowed(host, port) {
		return nil
	}
	if a, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		if refusedAddr(a) {
			return fmt.Errorf("%s: %w", a, errRefused)
		}
		return nil
	}
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return fmt.Errorf("resolve %s: %w", host, err)
	}
	for _, a := range addrs {
		if refusedAddr(a) {
			return fmt.Errorf("%s resolves to %s: %w", host, a, errRefused)
		}
	}
	return nil
}

// transport is the HTTP transport of pulls: it dials allowed registries as
// they are, and anything else only at addresses refusedAddr accepts (the
// check is on the address connected to). It uses no proxy: a proxy would
// connect where the check cannot see.
func (p *PullPolicy) transport() http.RoundTripper {
	guarded := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second,
		Control: func(network, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil || refusedAddr(ap.Addr()) {
				return fmt.Errorf("dial %s: %w", address, errRefused)
			}
			return nil
		}}
	plain := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	return &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, port, _ := net.SplitHostPort(addr)
			if p.allowed(host, port) {
				return plain.DialContext(ctx, network, addr)
			}
			return guarded.DialContext(ctx, network, addr)
		},
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          100,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: 1 * time.Second,
	}
}
