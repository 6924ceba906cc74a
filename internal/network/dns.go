package network

import (
	"bufio"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// resolver is the DNS server sandboxes are given (on the gateway, UDP 53).
// It forwards queries upstream; for a sandbox whose egress is restricted it
// answers only names its allow list admits, and when anything is denied
// it lets the sandbox reach the IPv4 addresses of the answers for allowed
// names (the address path: Egress.AllowsAddr). A sandbox cannot get around it by asking
// another server: it reaches no other address it is not allowed.
type resolver struct {
	conn     *net.UDPConn
	upstream string
	policy   func(netip.Addr) (Egress, bool)
	learn    func(addr netip.Addr, name string, answers []netip.Prefix) error
	log      *slog.Logger
}

// hostUpstream is the first nameserver of the host's resolv.conf.
func hostUpstream() string {
	f, err := os.Open("/etc/resolv.conf")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) >= 2 && f[0] == "nameserver" {
			return net.JoinHostPort(f[1], "53")
		}
	}
	return ""
}

func startResolver(addr netip.Addr, upstream string, policy func(netip.Addr) (Egress, bool), learn func(netip.Addr, string, []netip.Prefix) error, log *slog.Logger) (*resolver, error) {
	conn, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(addr, 53)))
	if err != nil {
		return nil, err
	}
	r := &resolver{conn: conn, upstream: upstream, policy: policy, learn: learn, log: log}
	go r.serve()
	return r, nil
}

func (r *resolver) close() error { return r.conn.Close() }

func (r *resolver) serve() {
	buf := make([]byte, 65535)
	for {
		n, src, err := r.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		q := append([]byte(nil), buf[:n]...)
		go r.handle(q, src)
	}
}

func (r *resolver) handle(q []byte, src netip.AddrPort) {
	var p dnsmessage.Parser
	hdr, err := p.Start(q)
	if err != nil {
		return
	}
	question, err := p.Question()
	if err != nil {
		return
	}
	pol := r.policyOf(src.Addr().Unmap())
	name := question.Name.String()
	if !pol.resolves(name) {
		r.reply(src, refusal(hdr, question, dnsmessage.RCodeRefused))
		return
	}
	if r.upstream == "" {
		r.reply(src, refusal(hdr, question, dnsmessage.RCodeServerFailure))
		return
	}
	ans, err := r.forward(q)
	if err != nil {
		r.log.Debug("dns upstream failed", "name", question.Name.String(), "err", err)
		r.reply(src, refusal(hdr, question, dnsmessage.RCodeServerFailure))
		return
	}
	if pol.learnsAddresses() && pol.AllowsName(name) {
		// Let the sandbox reach what the allowed name resolved to before
		// it learns the answer.
		if ps := answerAddrs(ans); len(ps) > 0 {
			if err := r.learn(src.Addr().Unmap(), name, ps); err != nil {
				r.log.Warn("dns: could not allow answer addresses", "sandbox", src.Addr(), "err", err)
				r.reply(src, refusal(hdr, question, dnsmessage.RCodeServerFailure))
				return
			}
		}
	}
	r.reply(src, ans)
}

// policyWait is how long a query from an address without a policy waits
// for one: just after a restart, sandboxes ask before recovery has
// re-applied their policies, and an answer given then would neither follow
// their allow list nor add its addresses to it.
const policyWait = 1500 * time.Millisecond

// policyOf is src's policy, waiting up to policyWait for it to be known.
func (r *resolver) policyOf(src netip.Addr) Egress {
	end := time.Now().Add(policyWait)
	for {
		pol, ok := r.policy(src)
		if ok || time.Now().After(end) {
			return pol
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (r *resolver) forward(q []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "udp", r.upstream)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(4 * time.Second))
	if _, err := c.Write(q); err != nil {
		return nil, err
	}
	buf := make([]byte, 65535)
	n, err := c.Read(buf)
	if err != nil {
		return nil, err
	}
	return buf[:n], nil
}

func (r *resolver) reply(dst netip.AddrPort, msg []byte) {
	if msg != nil {
		r.conn.WriteToUDPAddrPort(msg, dst)
	}
}

func refusal(h dnsmessage.Header, q dnsmessage.Question, rcode dnsmessage.RCode) []byte {
	m := dnsmessage.Message{
		Header:    dnsmessage.Header{ID: h.ID, Response: true, OpCode: h.OpCode, RecursionDesired: h.RecursionDesired, RecursionAvailable: true, RCode: rcode},
		Questions: []dnsmessage.Question{q},
	}
	b, err := m.Pack()
	if err != nil {
		return nil
	}
	return b
}

// answerAddrs are the IPv4 addresses in a DNS answer.
func answerAddrs(msg []byte) []netip.Prefix {
	var p dnsmessage.Parser
	if _, err := p.Start(msg); err != nil {
		return nil
	}
	if err := p.SkipAllQuestions(); err != nil {
		return nil
	}
	var out []netip.Prefix
	for {
		h, err := p.AnswerHeader()
		if err != nil {
			return out
		}
		if h.Type != dnsmessage.TypeA {
			p.SkipAnswer()
			continue
		}
		a, err := p.AResource()
		if err != nil {
			return out
		}
		out = append(out, netip.PrefixFrom(netip.AddrFrom4(a.A), 32))
	}
}
