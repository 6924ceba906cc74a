package main

import (
	"flag"
	"fmt"
	"net/netip"
	"strings"

	"github.com/lizard-build/lizard/internal/runtime/gvisor"
	"github.com/lizard-build/lizard/internal/template"
)

// buildFlags are the template build flags `serve` and `template build`
// share: the build network, the registries image pulls may reach and their
// credentials, and the Debian mirror.
type buildFlags struct {
	bridge, subnet string
	allow          listFlag
	auth           string
	mirror         string
	cgroupParent   string
}

func (f *buildFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.bridge, "build-bridge", template.DefaultBuildBridge, "host bridge of the network build steps run on (Dockerfile RUN steps, built-in recipes' apt-get, useradd, checks)")
	fs.StringVar(&f.subnet, "build-subnet", template.DefaultBuildSubnet.String(), "subnet of the build network (another server on the host needs another)")
	fs.Var(&f.allow, "registry-allow", "HOST[:PORT] of a registry FROM may pull from although it is on a loopback, link-local or private address (repeatable)")
	fs.StringVar(&f.auth, "registry-auth", "", "registry credentials for image pulls, a file in Docker's config.json format (\"auths\"); default: none")
	fs.StringVar(&f.cgroupParent, "cgroup-parent", gvisor.DefaultCgroupParent, "this server's name on the host: sandboxes' and Dockerfile RUN steps' cgroups go under /NAME (lizard template build's RUN steps' under /NAME-build) and their network namespaces are NAME-<id>; another server on the host needs another")
	fs.StringVar(&f.mirror, "debian-mirror", "", "Debian mirror URL for built-in templates (default: the host's, from /etc/apt/sources.list*)")
}

// options returns the build network and pull policy the flags say, for
// builds beside sandboxes on sandboxSubnet, which RUN steps may not reach.
func (f *buildFlags) options(sandboxSubnet netip.Prefix) (template.DockerfileOptions, error) {
	subnet, err := netip.ParsePrefix(f.subnet)
	if err != nil {
		return template.DockerfileOptions{}, fmt.Errorf("--build-subnet: %w", err)
	}
	if subnet.Overlaps(sandboxSubnet) {
		return template.DockerfileOptions{}, fmt.Errorf("--build-subnet %s overlaps the sandboxes' subnet %s", subnet, sandboxSubnet)
	}
	if f.bridge == "" || len(f.bridge) > 15 {
		return template.DockerfileOptions{}, fmt.Errorf("--build-bridge %q: need an interface name of 1 to 15 characters", f.bridge)
	}
	if err := gvisor.ValidCgroupParent(f.cgroupParent); err != nil {
		return template.DockerfileOptions{}, fmt.Errorf("--cgroup-parent: %w", err)
	}
	pull, err := template.NewPullPolicy(f.allow, f.auth)
	if err != nil {
		return template.DockerfileOptions{}, err
	}
	return template.DockerfileOptions{BuildBridge: f.bridge, BuildSubnet: subnet, BuildDeny: []netip.Prefix{sandboxSubnet}, Pull: pull,
		NetnsPrefix: f.cgroupParent}, nil
}

// listFlag collects a repeatable flag's values.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(s string) error {
	*l = append(*l, s)
	return nil
}
