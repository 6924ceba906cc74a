package gvisor

import (
	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/network"
	"github.com/lizard-build/lizard/internal/runtime"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// agentPath is where lizard-agent appears inside every sandbox.
const agentPath = "/.lizard/agent"

// CLIPath is where the lizard CLI appears inside sandboxes (Config.CLIPath):
// on the PATH of every shell, login shells included.
const CLIPath = "/usr/local/bin/lizard"

// defaultCaps is Docker's default capability set plus SYS_PTRACE: root in a
// sandbox can do what root in a container usually can; gVisor stands between
// it and the host kernel.
var defaultCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
	"CAP_SYS_PTRACE",
}

// ociSpec is the bundle's config.json for a sandbox whose cgroup is
// cgroupsPath: the agent as its init, bind-mounted read-only, the lizard
// CLI at CLIPath, read-only too, unless cliHostPath is "", and the egress
// CA's certificate at agent.EgressCAFile unless caHostPath is "".
func ociSpec(s runtime.Spec, agentHostPath, cliHostPath, caHostPath, etcDir, cgroupsPath string, ep network.Endpoint) *specs.Spec {
	proc := process([]string{agentPath}, []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=/root",
		agent.EnvToken + "=" + s.AgentToken,
	}, "/", 0, 0)
	own := []specs.Mount{{Destination: agentPath, Type: "bind", Source: agentHostPath, Options: []string{"bind", "ro"}}}
	if cliHostPath != "" {
		own = append(own, specs.Mount{Destination: CLIPath, Type: "bind", Source: cliHostPath, Options: []string{"bind", "ro"}})
	}
	if caHostPath != "" {
		own = append(own, specs.Mount{Destination: agent.EgressCAFile, Type: "bind", Source: caHostPath, Options: []string{"bind", "ro"}})
	}
	spec := containerSpec(s.ID, s.Rootfs, etcDir, ep.Netns, cgroupsPath, proc, s.Resources, own, s.Mounts)
	// A sandbox always has a CPU quota (of 0 when asked none, as ever:
	// checkpoints are restored with the spec they were taken with).
	if spec.Linux.Resources.CPU == nil {
		period, quota := uint64(100000), int64(0)
		spec.Linux.Resources.CPU = &specs.LinuxCPU{Quota: &quota, Period: &period}
	}
	return spec
}

// hasMount says whether the bundle's spec mounts something at dest.
func hasMount(spec *specs.Spec, dest string) bool {
	for _, m := range spec.Mounts {
		if m.Destination == dest {
			return true
		}
	}
	return false
}

// runSpec is the bundle's config.json for a Runner container whose cgroup
// is cgroupsPath: the command itself is its init, and its root is the
// rootfs itself.
func runSpec(s runtime.RunSpec, etcDir, cgroupsPath string, ep network.Endpoint) *specs.Spec {
	hostname := s.Hostname
	if hostname == "" {
		hostname = s.ID
	}
	proc := process(s.Args, s.Env, s.Cwd, s.UID, s.GID)
	return containerSpec(hostname, s.Rootfs, etcDir, ep.Netns, cgroupsPath, proc, s.Resources, nil, s.Mounts)
}

// process is the init process of a container: Docker's default
// capabilities (defaultCaps) and a high open-file limit.
func process(args, env []string, cwd string, uid, gid uint32) *specs.Process {
	return &specs.Process{
		Args: args,
		Env:  env,
		Cwd:  cwd,
		User: specs.User{UID: uid, GID: gid},
		Capabilities: &specs.LinuxCapabilities{
			Bounding: defaultCaps, Effective: defaultCaps, Permitted: defaultCaps,
		},
		Rlimits: []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 1 << 20, Soft: 1 << 20}},
	}
}

// containerSpec is a container's OCI config: proc in fresh namespaces but
// the network namespace netns, cgroup with res's limits (a CPU quota only
// when res.CPUs is set), /proc, /dev, /sys, the mounts in own, the
// container's /etc/hosts and /etc/resolv.conf from etcDir, then mounts.
func containerSpec(hostname, rootfs, etcDir, netns, cgroup string, proc *specs.Process, res runtime.Resources, own []specs.Mount, mounts []runtime.Mount) *specs.Spec {
	mem := res.MemoryMB << 20
	pids := res.Pids
	spec := &specs.Spec{
		Version:  specs.Version,
		Process:  proc,
		Root:     &specs.Root{Path: rootfs},
		Hostname: hostname,
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		},
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace},
				{Type: specs.MountNamespace}, {Type: specs.NetworkNamespace, Path: netns},
			},
			CgroupsPath: cgroup,
			Resources: &specs.LinuxResources{
				Memory: &specs.LinuxMemory{Limit: &mem},
				Pids:   &specs.LinuxPids{Limit: &pids},
			},
		},
	}
	if res.CPUs > 0 {
		period := uint64(100000)
		quota := int64(res.CPUs * float64(period))
		spec.Linux.Resources.CPU = &specs.LinuxCPU{Quota: &quota, Period: &period}
	}
	spec.Mounts = append(spec.Mounts, own...)
	spec.Mounts = append(spec.Mounts,
		// The container's own name resolution: its hostname, and the
		// gateway as nameserver rather than whatever resolver the
		// template's build host had.
		specs.Mount{Destination: "/etc/hosts", Type: "bind", Source: etcDir + "/hosts", Options: []string{"bind", "rw"}},
		specs.Mount{Destination: "/etc/resolv.conf", Type: "bind", Source: etcDir + "/resolv.conf", Options: []string{"bind", "rw"}},
	)
	for _, m := range mounts {
		mode := "rw"
		if m.ReadOnly {
			mode = "ro"
		}
		spec.Mounts = append(spec.Mounts, specs.Mount{Destination: m.Destination, Type: "bind", Source: m.Source, Options: []string{"bind", mode}})
	}
	return spec
}

// etcFiles are a container's /etc/hosts and /etc/resolv.conf.
func etcFiles(hostname string, ep network.Endpoint) map[string]string {
	return map[string]string{
		"hosts": "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n" +
			ep.Addr.String() + "\t" + hostname + "\n",
		// A nameserver that answers, or refuses at once: a lookup must never
		// hang on an address the sandbox cannot reach (Python's http.server
		// looks up its own name before it listens). While the server
		// restarts its resolver does not answer (the firewall drops the
		// port unreachable): a query is asked again every second, so a
		// lookup outlasts a restart of a few seconds.
		"resolv.conf": "nameserver " + ep.Gateway.String() + "\noptions timeout:1 attempts:5\n",
	}
}
