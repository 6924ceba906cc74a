package network

import (
	"errors"
	"fmt"

	"github.com/google/nftables"
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

// RemoveBridge removes what a server's network leaves on the host when it
// stops (for its sandboxes, which outlive it): the bridge of that name and
// its nftables table, where they are. For tests and benchmarks whose
// servers are gone for good; the sandboxes' endpoints must be gone too.
func RemoveBridge(bridge string) error {
	var errs []error
	if l, err := netlink.LinkByName(bridge); err == nil {
		if err := netlink.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("delete bridge %s: %w", bridge, err))
		}
	}
	c, err := nftables.New()
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	if t, err := c.ListTableOfFamily(TableName(bridge), nftables.TableFamilyINet); err == nil {
		c.DelTable(t)
		if err := c.Flush(); err != nil {
			errs = append(errs, fmt.Errorf("delete nftables table %s: %w", t.Name, err))
		}
	}
	return errors.Join(errs...)
}
