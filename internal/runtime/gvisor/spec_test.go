package gvisor

import (
	"github.com/lizard-build/lizard/internal/agent"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/lizard-build/lizard/internal/network"
	"github.com/lizard-build/lizard/internal/runtime"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// TestOCISpecMounts: the bundle has the agent and exactly the Spec's mounts,
// read-only where asked, read-write otherwise.
func TestOCISpecMounts(t *testing.T) {
	ep := network.Endpoint{Netns: "/run/netns/lizard-x", Addr: netip.MustParseAddr("10.250.0.2"), Gateway: netip.MustParseAddr("10.250.0.1")}
	base := ociSpec(runtime.Spec{ID: "x", Rootfs: "/rootfs"}, "/agent", "", "", "/etc-dir", "/lizard/x", ep)
	with := ociSpec(runtime.Spec{ID: "x", Rootfs: "/rootfs", Mounts: []runtime.Mount{
		{Source: "/prog.py", Destination: "/.lizard/prog.py", ReadOnly: true},
		{Source: "/vol", Destination: "/workspace"},
	}}, "/agent", "", "", "/etc-dir", "/lizard/x", ep)
	if len(with.Mounts) != len(base.Mounts)+2 {
		t.Fatalf("%d mounts with two more than %d", len(with.Mounts), len(base.Mounts))
	}
	for _, m := range base.Mounts {
		if m.Destination == "/.lizard/prog.py" || m.Destination == "/workspace" {
			t.Fatalf("a spec without mounts has %+v", m)
		}
	}
	if !slices.ContainsFunc(base.Mounts, func(m specs.Mount) bool { return m.Destination == agentPath && m.Source == "/agent" }) {
		t.Fatalf("no agent mount in %+v", base.Mounts)
	}
	for dst, want := range map[string]string{"/.lizard/prog.py": "ro", "/workspace": "rw"} {
		i := slices.IndexFunc(with.Mounts, func(m specs.Mount) bool { return m.Destination == dst })
		if i < 0 {
			t.Fatalf("no mount at %s in %+v", dst, with.Mounts)
		}
		if m := with.Mounts[i]; m.Type != "bind" || !slices.Equal(m.Options, []string{"bind", want}) {
			t.Fatalf("mount at %s = %+v, want a %s bind", dst, m, want)
		}
	}
}

// TestOCISpecOwnMounts: with a CLI path the sandbox has the lizard binary
// at CLIPath, with a CA path the egress CA at agent.EgressCAFile, both
// read-only, and hasMount tells such a spec (and so an image of it) from
// one without.
func TestOCISpecOwnMounts(t *testing.T) {
	ep := network.Endpoint{Netns: "/run/netns/lizard-x", Addr: netip.MustParseAddr("10.250.0.2"), Gateway: netip.MustParseAddr("10.250.0.1")}
	without := ociSpec(runtime.Spec{ID: "x", Rootfs: "/rootfs"}, "/agent", "", "", "/etc-dir", "/lizard/x", ep)
	with := ociSpec(runtime.Spec{ID: "x", Rootfs: "/rootfs"}, "/agent", "/data/cli/lizard-1234", "/data/egress/ca.pem", "/etc-dir", "/lizard/x", ep)
	for dst, src := range map[string]string{CLIPath: "/data/cli/lizard-1234", agent.EgressCAFile: "/data/egress/ca.pem"} {
		if hasMount(without, dst) || !hasMount(with, dst) {
			t.Fatalf("hasMount %s: without %v, with %v", dst, hasMount(without, dst), hasMount(with, dst))
		}
		i := slices.IndexFunc(with.Mounts, func(m specs.Mount) bool { return m.Destination == dst })
		if m := with.Mounts[i]; m.Source != src || m.Type != "bind" || !slices.Equal(m.Options, []string{"bind", "ro"}) {
			t.Fatalf("mount at %s: %+v", dst, m)
		}
	}
	if len(with.Mounts) != len(without.Mounts)+2 {
		t.Fatalf("%d mounts, want two more than %d", len(with.Mounts), len(without.Mounts))
	}
}

// TestImageMounts: an image's manifest says whether its sandbox had the
// CLI and the egress CA; images without one (older servers) had neither.
func TestImageMounts(t *testing.T) {
	for _, tt := range []struct {
		manifest string
		want     bool
	}{
		{"", false},
		{`{"runscVersion":"runsc version x"}`, false},
		{`{"runscVersion":"runsc version x","lizardCli":true,"egressCa":true}`, true},
	} {
		dir := t.TempDir()
		if tt.manifest != "" {
			if err := os.WriteFile(filepath.Join(dir, manifestFile), []byte(tt.manifest), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if cli, ca, err := imageMounts(dir); err != nil || cli != tt.want || ca != tt.want {
			t.Errorf("manifest %q: %v %v, %v; want %v", tt.manifest, cli, ca, err, tt.want)
		}
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, manifestFile), []byte("{"), 0o600)
	if _, _, err := imageMounts(dir); err == nil {
		t.Error("a broken manifest passed")
	}
}
