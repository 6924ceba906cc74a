//go:build linux

package template

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/runtime"
	"github.com/lizard-build/lizard/internal/slowness"
)

// recordingRunner is a runtime that notes every container it runs.
type recordingRunner struct {
	runtime.Runner
	mu    sync.Mutex
	specs []runtime.RunSpec
}

func (r *recordingRunner) Run(ctx context.Context, spec runtime.RunSpec) (int, error) {
	r.mu.Lock()
	r.specs = append(r.specs, spec)
	r.mu.Unlock()
	return r.Runner.Run(ctx, spec)
}

// secondStage is how debootstrap's second stage shows in a step's command.
const secondStage = "/debootstrap/debootstrap --second-stage"

// check fails t unless every container run went on the build network
// with the build's hostname and a rootfs, and one ran each of want.
func (r *recordingRunner) check(t *testing.T, want ...string) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	var ran []string
	for _, s := range r.specs {
		if s.Network == nil || s.Hostname != "build" || s.Rootfs == "" {
			t.Errorf("step %q: network %v, hostname %q, rootfs %q", s.Args, s.Network, s.Hostname, s.Rootfs)
		}
		ran = append(ran, strings.Join(s.Args, " "))
	}
	t.Logf("containers run: %q", ran)
	for _, w := range want {
		if !slices.ContainsFunc(ran, func(a string) bool { return strings.Contains(a, w) }) {
			t.Errorf("no step ran %q in a container", w)
		}
	}
}

// TestRecipeStepsRunInContainers builds a small recipe (an apt-get install,
// the user, a post step that runs a command, a check) and shows that every
// step running the rootfs's programs ran in a gVisor container on the build
// network, not on the host: debootstrap's second stage, apt-get, groupadd
// and useradd, the post step's command and the check all went through the
// runtime; what the command saw was the container's hostname, gVisor's
// kernel and an address of the build subnet; and nothing is left behind
// (no containers, network namespaces, veths, bridge, firewall table,
// cgroups or mounts). After TestBuildBaseReal it starts from that test's
// debootstrap (seedshare_linux_test.go); alone, it takes minutes: a whole
// debootstrap.
func TestRecipeStepsRunInContainers(t *testing.T) {
	r, rt := needRealBuild(t, "")
	seeded := useSharedSeeds(t, r)
	rec := &recordingRunner{Runner: rt}
	r.Runtime = rec
	const probe = "hostname > /probe-host; cat /proc/version > /probe-kernel; ip -4 -o addr show scope global > /probe-addr"
	builtins["probe"] = debian([]string{"less"},
		[]postStep{{"probing where steps run", func(ctx context.Context, _ string, in runIn) error {
			return in(ctx, "sh", "-c", probe)
		}}},
		[]string{"sh", "-c", `test "$(hostname)" = build`}, []string{"less", "--version"})
	defer delete(builtins, "probe")

	ctx, cancel := context.WithTimeout(context.Background(), slowness.Scale(30*time.Minute))
	defer cancel()
	tpl, err := r.Build(ctx, "probe", testWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	checkBaseRootfs(t, tpl.Rootfs)

	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(tpl.Rootfs, p))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	if h := read("probe-host"); h != "build" {
		t.Errorf("the step's hostname is %q, want the container's, build", h)
	}
	hostKernel, _ := os.ReadFile("/proc/version")
	if k := read("probe-kernel"); k == strings.TrimSpace(string(hostKernel)) {
		t.Errorf("the step saw the host's kernel %q, not gVisor's", k)
	}
	addr := read("probe-addr")
	inSubnet := false
	for _, f := range strings.Fields(addr) {
		if p, err := netip.ParsePrefix(f); err == nil && rt.net.Subnet.Contains(p.Addr()) {
			inSubnet = true
		}
	}
	if !inSubnet {
		t.Errorf("the step's addresses %q are not on the build network %s", addr, rt.net.Subnet)
	}

	want := []string{"apt-get -q -y", "update", "install --no-install-recommends",
		"/usr/sbin/groupadd", "/usr/sbin/useradd", probe, `test "$(hostname)" = build`, "less --version"}
	if !seeded {
		// From a seed, debootstrap did not run here: TestBuildBaseReal,
		// whose debootstrap made the seed, checks its second stage.
		want = append(want, secondStage)
	}
	rec.check(t, want...)
	checkClean(t, r)
	if leaks := buildLeaks(r.Dir(), rt); len(leaks) > 0 {
		t.Errorf("left behind: %q", leaks)
	}
}
