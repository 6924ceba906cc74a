package network

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// Egress is what a sandbox may reach outside its host. The zero value is
// open: anything, through NAT. Restricted with no Allowed entries reaches
// nothing; with entries, only those: CIDRs and addresses directly, domain
// names ("pypi.org", "*.github.com") through the addresses the gateway's
// DNS resolver answered for them.
type Egress struct {
	Restricted bool     `json:"restricted,omitempty"`
	Allowed    []string `json:"allowed,omitempty"`
	// NodeAPI lets the sandbox reach the node's API on the gateway
	// (Config.APIPort), whatever else it may reach: a sandbox given an
	// API key for the lizard CLI inside it. Without it no host service
	// but the gateway's DNS is reachable.
	NodeAPI bool `json:"nodeApi,omitempty"`
}

// MaxAllowedHosts caps the allow list of one sandbox.
const MaxAllowedHosts = 64

// ParseEgress validates the API's internetAccess and allowedHosts; allowed
// hosts imply no other internet access.
func ParseEgress(internetAccess *bool, allowedHosts []string) (Egress, error) {
	e := Egress{Restricted: (internetAccess != nil && !*internetAccess) || len(allowedHosts) > 0}
	if len(allowedHosts) > MaxAllowedHosts {
		return Egress{}, fmt.Errorf("allowedHosts: at most %d entries: %w", MaxAllowedHosts, errdefs.ErrInvalid)
	}
	for _, h := range allowedHosts {
		n, err := normalizeHost(h)
		if err != nil {
			return Egress{}, err
		}
		e.Allowed = append(e.Allowed, n)
	}
	return e, nil
}

func normalizeHost(h string) (string, error) {
	bad := func(why string) error {
		return fmt.Errorf("allowedHosts entry %q: %s (want a domain like pypi.org, a wildcard like *.github.com, an IPv4 address or a CIDR like 10.0.0.0/8): %w", h, why, errdefs.ErrInvalid)
	}
	h = strings.TrimSpace(strings.ToLower(h))
	if p, err := netip.ParsePrefix(h); err == nil {
		if !p.Addr().Is4() {
			return "", bad("only IPv4 ranges are supported")
		}
		return p.Masked().String(), nil
	}
	if a, err := netip.ParseAddr(h); err == nil {
		if !a.Is4() {
			return "", bad("only IPv4 addresses are supported")
		}
		return a.String(), nil
	}
	name := strings.TrimSuffix(strings.TrimPrefix(h, "*."), ".")
	if name == "" || len(name) > 253 || !strings.Contains(name, ".") && !strings.HasPrefix(h, "*.") && name != "localhost" {
		return "", bad("not a domain name")
	}
	for _, label := range strings.Split(name, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return "", bad("not a domain name")
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return "", bad("not a domain name")
			}
		}
	}
	if strings.HasPrefix(h, "*.") {
		return "*." + name, nil
	}
	return name, nil
}

func (e Egress) open() bool { return !e.Restricted }

// prefixes are the allowed CIDRs and addresses.
func (e Egress) prefixes() []netip.Prefix {
	var out []netip.Prefix
	for _, h := range e.Allowed {
		if p, err := netip.ParsePrefix(h); err == nil {
			out = append(out, p)
		} else if a, err := netip.ParseAddr(h); err == nil {
			out = append(out, netip.PrefixFrom(a, 32))
		}
	}
	return out
}

// allowsName says whether a DNS name may be resolved (and its addresses
// reached) under this policy.
func (e Egress) allowsName(name string) bool {
	if e.open() {
		return true
	}
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	for _, h := range e.Allowed {
		if wild, ok := strings.CutPrefix(h, "*."); ok {
			if strings.HasSuffix(name, "."+wild) {
				return true
			}
		} else if name == h {
			return true
		}
	}
	return false
}
