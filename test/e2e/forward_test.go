package e2e

import (
	"strings"
	"testing"
)

// TestForwardPolicyDrop: on a host whose iptables FORWARD policy is DROP,
// as Docker leaves it, sandboxes still reach what their egress policy
// allows and nothing more, through rules lizard adds (in DOCKER-USER when
// that chain exists, else in FORWARD; in iptables-nft and iptables-legacy
// alike) and removes when it stops. Each case is a node of its own (a
// network namespace with that firewall) running lizard; the internet is the
// fake one.
func TestForwardPolicyDrop(t *testing.T) {
	requirements(t)
	startFakeInternet(t)
	for i, tc := range []struct {
		name  string
		setup [][]string        // firewall commands run in the node first
		want  map[string]string // iptables command → chain lizard's rules belong in
	}{
		{
			name:  "iptables-nft FORWARD policy DROP",
			setup: [][]string{{"iptables-nft", "-P", "FORWARD", "DROP"}},
			want:  map[string]string{"iptables-nft": "FORWARD"},
		},
		{
			name: "Docker's chains in iptables-nft and a DROP policy in iptables-legacy too",
			setup: [][]string{
				{"iptables-nft", "-P", "FORWARD", "DROP"},
				{"iptables-nft", "-N", "DOCKER-USER"},
				{"iptables-nft", "-A", "DOCKER-USER", "-j", "RETURN"},
				{"iptables-nft", "-A", "FORWARD", "-j", "DOCKER-USER"},
				{"iptables-nft", "-A", "FORWARD", "-j", "DROP"},
				{"iptables-legacy", "-P", "FORWARD", "DROP"},
			},
			want: map[string]string{"iptables-nft": "DOCKER-USER", "iptables-legacy": "FORWARD"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := newTestNode(t, 10+i)
			for _, c := range tc.setup {
				node.exec(t, c...)
			}
			dir := t.TempDir()
			s := newServerOn(t, node, dir, databaseFor(t, dir), "--dns-upstream", "10.99.0.1:5353")
			bridge := s.bridge()
			// rules checks that each backend holds lizard's two rules, in
			// the chain they belong in, once; n == 0: none at all.
			rules := func(when string, n int) {
				t.Helper()
				for bin, chain := range tc.want {
					all := lines(node.exec(t, bin, "-w", "5", "-S"), "lizard "+bridge)
					in := lines(strings.Join(all, "\n"), "-A "+chain+" ")
					if len(all) != n || len(in) != n {
						t.Fatalf("%s: %s has %d lizard rules (%d in %s), want %d:\n%s", when, bin, len(all), len(in), chain, n, node.exec(t, bin, "-S"))
					}
				}
			}

			s.start()
			rules("after start", 2)
			open := s.createWith(t, map[string]any{})
			closed := s.createWith(t, map[string]any{"internetAccess": false})
			byName := s.createWith(t, map[string]any{"internetAccess": false, "allowedHosts": []string{"allowed.test"}})
			byCIDR := s.createWith(t, map[string]any{"allowedHosts": []string{"10.99.0.3/32"}})
			// What each sandbox reaches: the fake internet's answer, or ""
			// when its policy keeps it out.
			want := []struct {
				sb       sandboxInfoEgress
				url, got string
			}{
				{open, "http://10.99.0.2:8080/", "internet 10.99.0.2"},
				{open, "http://denied.test:8080/", "internet 10.99.0.3"},
				{closed, "http://10.99.0.2:8080/", ""},
				{byName, "http://allowed.test:8080/", "internet 10.99.0.2"},
				{byName, "http://10.99.0.3:8080/", ""},
				{byCIDR, "http://10.99.0.3:8080/", "internet 10.99.0.3"},
				{byCIDR, "http://10.99.0.2:8080/", ""},
			}
			policies := func(when string) {
				t.Helper()
				for _, w := range want {
					if got := s.reach(t, w.sb.SandboxID, w.url); got != w.got {
						t.Fatalf("%s: sandbox %+v, %s: got %q, want %q", when, w.sb, w.url, got, w.got)
					}
				}
			}
			policies("after start")

			// A server killed with -9 leaves its rules; the next start
			// neither duplicates nor loses them.
			s.crash()
			s.start()
			rules("after kill -9 and start", 2)
			policies("after kill -9 and start")

			// Without lizard's rules the DROP policy cuts the sandboxes off:
			// the rules are what lets the traffic through.
			for bin, chain := range tc.want {
				node.exec(t, bin, "-w", "5", "-D", chain, "-i", bridge, "-m", "comment", "--comment", "lizard "+bridge, "-j", "ACCEPT")
			}
			if got := s.reach(t, open.SandboxID, "http://10.99.0.2:8080/"); got != "" {
				t.Fatalf("the FORWARD policy is not in effect: without lizard's rules the open sandbox reached %q", got)
			}
			s.stop()
			s.start()
			rules("after a restart", 2)
			policies("after a restart")

			for _, sb := range []sandboxInfoEgress{open, closed, byName, byCIDR} {
				if code, raw := s.do("DELETE", "/api/sandboxes/"+sb.SandboxID, nil, nil); code >= 300 {
					t.Fatalf("delete %s: %d %s", sb.SandboxID, code, raw)
				}
			}
			s.waitNoLeaks(t)
			s.stop()
			rules("after stop", 0)
		})
	}
}
