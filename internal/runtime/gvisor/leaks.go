package gvisor

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/lizard-build/lizard/internal/network"
)

// Leaks lists what the host still holds for sandbox (or Run container) id,
// or for every container of this runtime when id is "": mounts, network
// namespaces, veths, cgroups, runsc processes and state directories. Only
// this runtime's are counted (its namespace prefix, bridge, cgroup parent,
// runsc root and state directory), so servers sharing a host each see
// their own; Run's containers count as the sandboxes (their cgroups are
// under the same parent, their directories in the state directory's
// runsDir). Tests use it to prove that destroy and failed creates clean up.
func (r *Runtime) Leaks(id string) []string {
	var out []string
	match := func(s string) bool { return id == "" || strings.Contains(s, id) }
	prefix, bridge := network.DefaultNetnsPrefix, ""
	if r.cfg.Network != nil { // a runtime of Runs only has none
		prefix, bridge = r.cfg.Network.NetnsPrefix(), r.cfg.Network.Bridge()
	}

	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) > 4 && (OwnNetns(prefix, filepath.Base(f[4])) && filepath.Dir(f[4]) == "/run/netns" || strings.HasPrefix(f[4], r.cfg.StateDir+"/")) && match(f[4]) {
				out = append(out, "mount "+f[4])
			}
		}
	}
	if ents, err := os.ReadDir("/run/netns"); err == nil {
		for _, e := range ents {
			if OwnNetns(prefix, e.Name()) && match(e.Name()) {
				out = append(out, "netns "+e.Name())
			}
		}
	}
	veth := ""
	if id != "" {
		veth = network.EndpointFor(prefix, id).HostVeth
	}
	for _, name := range OwnVeths(bridge) {
		if veth == "" || name == veth {
			out = append(out, "veth "+name)
		}
	}
	for _, m := range CgroupDirs(cgroupRoot, r.cfg.CgroupParent, id) {
		out = append(out, "cgroup "+m)
	}
	if ents, err := os.ReadDir("/proc"); err == nil {
		for _, e := range ents {
			b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
			if err != nil || len(b) == 0 {
				continue
			}
			cmd := strings.ReplaceAll(string(b), "\x00", " ")
			if strings.Contains(cmd, "runsc") && strings.Contains(cmd, r.cfg.RunscRoot) && match(cmd) &&
				(strings.Contains(cmd, "boot") || strings.Contains(cmd, "gofer")) {
				out = append(out, "process "+e.Name()+" "+trunc(cmd, 120))
			}
		}
	}
	// Sandboxes' directories, and those of Run's containers in runsDir.
	for _, dir := range []string{r.cfg.StateDir, filepath.Join(r.cfg.StateDir, runsDir)} {
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			if e.Name() != runsDir && match(e.Name()) {
				out = append(out, "dir "+filepath.Join(dir, e.Name()))
			}
		}
	}
	return out
}

// OwnNetns says whether the network namespace name is one of a server
// whose namespace prefix is prefix: <prefix>-<sandbox id>. Sandbox ids have
// no '-', so the namespaces of a server with prefix "lizard-a" are not
// those of one with prefix "lizard".
func OwnNetns(prefix, name string) bool {
	rest, ok := strings.CutPrefix(name, prefix+"-")
	return ok && validID(rest)
}

// OwnVeths lists the sandbox veths (lzv…) in this process's network
// namespace that hang on bridge, or on no bridge at all (left over after
// their bridge went): not those of another server's bridge.
func OwnVeths(bridge string) []string {
	links, err := netlink.LinkList()
	if err != nil {
		return nil
	}
	own := -1
	for _, l := range links {
		if l.Attrs().Name == bridge {
			own = l.Attrs().Index
		}
	}
	var out []string
	for _, l := range links {
		if a := l.Attrs(); strings.HasPrefix(a.Name, "lzv") && (a.MasterIndex == 0 || a.MasterIndex == own) {
			out = append(out, a.Name)
		}
	}
	return out
}

const cgroupRoot = "/sys/fs/cgroup"

// CgroupDirs lists the cgroup directories of sandbox id, or of every
// sandbox when id is "", under parent (Config.CgroupParent) below root (the
// cgroup mount, /sys/fs/cgroup), in both layouts: cgroup v1 has one
// hierarchy per controller (root/<controller>/<parent>/<id>, and
// root/unified/<parent>/<id> in the hybrid layout), cgroup v2 a single one
// (root/<parent>/<id>).
func CgroupDirs(root, parent, id string) []string {
	name := id
	if name == "" {
		name = "*"
	}
	var out []string
	for _, pattern := range []string{filepath.Join(root, "*", cgroupPath(parent, name)), filepath.Join(root, cgroupPath(parent, name))} {
		ms, _ := filepath.Glob(pattern)
		for _, m := range ms {
			if fi, err := os.Stat(m); err == nil && fi.IsDir() {
				out = append(out, m)
			}
		}
	}
	return out
}

func trunc(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
