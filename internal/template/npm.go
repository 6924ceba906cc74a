package template

import (
	"context"
	"os"
	"path/filepath"
	"strings"
)

// hostCA is the host's certificate bundle: what the host trusts for TLS.
const hostCA = "/etc/ssl/certs/ca-certificates.crt"

// npmGlobal installs npm packages globally (/usr/local) with the rootfs's
// own node and npm, from the npm registry. For that download it trusts
// what the host trusts (a host behind a TLS-inspecting proxy has its CA
// there): the host's bundle is copied in for the step and removed after,
// with npm's cache, so none of it stays in the template.
func npmGlobal(pkgs ...string) postStep {
	return postStep{"installing " + strings.Join(pkgs, " ") + " with npm", func(ctx context.Context, rootfs string, in runIn) error {
		const ca = "/tmp/lizard-host-ca.crt"
		args := []string{"npm", "install", "--global", "--no-fund", "--no-audit", "--no-update-notifier", "--loglevel=error"}
		if b, err := os.ReadFile(hostCA); err == nil {
			if err := os.WriteFile(filepath.Join(rootfs, ca), b, 0o644); err != nil {
				return err
			}
			defer os.Remove(filepath.Join(rootfs, ca))
			args = append(args, "--cafile", ca)
		}
		defer os.RemoveAll(filepath.Join(rootfs, "root", ".npm"))
		return in(ctx, append(args, pkgs...)...)
	}}
}
