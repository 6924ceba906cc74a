package network

import (
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/vishvananda/netns"
)

// inNewNetns runs f on a thread in a new network namespace of its own
// (commands f starts inherit it); the namespace goes when f returns.
func inNewNetns(t *testing.T, f func()) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes a network namespace")
	}
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	ns, err := netns.New()
	if err != nil {
		orig.Close()
		t.Fatal(err)
	}
	defer func() {
		ns.Close()
		if err := netns.Set(orig); err == nil {
			// Stuck in the new namespace otherwise: the thread dies with
			// the goroutine instead of being reused.
			runtime.UnlockOSThread()
		}
		orig.Close()
	}()
	f()
}

// TestAllowForward: lizard's rules go in DOCKER-USER when it exists, else
// FORWARD, of every iptables backend in use, once however often the network
// starts, and nowhere after close; a namespace without iptables tables gets
// none (and no table made by looking).
func TestAllowForward(t *testing.T) {
	for _, bin := range []string{"iptables-nft", "iptables-legacy"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s not installed", bin)
		}
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tc := range []struct {
		name  string
		setup [][]string
		want  map[string]string // backend → chain holding the rules
	}{
		{"no iptables", nil, map[string]string{}},
		{"nft FORWARD", [][]string{{"iptables-nft", "-P", "FORWARD", "DROP"}}, map[string]string{"iptables-nft": "FORWARD"}},
		{"legacy FORWARD", [][]string{{"iptables-legacy", "-P", "FORWARD", "DROP"}}, map[string]string{"iptables-legacy": "FORWARD"}},
		{"nft DOCKER-USER and legacy FORWARD", [][]string{
			{"iptables-nft", "-N", "DOCKER-USER"}, {"iptables-nft", "-A", "FORWARD", "-j", "DOCKER-USER"},
			{"iptables-legacy", "-P", "FORWARD", "DROP"},
		}, map[string]string{"iptables-nft": "DOCKER-USER", "iptables-legacy": "FORWARD"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inNewNetns(t, func() {
				for _, c := range tc.setup {
					if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
						t.Fatalf("%v: %v %s", c, err, out)
					}
				}
				check := func(when string, n int) {
					t.Helper()
					if got := len(iptablesInUse((*exec.Cmd).Run)); got != len(tc.want) {
						t.Fatalf("%s: %d iptables backends in use, want %d", when, got, len(tc.want))
					}
					for bin, chain := range tc.want {
						out, err := exec.Command(bin, "-S").CombinedOutput()
						if err != nil {
							t.Fatalf("%s -S: %v %s", bin, err, out)
						}
						all, in := 0, 0
						for _, l := range strings.Split(string(out), "\n") {
							if strings.Contains(l, `"lizard br-test"`) {
								all++
								if strings.HasPrefix(l, "-A "+chain+" ") {
									in++
								}
							}
						}
						if all != n || in != n {
							t.Fatalf("%s: %s has %d lizard rules, %d in %s; want %d:\n%s", when, bin, all, in, chain, n, out)
						}
					}
				}
				var fs []*hostForward
				for range 2 { // a second start (after kill -9) neither duplicates nor loses them
					f, err := allowForward("br-test", nil, log)
					if err != nil {
						t.Fatal(err)
					}
					fs = append(fs, f)
					check("after start", 2)
				}
				fs[1].close()
				check("after close", 0)
			})
		})
	}
}
