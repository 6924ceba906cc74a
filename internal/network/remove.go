package network

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
)

// Remove takes down everything New made: the resolver, the nftables table
// and the bridge. It is for short-lived networks (template builds), which
// leave nothing on the host once done; the server's network stays for the
// sandboxes that outlive it. Endpoints must have been torn down first.
func (m *Manager) Remove() error {
	var errs []error
	if err := m.dns.close(); err != nil {
		errs = append(errs, fmt.Errorf("resolver: %w", err))
	}
	m.fwd.close()
	if err := m.fw.close(); err != nil {
		errs = append(errs, fmt.Errorf("nftables table: %w", err))
	}
	if err := netlink.LinkDel(m.bridge); err != nil {
		errs = append(errs, fmt.Errorf("delete bridge %s: %w", m.cfg.Bridge, err))
	}
	return errors.Join(errs...)
}
