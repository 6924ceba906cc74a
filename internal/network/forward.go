package network

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"

	"github.com/google/nftables"
)

// hostForward lets the bridge's traffic through an iptables FORWARD chain
// whose policy is DROP, as Docker leaves it (and many host firewalls do).
// Every base chain on the forward hook must accept a packet for it to pass,
// so lizard's own nftables table accepting it is not enough there.
//
// For each iptables backend whose filter table exists (iptables-nft and
// iptables-legacy can both be in use) it inserts, at the top of
// DOCKER-USER when that chain exists (Docker jumps there first from
// FORWARD and ends it with RETURN), else of FORWARD:
//
//	-i <bridge> -j ACCEPT
//	-o <bridge> -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
//
// These only accept; they grant nothing lizard's table denies: a packet a
// base chain drops or rejects is gone whatever other chains say, and
// lizard's table (made before these rules and kept while they exist)
// rejects what a sandbox's policy does not allow. The second rule admits
// only replies, so nothing from outside opens a connection to a sandbox
// that the DROP policy would have stopped.
//
// The rules carry a comment naming the bridge; every copy of them is
// removed before they are added (a server killed with -9 leaves them) and
// when the server closes, so there is never more than one.
type hostForward struct {
	bridge   string
	exec     func(*exec.Cmd) error
	backends []string // iptables commands whose filter table got the rules
	log      *slog.Logger
}

// dockerUserChain is where Docker wants users' rules for forwarded traffic.
const dockerUserChain = "DOCKER-USER"

// allowForward adds the rules for bridge in every iptables backend in use.
// Without iptables there is no iptables FORWARD chain to pass, and nothing
// to do.
func allowForward(bridge string, run func(*exec.Cmd) error, log *slog.Logger) (*hostForward, error) {
	if run == nil {
		run = (*exec.Cmd).Run
	}
	f := &hostForward{bridge: bridge, exec: run, log: log}
	for _, bin := range iptablesInUse(run) {
		f.removeFrom(bin)
		chain := "FORWARD"
		if f.run(bin, "-S", dockerUserChain) == nil {
			chain = dockerUserChain
		}
		// Inserted at 1 in reverse: the inbound rule ends up first.
		for _, rule := range [][]string{f.outRule(), f.inRule()} {
			if err := f.run(bin, append([]string{"-I", chain, "1"}, rule...)...); err != nil {
				f.close()
				f.removeFrom(bin)
				return nil, fmt.Errorf("accept %s's traffic in the %s chain of %s: %w", bridge, chain, bin, err)
			}
		}
		f.backends = append(f.backends, bin)
		log.Info("accepting the bridge's forwarded traffic in iptables", "bridge", bridge, "iptables", bin, "chain", chain)
	}
	return f, nil
}

// close removes the rules again.
func (f *hostForward) close() {
	for _, bin := range f.backends {
		f.removeFrom(bin)
	}
	f.backends = nil
}

func (f *hostForward) comment() []string {
	return []string{"-m", "comment", "--comment", "lizard " + f.bridge}
}

func (f *hostForward) inRule() []string {
	return append(append([]string{"-i", f.bridge}, f.comment()...), "-j", "ACCEPT")
}

func (f *hostForward) outRule() []string {
	return append(append([]string{"-o", f.bridge, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED"}, f.comment()...), "-j", "ACCEPT")
}

// removeFrom deletes every copy of the rules from FORWARD and DOCKER-USER
// of bin's filter table. A delete fails once no copy is left (or the chain
// does not exist); the bound only guards against a command that never
// fails.
func (f *hostForward) removeFrom(bin string) {
	for _, chain := range []string{"FORWARD", dockerUserChain} {
		for _, rule := range [][]string{f.inRule(), f.outRule()} {
			for range 100 {
				if f.run(bin, append([]string{"-D", chain}, rule...)...) != nil {
					break
				}
			}
		}
	}
}

// run runs an iptables command on the filter table, waiting for the
// xtables lock.
func (f *hostForward) run(bin string, args ...string) error {
	var stderr bytes.Buffer
	cmd := exec.Command(bin, append([]string{"-w", "5", "-t", "filter"}, args...)...)
	cmd.Stderr = &stderr
	if err := f.exec(cmd); err != nil {
		return fmt.Errorf("%s %s: %w: %s", bin, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// iptablesInUse returns the iptables commands whose IPv4 filter table
// exists in this network namespace: iptables-nft's is the nftables table
// "ip filter", iptables-legacy's is listed in ip_tables_names of /proc's
// net directory.
// Neither is looked at by running iptables, which would create the table.
// A host with only "iptables" gets that command for the variant it is.
func iptablesInUse(run func(*exec.Cmd) error) []string {
	nftBin, legacyBin := lookPath("iptables-nft"), lookPath("iptables-legacy")
	if plain := lookPath("iptables"); plain != "" && (nftBin == "" || legacyBin == "") {
		var buf bytes.Buffer
		cmd := exec.Command(plain, "--version")
		cmd.Stdout = &buf
		run(cmd)
		out := buf.Bytes()
		switch {
		case nftBin == "" && bytes.Contains(out, []byte("nf_tables")):
			nftBin = plain
		case legacyBin == "" && bytes.Contains(out, []byte("legacy")):
			legacyBin = plain
		}
	}
	var bins []string
	if nftBin != "" && nftFilterExists() {
		bins = append(bins, nftBin)
	}
	if legacyBin != "" && legacyFilterExists() {
		bins = append(bins, legacyBin)
	}
	return bins
}

func lookPath(name string) string {
	p, err := exec.LookPath(name)
	if err != nil {
		return ""
	}
	return p
}

func nftFilterExists() bool {
	c, err := nftables.New()
	if err != nil {
		return false
	}
	_, err = c.ListTableOfFamily("filter", nftables.TableFamilyIPv4)
	return err == nil
}

func legacyFilterExists() bool {
	// thread-self: /proc/net is the thread group leader's namespace, which
	// need not be this thread's.
	b, err := os.ReadFile("/proc/thread-self/net/ip_tables_names")
	if err != nil {
		return false
	}
	for _, name := range strings.Fields(string(b)) {
		if name == "filter" {
			return true
		}
	}
	return false
}
