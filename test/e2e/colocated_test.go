package e2e

import (
	"strings"
	"testing"
)

// TestTwoServersOneHost: two single-node servers share the host and its
// network namespace, each with its own bridge, subnets, data dir (SQLite)
// and --cgroup-parent, one of them with the harness's, the other with
// names the test gives it. Each one's leak scan
// sees its own sandboxes and none of the other's; a kill -9 and restart of
// either reattaches its own sandboxes and leaves the other's running
// untouched (same processes, still counting); afterwards nothing is left
// on either.
func TestTwoServersOneHost(t *testing.T) {
	a := startServer(t, "") // the harness's names for its data dir
	b := startServer(t, "", "--bridge", "lizarde1", "--subnet", "10.249.0.0/16",
		"--build-bridge", "lzbuilde1", "--build-subnet", "10.248.0.0/16", "--cgroup-parent", "lizard-e2e1")
	if a.cgroupParent() == b.cgroupParent() || a.bridge() == b.bridge() {
		t.Fatalf("the servers share a cgroup parent or bridge: %s/%s, %s/%s", a.cgroupParent(), a.bridge(), b.cgroupParent(), b.bridge())
	}

	type box struct {
		s            *server
		running      string // counting in the background
		paused       string
		pid, counted int
	}
	boxes := []*box{{s: a}, {s: b}}
	for _, bx := range boxes {
		bx.running, bx.paused = bx.s.create(t), bx.s.create(t)
		bx.s.sh(t, bx.running, counterScript)
		bx.s.sh(t, bx.paused, "echo kept > /root/kept")
		if code, body := bx.s.do("POST", "/api/sandboxes/"+bx.paused+"/pause", nil, nil); code != 200 {
			t.Fatalf("pause: %d %s", code, body)
		}
		bx.pid, bx.counted = bx.s.counter(t, bx.running)
	}

	// Each server's scan of the host sees its own sandboxes only.
	for i, bx := range boxes {
		other := boxes[1-i]
		l := strings.Join(bx.s.leaks(), "\n")
		if !strings.Contains(l, "netns "+bx.s.cgroupParent()+"-"+bx.running) || !strings.Contains(l, "cgroup ") {
			t.Fatalf("server %d's scan misses its own running sandbox %s:\n%s", i, bx.running, l)
		}
		for _, id := range []string{other.running, other.paused} {
			if strings.Contains(l, id) {
				t.Fatalf("server %d's scan sees the other server's sandbox %s:\n%s", i, id, l)
			}
		}
	}

	// Kill -9 and restart each in turn: its own sandboxes come back, the
	// other's never stop.
	for i, bx := range boxes {
		other := boxes[1-i]
		bx.s.crash()
		bx.s.start()
		if strings.Contains(bx.s.logs(), other.running) || strings.Contains(bx.s.logs(), other.paused) {
			t.Fatalf("server %d's restart mentions the other server's sandboxes:\n%s", i, bx.s.logs())
		}
		for _, x := range boxes {
			pid, n := x.s.counter(t, x.running)
			if pid != x.pid || n <= x.counted {
				t.Fatalf("after server %d's kill -9 and restart, sandbox %s: counter pid %d at %d, want pid %d past %d", i, x.running, pid, n, x.pid, x.counted)
			}
			x.counted = n
			if st := x.s.status(t, x.paused); st != "paused" {
				t.Fatalf("after server %d's kill -9 and restart, paused sandbox %s is %s", i, x.paused, st)
			}
		}
	}
	for _, bx := range boxes {
		if code, body := bx.s.do("POST", "/api/sandboxes/"+bx.paused+"/resume", nil, nil); code != 200 {
			t.Fatalf("resume: %d %s", code, body)
		}
		if got := bx.s.sh(t, bx.paused, "cat /root/kept"); got != "kept\n" {
			t.Fatalf("resumed sandbox's file: %q", got)
		}
	}

	for _, bx := range boxes {
		for _, id := range []string{bx.running, bx.paused} {
			if code, body := bx.s.do("DELETE", "/api/sandboxes/"+id, nil, nil); code >= 300 {
				t.Fatalf("kill %s: %d %s", id, code, body)
			}
		}
	}
	for _, bx := range boxes {
		bx.s.waitNoLeaks(t)
		bx.s.stop()
	}
	for _, bx := range boxes {
		bx.s.waitNoLeaks(t)
	}
}
