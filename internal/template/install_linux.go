//go:build linux

package template

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/runtime"
)

// stepEnv is the environment of the recipes' steps: nothing of the host's
// but its proxy settings, which apt needs to reach the mirror the way
// debootstrap's first stage (on the host) did.
func stepEnv() []string {
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

// recipeSteps runs the programs of one built-in build's rootfs: each a
// container of the registry's runtime on the build network, as root.
type recipeSteps struct {
	rt     runtime.Runner
	net    *stepNet
	rootfs string
	rep    *reporter
}

// exec runs argv in the rootfs, feeding its output to onLine; a non-zero
// exit is an error naming it.
func (s *recipeSteps) exec(ctx context.Context, onLine func(string), argv ...string) error {
	s.rep.clearTail()
	defer s.rep.heartbeats()()
	code, _, err := runStep(ctx, s.rt, s.net, step{Rootfs: s.rootfs, Args: argv, Env: stepEnv(), Cwd: "/", OnLine: onLine})
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil {
		return err
	}
	if code != 0 {
		return fmt.Errorf("exit code %d", code)
	}
	return nil
}

// run is exec with a failure shown and explained by toolFailed; what names
// the step.
func (s *recipeSteps) run(ctx context.Context, what string, onLine func(string), argv ...string) error {
	if err := s.exec(ctx, onLine, argv...); err != nil {
		return toolFailed(ctx, what, err, s.rep)
	}
	return nil
}

// in is the runIn of post steps.
func (s *recipeSteps) in(ctx context.Context, argv ...string) error {
	return s.run(ctx, strings.Join(argv, " "), s.rep.toolLine, argv...)
}

// policyRCD keeps package scripts from starting services during the build
// (invoke-rc.d asks it; 101 means "not allowed").
const policyRCD = "#!/bin/sh\nexit 101\n"

// aptInstall installs pkgs (and what they depend on, without recommends)
// into the rootfs with the rootfs's own apt-get, from the sources
// debootstrap configured: the mirror the template was bootstrapped from.
func (s *recipeSteps) aptInstall(ctx context.Context, pkgs []string) error {
	rep := s.rep
	rep.printf("installing with apt-get: %s", strings.Join(pkgs, " "))
	rcd := filepath.Join(s.rootfs, "usr", "sbin", "policy-rc.d")
	if err := replaceFile(rcd, []byte(policyRCD), 0o755); err != nil {
		return err
	}
	apt := []string{"apt-get", "-q", "-y", "-o", "Acquire::Retries=3", "-o", "Dpkg::Use-Pty=0"}
	prog := &aptProgress{rep: rep}
	if err := s.run(ctx, "apt-get update", prog.line, append(apt, "update")...); err != nil {
		return err
	}
	install := append(apt,
		"-o", "Dpkg::Options::=--force-confdef", "-o", "Dpkg::Options::=--force-confold",
		"install", "--no-install-recommends")
	if err := s.run(ctx, "apt-get install", prog.line, append(install, pkgs...)...); err != nil {
		return err
	}
	rep.setDetail("")
	rep.printf("installed %d packages (%s)", prog.setUp, fmtSeconds(rep.elapsed()))
	return os.Remove(rcd)
}

// toolFailed turns the failure of a tool run in the rootfs into an error
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
