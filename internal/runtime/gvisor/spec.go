package gvisor

import (
	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/network"
	"github.com/lizard-build/lizard/internal/runtime"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// agentPath is where lizard-agent appears inside every sandbox.
const agentPath = "/.lizard/agent"

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
// cgroupsPath.
func ociSpec(s runtime.Spec, agentHostPath, etcDir, cgroupsPath string, ep network.Endpoint) *specs.Spec {
	mem := s.Resources.MemoryMB << 20
	period := uint64(100000)
	quota := int64(s.Resources.CPUs * float64(period))
	pids := s.Resources.Pids
	spec := &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			Args: []string{agentPath},
			Env: []string{
				"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
				"HOME=/root",
				agent.EnvToken + "=" + s.AgentToken,
			},
			Cwd:  "/",
			User: specs.User{UID: 0, GID: 0},
			Capabilities: &specs.LinuxCapabilities{
				Bounding: defaultCaps, Effective: defaultCaps, Permitted: defaultCaps,
			},
			Rlimits: []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 1 << 20, Soft: 1 << 20}},
		},
		Root:     &specs.Root{Path: s.Rootfs},
		Hostname: s.ID,
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			{Destination: agentPath, Type: "bind", Source: agentHostPath, Options: []string{"bind", "ro"}},
			// The sandbox's own name resolution: its hostname, and the
			// gateway as nameserver rather than whatever resolver the
			// template's build host had.
			{Destination: "/etc/hosts", Type: "bind", Source: etcDir + "/hosts", Options: []string{"bind", "rw"}},
			{Destination: "/etc/resolv.conf", Type: "bind", Source: etcDir + "/resolv.conf", Options: []string{"bind", "rw"}},
		},
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace},
				{Type: specs.MountNamespace}, {Type: specs.NetworkNamespace, Path: ep.Netns},
			},
			CgroupsPath: cgroupsPath,
			Resources: &specs.LinuxResources{
				Memory: &specs.LinuxMemory{Limit: &mem},
				CPU:    &specs.LinuxCPU{Quota: &quota, Period: &period},
				Pids:   &specs.LinuxPids{Limit: &pids},
			},
		},
	}
	for _, m := range s.Mounts {
		mode := "rw"
		if m.ReadOnly {
			mode = "ro"
		}
		spec.Mounts = append(spec.Mounts, specs.Mount{Destination: m.Destination, Type: "bind", Source: m.Source, Options: []string{"bind", mode}})
	}
	return spec
}

// etcFiles are the sandbox's /etc/hosts and /etc/resolv.conf.
func etcFiles(id string, ep network.Endpoint) map[string]string {
	return map[string]string{
		"hosts": "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n" +
			ep.Addr.String() + "\t" + id + "\n",
		// A nameserver that answers, or refuses at once: a lookup must never
		// hang on an address the sandbox cannot reach (Python's http.server
		// looks up its own name before it listens). While the server
		// restarts its resolver does not answer (the firewall drops the
		// port unreachable): a query is asked again every second, so a
		// lookup outlasts a restart of a few seconds.
		"resolv.conf": "nameserver " + ep.Gateway.String() + "\noptions timeout:1 attempts:5\n",
	}
}
