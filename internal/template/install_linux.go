//go:build linux

package template

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// mountScript runs first in the build chroot: package scripts and the
// programs checks run expect /proc (and sometimes /sys and /dev/pts). The
// mounts are made in the command's own mount namespace, so they are never
// visible on the host and vanish with the command, even when this process
// is killed; nothing is left to unmount. sysfs and devpts are optional.
const mountScript = `set -e
mount -t proc proc /proc
mount -t sysfs sysfs /sys 2>/dev/null || true
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts /dev/pts 2>/dev/null || true
exec "$@"`

// runInRootfs runs argv chrooted into rootfs (a tree this package has just
// built) with /proc mounted, feeding its output to onLine.
func runInRootfs(ctx context.Context, run RunFunc, rootfs string, lockFile *os.File, rep *reporter, onLine func(string), argv ...string) error {
	cmd := exec.CommandContext(ctx, "/bin/sh", append([]string{"-c", mountScript, "sh"}, argv...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: rootfs, Unshareflags: syscall.CLONE_NEWNS}
	cmd.Dir = "/"
	cmd.Env = chrootEnv()
	return runTool(ctx, run, cmd, lockFile, rep, onLine)
}

// chrootEnv is the environment of programs run in a build chroot: nothing
// of the host's but its proxy settings, which apt needs to reach the
// mirror the same way debootstrap did.
func chrootEnv() []string {
	env := []string{"PATH=" + hostPath, "LC_ALL=C", "HOME=/root",
		"DEBIAN_FRONTEND=noninteractive", "DEBCONF_NONINTERACTIVE_SEEN=true"}
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch strings.ToLower(k) {
		case "http_proxy", "https_proxy", "no_proxy", "all_proxy":
			env = append(env, kv)
		}
	}
	return env
}

// policyRCD keeps package scripts from starting services in the build
// chroot (invoke-rc.d asks it; 101 means "not allowed").
const policyRCD = "#!/bin/sh\nexit 101\n"

// aptInstall installs pkgs (and what they depend on, without recommends)
// into rootfs with the rootfs's own apt-get, from the sources debootstrap
// configured: the mirror the template was bootstrapped from.
func aptInstall(ctx context.Context, run RunFunc, rootfs string, pkgs []string, lockFile *os.File, rep *reporter) error {
	rep.printf("installing with apt-get: %s", strings.Join(pkgs, " "))
	rcd := filepath.Join(rootfs, "usr", "sbin", "policy-rc.d")
	if err := replaceFile(rcd, []byte(policyRCD), 0o755); err != nil {
		return err
	}
	apt := []string{"apt-get", "-q", "-y", "-o", "Acquire::Retries=3", "-o", "Dpkg::Use-Pty=0"}
	prog := &aptProgress{rep: rep}
	if err := runInRootfs(ctx, run, rootfs, lockFile, rep, prog.line, append(apt, "update")...); err != nil {
		return toolFailed(ctx, "apt-get update", err, rep)
	}
	install := append(apt,
		"-o", "Dpkg::Options::=--force-confdef", "-o", "Dpkg::Options::=--force-confold",
		"install", "--no-install-recommends")
	if err := runInRootfs(ctx, run, rootfs, lockFile, rep, prog.line, append(install, pkgs...)...); err != nil {
		return toolFailed(ctx, "apt-get install", err, rep)
	}
	rep.setDetail("")
	rep.printf("installed %d packages (%s)", prog.setUp, fmtSeconds(rep.elapsed()))
	return os.Remove(rcd)
}

// toolFailed turns the failure of a tool run in the chroot into an error
// naming the reason apt or dpkg gave, and shows the tool's last output.
func toolFailed(ctx context.Context, what string, err error, rep *reporter) error {
	if ctx.Err() != nil {
		return err
	}
	tail := rep.outputTail()
	reason := ""
	for _, l := range tail {
		if strings.HasPrefix(l, "E: ") {
			reason = strings.TrimPrefix(l, "E: ")
		}
	}
	rep.printf("%s failed: %v; last output:", what, err)
	for _, l := range tail {
		rep.printf("  | %s", l)
	}
	if reason != "" {
		return fmt.Errorf("%s: %s (%v): %w", what, reason, err, errdefs.ErrUnavailable)
	}
	return fmt.Errorf("%s: %v: %w", what, err, errdefs.ErrUnavailable)
}

// aptProgress follows apt-get's output and shows how far it is in the step
// line.
type aptProgress struct {
	rep                         *reporter
	total, got, unpacked, setUp int
}

func (p *aptProgress) line(l string) {
	p.rep.toolLine(l)
	switch {
	case strings.HasPrefix(l, "Get:"):
		p.got++
	case strings.HasPrefix(l, "Unpacking "):
		p.unpacked++
	case strings.HasPrefix(l, "Setting up "):
		p.setUp++
	default:
		// "0 upgraded, 143 newly installed, 0 to remove and 0 not upgraded."
		if _, rest, ok := strings.Cut(l, "upgraded, "); ok {
			if n, _, ok := strings.Cut(rest, " newly installed"); ok {
				p.total, _ = strconv.Atoi(n)
				p.got = 0 // what `apt-get update` fetched were indexes
			}
		}
		return
	}
	if p.total == 0 {
		p.rep.setDetail(fmt.Sprintf("apt-get: %d downloaded", p.got))
		return
	}
	p.rep.setDetail(fmt.Sprintf("apt-get: %d packages, %d downloaded, %d unpacked, %d set up", p.total, p.got, p.unpacked, p.setUp))
}
