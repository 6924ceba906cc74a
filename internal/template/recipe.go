package template

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// recipe says how to build one built-in template: a debootstrap of Suite
// with Packages, then Install installed with apt-get, then Post steps run
// against the new tree, then Check run in it. What runs the tree's own
// programs (debootstrap's second stage, apt-get, Post's commands, Check)
// runs in a container of the build's runtime (Registry.Runtime).
type recipe struct {
	Suite    string
	Variant  string // debootstrap --variant
	Packages []string
	// Install are installed with apt-get after debootstrap: apt resolves
	// dependencies (alternatives, virtual packages) that debootstrap's
	// --include does not.
	Install []string
	// Env is the template's default environment.
	Env []string
	// Post runs in order after the packages are installed, on the fresh
	// rootfs.
	Post []postStep
	// Check are commands run in the finished rootfs; a build whose check
	// fails is not installed, so a broken package set never becomes a
	// template.
	Check [][]string
	// Revision counts the changes of what Post writes (files, settings),
	// which the package list does not show: a template built at another
	// revision is built again by EnsureBuilt (`make templates`), as one
	// built with other packages is. Bump it with such a change.
	Revision int
}

// allPackages returns the packages the recipe asks for, each once.
func (r recipe) allPackages() []string {
	var out []string
	for _, p := range append(append([]string(nil), r.Packages...), r.Install...) {
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// postStep is one configuration step of a new rootfs. A step writes files
// into rootfs itself, but runs the rootfs's programs only with in: each in
// a container of the build's runtime, never on the host.
type postStep struct {
	Desc string
	Run  func(ctx context.Context, rootfs string, in runIn) error
}

// runIn runs argv as root in the rootfs being built, in a container of its
// own on the build network (see runStep), and fails unless it exits 0.
type runIn func(ctx context.Context, argv ...string) error

// basePackages are in every built-in template (debootstrap --include).
var basePackages = []string{"coreutils", "procps", "python3", "curl", "ca-certificates", "iproute2"}

// debian returns the recipe of a template made from Debian bookworm: the
// base packages, then install, then extra, then the steps every template
// ends with (the user, /.lizard, hosts, cleaning).
func debian(install []string, extra []postStep, check ...[]string) recipe {
	post := append([]postStep(nil), extra...)
	post = append(post,
		postStep{"creating user \"user\" (uid 1000)", addUser("user", 1000)},
		postStep{"creating /.lizard", makeLizardDir},
		postStep{"writing /etc/hosts", writeHosts},
		postStep{"removing build-host files", removeHostFiles},
		postStep{"cleaning apt caches", cleanApt},
	)
	return recipe{
		Suite:    recipeSuite,
		Variant:  "minbase",
		Packages: basePackages,
		Install:  install,
		Env: []string{
			"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
			"LANG=C.UTF-8",
		},
		Post:  post,
		Check: check,
	}
}

// builtins is the table of templates Build can make. Add an entry to add a
// template.
// recipeSuite is the Debian release of the built-in templates.
const recipeSuite = "bookworm"

var builtins = map[string]recipe{
	// base is also E2B's base (what E2B users expect of it: git, sudo
	// without a password for "user", python as well as python3).
	"base": debian([]string{"git", "sudo", "python-is-python3"}, []postStep{sudoForUser},
		[]string{"git", "--version"}, []string{"sudo", "--version"}, []string{"python", "--version"}),
	"python": debian(
		[]string{"python3", "python3-pip", "python3-venv"},
		[]postStep{allowPip},
		[]string{"python3", "-m", "pip", "--version"},
		[]string{"python3", "-m", "venv", "--help"},
	),
	"node": debian(
		[]string{"nodejs", "npm"},
		nil,
		[]string{"node", "--version"},
		[]string{"npm", "--version"},
	),
	// interpreter is what the SDKs' CodeSandbox boots, with the languages
	// of E2B's code interpreter: the server (internal/codeinterp) starts
	// ipykernel for python (matplotlib figures come back inline through
	// matplotlib-inline) and IRkernel for r, runs javascript with node,
	// typescript with node after node-typescript's transpiler, java in
	// JShell and bash with bash.
	"interpreter": debian(
		[]string{
			"python3", "python3-pip", "python3-ipykernel", "python3-jupyter-client",
			"python3-matplotlib-inline", "python3-numpy", "python3-pandas",
			"python3-matplotlib", "nodejs", "node-typescript", "bash",
			"r-cran-irkernel", "openjdk-17-jdk-headless",
		},
		[]postStep{allowPip, aggBackend},
		[]string{"python3", "-c", "import ipykernel, jupyter_client, matplotlib_inline, numpy, pandas, matplotlib.pyplot"},
		[]string{"node", "-e", "require('/usr/share/nodejs/typescript')"},
		[]string{"test", "-f", "/usr/share/jupyter/kernels/ir/kernel.json"},
		[]string{"R", "--slave", "-e", "library(IRkernel)"},
		[]string{"jshell", "--version"},
	),
	// claude and codex are node with a coding agent's CLI, which prompt
	// schedules run (internal/sandbox/schedule). The versions are the
	// newest whose npm packages ask for no newer Node.js than bookworm's
	// 18: later Claude Code wants 22.
	"claude": debian([]string{"nodejs", "npm", "git"}, []postStep{npmGlobal("@anthropic-ai/claude-code@" + claudeCodeVersion)},
		[]string{"claude", "--version"}),
	"codex": debian([]string{"nodejs", "npm", "git"}, []postStep{npmGlobal("@openai/codex@" + codexVersion)},
		[]string{"codex", "--version"}),
	// desktop is what the SDKs' sandbox.desktop drives: an X display with
	// Chromium, watched and driven through noVNC (recipe_desktop.go).
	"desktop": withRevision(withEnv(debian(desktopPackages, desktopPost, desktopChecks...), desktopEnv), desktopRevision),
}

// The agents' CLI versions of the claude and codex templates.
const (
	claudeCodeVersion = "2.1.197"
	codexVersion      = "0.171.0"
)

// aliases are other names of built-in templates: the SDKs ask for these.
var aliases = map[string]string{
	"python312": "python",
	"node22":    "node",
}

// Resolve returns the template an alias stands for, or name itself.
func Resolve(name string) string {
	if real, ok := aliases[name]; ok {
		return real
	}
	return name
}

// AliasesOf returns the aliases of template name, sorted; nil if none.
func AliasesOf(name string) []string {
	var out []string
	for a, real := range aliases {
		if real == name {
			out = append(out, a)
		}
	}
	sort.Strings(out)
	return out
}

// allowPip removes Debian's EXTERNALLY-MANAGED marker so that `pip install`
// works as it does on other sandbox platforms: a sandbox is disposable, so
// there is no system to protect from pip, and agents expect plain
// `pip install` to succeed.
var allowPip = postStep{"letting pip install packages", func(_ context.Context, rootfs string, _ runIn) error {
	matches, err := filepath.Glob(filepath.Join(rootfs, "usr", "lib", "python3*", "EXTERNALLY-MANAGED"))
	if err != nil {
		return err
	}
	for _, m := range matches {
		if err := os.Remove(m); err != nil {
			return err
		}
	}
	return nil
}}

// aggBackend makes Agg matplotlib's default backend. Headless there is no
// display for an interactive backend. It is set in matplotlibrc and not as
// MPLBACKEND in the environment: ipykernel selects the inline backend (plots
// as image/png results) only when MPLBACKEND is unset, and the environment
// variable would override it.
var aggBackend = postStep{"making Agg matplotlib's default backend", func(_ context.Context, rootfs string, _ runIn) error {
	p := filepath.Join(rootfs, "etc", "matplotlibrc")
	old, err := os.ReadFile(p)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	var b strings.Builder
	for _, l := range strings.SplitAfter(string(old), "\n") {
		if k, _, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "backend" {
			continue
		}
		b.WriteString(l)
	}
	if b.Len() > 0 && !strings.HasSuffix(b.String(), "\n") {
		b.WriteString("\n")
	}
	b.WriteString("backend: Agg\n")
	return replaceFile(p, []byte(b.String()), 0o644)
}}

// sudoersUser lets "user" run anything as root without a password, as in
// E2B's sandboxes: the sandbox is the isolation boundary, not the account.
const sudoersUser = "user ALL=(ALL:ALL) NOPASSWD: ALL\n"

var sudoForUser = postStep{"letting user sudo without a password", func(_ context.Context, rootfs string, _ runIn) error {
	dir := filepath.Join(rootfs, "etc", "sudoers.d")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "user"), []byte(sudoersUser), 0o440)
}}

// addUser creates group and user name with uid = gid = id, home
// /home/<name> owned by it and shell /bin/bash, with the rootfs's own
// groupadd and useradd.
func addUser(name string, id int) func(context.Context, string, runIn) error {
	return func(ctx context.Context, rootfs string, in runIn) error {
		ids := fmt.Sprint(id)
		if err := in(ctx, "/usr/sbin/groupadd", "--gid", ids, name); err != nil {
			return err
		}
		home := "/home/" + name
		if err := in(ctx, "/usr/sbin/useradd",
			"--uid", ids, "--gid", ids, "--home-dir", home, "--create-home",
			"--shell", "/bin/bash", "--comment", name, name); err != nil {
			return err
		}
		// useradd made it from /etc/skel; make sure of owner and mode.
		h := filepath.Join(rootfs, home)
		if err := os.Lchown(h, id, id); err != nil {
			return err
		}
		return os.Chmod(h, 0o755)
	}
}

// makeLizardDir creates the empty /.lizard mount point.
func makeLizardDir(_ context.Context, rootfs string, _ runIn) error {
	p := filepath.Join(rootfs, ".lizard")
	if err := os.Mkdir(p, 0o755); err != nil && !os.IsExist(err) {
		return err
	}
	return os.Chmod(p, 0o755)
}

const hostsFile = `127.0.0.1	localhost
::1	localhost ip6-localhost ip6-loopback
ff02::1	ip6-allnodes
ff02::2	ip6-allrouters
`

// writeHosts writes an /etc/hosts that does not depend on a hostname.
func writeHosts(_ context.Context, rootfs string, _ runIn) error {
	return replaceFile(filepath.Join(rootfs, "etc", "hosts"), []byte(hostsFile), 0o644)
}

// removeHostFiles removes /etc/hostname, which debootstrap copies from the
// build host: the sandbox's hostname comes from the runtime.
func removeHostFiles(_ context.Context, rootfs string, _ runIn) error {
	err := os.Remove(filepath.Join(rootfs, "etc", "hostname"))
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}

// cleanApt removes downloaded packages and package lists; `apt-get update`
// inside a sandbox brings the lists back.
func cleanApt(_ context.Context, rootfs string, _ runIn) error {
	for _, pattern := range []string{
		"var/cache/apt/archives/*.deb",
		"var/cache/apt/*.bin",
		"var/lib/apt/lists/*",
	} {
		matches, err := filepath.Glob(filepath.Join(rootfs, pattern))
		if err != nil {
			return err
		}
		for _, m := range matches {
			if !strings.HasPrefix(m, rootfs+string(filepath.Separator)) {
				continue
			}
			if err := os.RemoveAll(m); err != nil {
				return err
			}
		}
	}
	return nil
}

// replaceFile writes path anew (not through a symlink that may be there).
func replaceFile(path string, data []byte, mode os.FileMode) error {
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Chmod(path, mode)
}
