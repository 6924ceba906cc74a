package gvisor

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/lizard-build/lizard/internal/network"
)

// Leaks lists what the host still holds for sandbox (or Run container) id,
// or for every lizard sandbox when id is "": mounts, network namespaces, veths, cgroups, runsc
// processes and state directories. Tests use it to prove that destroy and
// failed creates clean up.
func (r *Runtime) Leaks(id string) []string {
	var out []string
	match := func(s string) bool { return id == "" || strings.Contains(s, id) }

	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) > 4 && (strings.HasPrefix(f[4], "/run/netns/lizard-") || strings.HasPrefix(f[4], r.cfg.StateDir+"/")) && match(f[4]) {
				out = append(out, "mount "+f[4])
			}
		}
	}
	if ents, err := os.ReadDir("/run/netns"); err == nil {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), "lizard-") && match(e.Name()) {
				out = append(out, "netns "+e.Name())
			}
		}
	}
	veth := ""
	if id != "" {
		veth = network.EndpointFor(id).HostVeth
	}
	if ents, err := os.ReadDir("/sys/class/net"); err == nil {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), "lzv") && (veth == "" || e.Name() == veth) {
				out = append(out, "veth "+e.Name())
			}
		}
	}
	for _, m := range CgroupDirs(cgroupRoot, id) {
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

const cgroupRoot = "/sys/fs/cgroup"

// CgroupDirs lists the cgroup directories of sandbox id, or of every
// sandbox when id is "", under root (the cgroup mount, /sys/fs/cgroup), in
// both layouts: cgroup v1 has one hierarchy per controller
// (root/<controller>/lizard/<id>, and root/unified/lizard/<id> in the
// hybrid layout), cgroup v2 a single one (root/lizard/<id>).
func CgroupDirs(root, id string) []string {
	name := id
	if name == "" {
		name = "*"
	}
	var out []string
	for _, pattern := range []string{filepath.Join(root, "*", cgroupPath(name)), filepath.Join(root, cgroupPath(name))} {
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
