package network

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// firewall is the nftables table that decides what sandboxes may reach. It
// fails closed: a sandbox address in no set reaches nothing but the
// gateway's DNS, so a server that restarts does not open anything before it
// has re-applied each sandbox's policy.
//
//	prerouting (nat, with an egress proxy): from the bridge, to
//	         169.254.0.0/16, a Config.Deny range, the subnet or an address
//	         of the host → as is; TCP of a saddr in @tunnelled, or TCP to
//	         port 80 or 443 of a saddr in @intercepted → redirect to the
//	         egress proxy's port on the gateway
//	input:   established → accept; DNS to the gateway → accept;
//	         saddr in @api, TCP to the gateway's API port → accept;
//	         TCP to the egress proxy's port that prerouting redirected
//	         there → accept;
//	         from the bridge → reject (no other host service is reachable)
//	forward: established → accept; to 169.254.0.0/16, to a Config.Deny
//	         range or back to the bridge → reject; UDP to port 443 of a
//	         saddr in @intercepted → reject (QUIC, where names decide);
//	         saddr . daddr in @allow → accept; saddr . daddr in @deny →
//	         reject; saddr in @open → accept; from the bridge → reject
//	output:  to the bridge, ICMP "port unreachable" about a query to port
//	         53 → drop (see below)
//	postrouting (nat): from the subnet out of another interface → masquerade
//
// An address in @open with ranges in @deny is E2B's denyOut without
// 0.0.0.0/0; one not in @open is Restricted, and reaches only @allow.
// Allowed entries win over denied ones: @allow is looked at first.
//
// While the server restarts nothing listens on the gateway's port 53, and
// the kernel would answer each query with port unreachable, which a
// sandbox's resolver takes as the end of the lookup however many attempts
// its resolv.conf allows. Dropped, the query times out instead and the next
// attempt reaches the next server's resolver.
type firewall struct {
	mu    sync.Mutex
	table *nftables.Table
	open  *nftables.Set // sandboxes with internet access
	allow *nftables.Set // sandbox . destination range pairs
	api   *nftables.Set // sandboxes that may reach the node's API (Egress.NodeAPI)
	deny  *nftables.Set // sandbox . destination range pairs denied (denyOut)
	// intercepted: sandboxes whose TCP 80 and 443 go to the egress proxy
	// (Egress.Intercepts); tunnelled: those whose every TCP does
	// (Egress.Tunnelled). Both empty without a proxy.
	intercepted *nftables.Set
	tunnelled   *nftables.Set
	bridge      string
}

// TableName is the nftables table (family inet) of the network on bridge.
func TableName(bridge string) string { return "lizard_" + bridge }

// newFirewall (re)creates the table for bridge and subnet, empty of
// sandboxes; apiPort (0: none) is the gateway's port of the node's API,
// proxyPort (0: none) the gateway's port of the egress proxy.
func newFirewall(bridge string, subnet netip.Prefix, gateway netip.Addr, apiPort, proxyPort uint16, deny []netip.Prefix) (*firewall, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, err
	}
	fw := &firewall{bridge: bridge, table: &nftables.Table{Family: nftables.TableFamilyINet, Name: TableName(bridge)}}
	if _, err := c.ListTableOfFamily(fw.table.Name, fw.table.Family); err == nil {
		c.DelTable(fw.table)
		if err := c.Flush(); err != nil {
			return nil, fmt.Errorf("remove old nftables table: %w", err)
		}
	}
	c.AddTable(fw.table)
	fw.open = &nftables.Set{Table: fw.table, Name: "open", KeyType: nftables.TypeIPAddr}
	fw.allow = &nftables.Set{Table: fw.table, Name: "allow", KeyType: nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeIPAddr),
		Concatenation: true, Interval: true}
	fw.api = &nftables.Set{Table: fw.table, Name: "api", KeyType: nftables.TypeIPAddr}
	fw.deny = &nftables.Set{Table: fw.table, Name: "deny", KeyType: nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeIPAddr),
		Concatenation: true, Interval: true}
	fw.intercepted = &nftables.Set{Table: fw.table, Name: "intercepted", KeyType: nftables.TypeIPAddr}
	fw.tunnelled = &nftables.Set{Table: fw.table, Name: "tunnelled", KeyType: nftables.TypeIPAddr}
	for _, s := range []*nftables.Set{fw.open, fw.allow, fw.api, fw.deny, fw.intercepted, fw.tunnelled} {
		if err := c.AddSet(s, nil); err != nil {
			return nil, fmt.Errorf("nftables set %s: %w", s.Name, err)
		}
	}
	accept := verdict(expr.VerdictAccept)
	input := c.AddChain(&nftables.Chain{Name: "input", Table: fw.table, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter})
	forward := c.AddChain(&nftables.Chain{Name: "forward", Table: fw.table, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter})
	output := c.AddChain(&nftables.Chain{Name: "output", Table: fw.table, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter})
	post := c.AddChain(&nftables.Chain{Name: "postrouting", Table: fw.table, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	rule := func(ch *nftables.Chain, exprs ...[]expr.Any) {
		var all []expr.Any
		for _, e := range exprs {
			all = append(all, e...)
		}
		c.AddRule(&nftables.Rule{Table: fw.table, Chain: ch, Exprs: all})
	}
	fromBridge := ifname(expr.MetaKeyIIFNAME, bridge, false)
	if proxyPort != 0 {
		pre := c.AddChain(&nftables.Chain{Name: "prerouting", Table: fw.table, Type: nftables.ChainTypeNAT,
			Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest})
		// What the forward chain rejects, and the host's own addresses
		// (whose services input rejects), are never the proxy's to dial.
		asIs := verdict(expr.VerdictAccept)
		for _, p := range append([]netip.Prefix{netip.MustParsePrefix("169.254.0.0/16"), subnet}, deny...) {
			if p.Addr().Is4() {
				rule(pre, fromBridge, ipv4(), dstIn(p.Masked()), asIs)
			}
		}
		rule(pre, fromBridge, ipv4(), localDst(), asIs)
		redirect := []expr.Any{
			&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(proxyPort)},
			&expr.Redir{RegisterProtoMin: 1},
		}
		rule(pre, fromBridge, ipv4(), l4proto(unix.IPPROTO_TCP), srcInSet(fw.tunnelled), redirect)
		for _, port := range []uint16{80, 443} {
			rule(pre, fromBridge, ipv4(), l4proto(unix.IPPROTO_TCP), dport(port), srcInSet(fw.intercepted), redirect)
		}
	}
	rule(input, established(), accept)
	for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		rule(input, fromBridge, ipv4(), ipDst(gateway), l4proto(proto), dport(53), accept)
	}
	if apiPort != 0 {
		rule(input, fromBridge, ipv4(), ipDst(gateway), l4proto(unix.IPPROTO_TCP), dport(apiPort), srcInSet(fw.api), accept)
	}
	if proxyPort != 0 {
		rule(input, fromBridge, ipv4(), ipDst(gateway), l4proto(unix.IPPROTO_TCP), dport(proxyPort), redirected(), accept)
	}
	rule(input, fromBridge, reject())

	rule(forward, established(), accept)
	rule(forward, fromBridge, ipv4(), dstIn(netip.MustParsePrefix("169.254.0.0/16")), reject())
	for _, p := range deny {
		if p.Addr().Is4() {
			rule(forward, fromBridge, ipv4(), dstIn(p.Masked()), reject())
		}
	}
	rule(forward, fromBridge, ifname(expr.MetaKeyOIFNAME, bridge, false), reject())
	rule(forward, fromBridge, ipv4(), l4proto(unix.IPPROTO_UDP), dport(443), srcInSet(fw.intercepted), reject())
	rule(forward, fromBridge, ipv4(), pairInSet(fw.allow), accept)
	rule(forward, fromBridge, ipv4(), pairInSet(fw.deny), reject())
	rule(forward, fromBridge, ipv4(), srcInSet(fw.open), accept)
	rule(forward, fromBridge, reject())

	rule(output, ifname(expr.MetaKeyOIFNAME, bridge, false), ipv4(), l4proto(unix.IPPROTO_ICMP), dnsPortUnreachable(), verdict(expr.VerdictDrop))

	rule(post, ipv4(), srcIn(subnet), ifname(expr.MetaKeyOIFNAME, bridge, true), []expr.Any{&expr.Masq{}})
	if err := c.Flush(); err != nil {
		return nil, fmt.Errorf("nftables table %s: %w", fw.table.Name, err)
	}
	return fw, nil
}

// apply sets addr's policy; learned are addresses the resolver answered
// for names e allows (kept across a change of policy for names it still
// allows).
func (fw *firewall) apply(addr netip.Addr, e Egress, learned []netip.Prefix) error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	c, err := nftables.New()
	if err != nil {
		return err
	}
	fw.clearLocked(c, addr)
	key := []nftables.SetElement{{Key: addr.AsSlice()}}
	for _, in := range []struct {
		set *nftables.Set
		yes bool
	}{{fw.api, e.NodeAPI}, {fw.open, e.open()}, {fw.intercepted, e.Intercepts()}, {fw.tunnelled, e.Tunnelled()}} {
		if in.yes {
			if err := c.SetAddElements(in.set, key); err != nil {
				return err
			}
		}
	}
	if err := fw.pairsLocked(c, fw.allow, addr, append(e.prefixes(), learned...)); err != nil {
		return err
	}
	if e.open() {
		if err := fw.pairsLocked(c, fw.deny, addr, e.deniedPrefixes()); err != nil {
			return err
		}
	}
	return c.Flush()
}

// allowRanges lets addr reach more destinations (names an allowed domain
// resolved to).
func (fw *firewall) allowRanges(addr netip.Addr, ps []netip.Prefix) error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	c, err := nftables.New()
	if err != nil {
		return err
	}
	if err := fw.pairsLocked(c, fw.allow, addr, ps); err != nil {
		return err
	}
	return c.Flush()
}

// pairsLocked queues addr . range elements of set (allow or deny).
func (fw *firewall) pairsLocked(c *nftables.Conn, set *nftables.Set, addr netip.Addr, ps []netip.Prefix) error {
	if len(ps) == 0 {
		return nil
	}
	var els []nftables.SetElement
	for _, p := range mergeRanges(ps) {
		first, last := rangeOf(p)
		els = append(els, nftables.SetElement{Key: concat(addr, first), KeyEnd: concat(addr, last)})
	}
	return c.SetAddElements(set, els)
}

// mergeRanges drops ranges inside others and repeats: an interval set
// refuses overlapping elements.
func mergeRanges(ps []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for i, p := range ps {
		p = p.Masked()
		inside := false
		for j, q := range ps {
			q = q.Masked()
			if i != j && q.Bits() <= p.Bits() && q.Contains(p.Addr()) && (q.Bits() < p.Bits() || j < i) {
				inside = true
				break
			}
		}
		if !inside {
			out = append(out, p)
		}
	}
	return out
}

// remove forgets addr: it reaches nothing again.
func (fw *firewall) remove(addr netip.Addr) error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	c, err := nftables.New()
	if err != nil {
		return err
	}
	fw.clearLocked(c, addr)
	return c.Flush()
}

// clearLocked queues the removal of every element of addr.
func (fw *firewall) clearLocked(c *nftables.Conn, addr netip.Addr) {
	for _, set := range []*nftables.Set{fw.open, fw.api, fw.intercepted, fw.tunnelled} {
		if els, err := c.GetSetElements(set); err == nil {
			for _, el := range els {
				if a, ok := netip.AddrFromSlice(el.Key); ok && a == addr {
					c.SetDeleteElements(set, []nftables.SetElement{el})
				}
			}
		}
	}
	for _, set := range []*nftables.Set{fw.allow, fw.deny} {
		els, err := c.GetSetElements(set)
		if err != nil {
			continue
		}
		var mine []nftables.SetElement
		for _, el := range els {
			if len(el.Key) >= 4 {
				if a, ok := netip.AddrFromSlice(el.Key[:4]); ok && a == addr {
					mine = append(mine, el)
				}
			}
		}
		if len(mine) > 0 {
			c.SetDeleteElements(set, mine)
		}
	}
}

// close removes the table (tests; the server keeps it across restarts).
func (fw *firewall) close() error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	c.DelTable(fw.table)
	return c.Flush()
}

func concat(a, b netip.Addr) []byte {
	return append(a.AsSlice(), b.AsSlice()...)
}

func rangeOf(p netip.Prefix) (first, last netip.Addr) {
	p = p.Masked()
	first = p.Addr()
	v := binary.BigEndian.Uint32(first.AsSlice())
	v |= uint32(1)<<(32-p.Bits()) - 1
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	return first, netip.AddrFrom4(b)
}

func verdict(k expr.VerdictKind) []expr.Any { return []expr.Any{&expr.Verdict{Kind: k}} }

func reject() []expr.Any {
	return []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_PORT_UNREACH}}
}

func established() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
			Xor:  binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}

func ifname(key expr.MetaKey, name string, not bool) []expr.Any {
	op := expr.CmpOpEq
	if not {
		op = expr.CmpOpNeq
	}
	b := make([]byte, 16)
	copy(b, name)
	return []expr.Any{&expr.Meta{Key: key, Register: 1}, &expr.Cmp{Op: op, Register: 1, Data: b}}
}

func ipv4() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
	}
}

func l4proto(p byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}},
	}
}

func dport(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
	}
}

// dnsPortUnreachable matches an ICMP destination unreachable, code port
// unreachable, about a UDP datagram to port 53: the quoted datagram's
// destination port follows the ICMP header (8 bytes) and the quoted IPv4
// header (20 bytes, sandboxes send no options) at offset 2.
func dnsPortUnreachable() []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{3, 3}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 8 + 20 + 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(53)},
	}
}

// srcInSet matches an IPv4 source address in set.
func srcInSet(set *nftables.Set) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID},
	}
}

// pairInSet matches the IPv4 source . destination pair in set.
func pairInSet(set *nftables.Set) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Payload{DestRegister: 9, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID},
	}
}

// localDst matches a destination that is an address of the host.
func localDst() []expr.Any {
	return []expr.Any{
		&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)},
	}
}

// ctStatusDNAT is IPS_DST_NAT: the connection's destination was
// rewritten (by a redirect).
const ctStatusDNAT = 1 << 5

// redirected matches a connection whose destination a NAT rule rewrote.
func redirected() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATUS},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(ctStatusDNAT), Xor: binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}

func ipDst(a netip.Addr) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a.AsSlice()},
	}
}

// dstIn and srcIn match an address field against a prefix.
func dstIn(p netip.Prefix) []expr.Any { return inPrefix(16, p) }
func srcIn(p netip.Prefix) []expr.Any { return inPrefix(12, p) }

func inPrefix(offset uint32, p netip.Prefix) []expr.Any {
	p = p.Masked()
	mask := make([]byte, 4)
	binary.BigEndian.PutUint32(mask, ^uint32(0)<<(32-p.Bits()))
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: p.Addr().AsSlice()},
	}
}
