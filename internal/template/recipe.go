package template

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// recipe says how to build one built-in template: a debootstrap of Suite
// with Packages, then Post steps run against the new tree.
type recipe struct {
	Suite    string
	Variant  string // debootstrap --variant
	Packages []string
	// Env is the template's default environment.
	Env []string
	// Post runs in order after debootstrap, on the fresh rootfs.
	Post []postStep
}

// postStep is one configuration step of a new rootfs. Steps may run programs
// inside the rootfs only through chrootCmd.
type postStep struct {
	Desc string
	Run  func(ctx context.Context, rootfs string) error
}

// builtins is the table of templates Build can make. Add an entry to add a
// template.
var builtins = map[string]recipe{
	"base": {
		Suite:   "bookworm",
		Variant: "minbase",
		Packages: []string{
			"coreutils", "procps", "python3", "curl", "ca-certificates", "iproute2",
		},
		Env: []string{
			"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
			"LANG=C.UTF-8",
		},
		Post: []postStep{
			{"creating user \"user\" (uid 1000)", addUser("user", 1000)},
			{"creating /.lizard", makeLizardDir},
			{"writing /etc/hosts", writeHosts},
			{"removing build-host files", removeHostFiles},
			{"cleaning apt caches", cleanApt},
		},
	},
}

// addUser creates group and user name with uid = gid = id, home
// /home/<name> owned by it and shell /bin/bash, using the rootfs's own
// groupadd/useradd in a chroot.
func addUser(name string, id int) func(context.Context, string) error {
	return func(ctx context.Context, rootfs string) error {
		ids := fmt.Sprint(id)
		if err := chrootRun(ctx, rootfs, "/usr/sbin/groupadd", "--gid", ids, name); err != nil {
			return err
		}
		home := "/home/" + name
		if err := chrootRun(ctx, rootfs, "/usr/sbin/useradd",
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
func makeLizardDir(_ context.Context, rootfs string) error {
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
func writeHosts(_ context.Context, rootfs string) error {
	return replaceFile(filepath.Join(rootfs, "etc", "hosts"), []byte(hostsFile), 0o644)
}

// removeHostFiles removes /etc/hostname, which debootstrap copies from the
// build host: the sandbox's hostname comes from the runtime.
func removeHostFiles(_ context.Context, rootfs string) error {
	err := os.Remove(filepath.Join(rootfs, "etc", "hostname"))
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	return nil
}

// cleanApt removes downloaded packages and package lists; `apt-get update`
// inside a sandbox brings the lists back.
func cleanApt(_ context.Context, rootfs string) error {
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
