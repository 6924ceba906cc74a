//go:build linux

package template

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// hostPath is the PATH programs run by builds get.
const hostPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

func (r *Registry) build(ctx context.Context, name string, progress io.Writer, ifMissing bool) (Template, error) {
	rec := builtins[name]
	rep := newReporter(progress, name)

	if r.Runtime == nil {
		return Template{}, fmt.Errorf("build template %q: no runtime to run the recipe's steps in (Registry.Runtime; lizard template build finds runsc with --runsc or $LIZARD_RUNSC): %w", name, errdefs.ErrUnavailable)
	}
	if os.Geteuid() != 0 {
		return Template{}, fmt.Errorf("build template %q: debootstrap needs root: %w", name, errdefs.ErrPermission)
	}
	deb, err := r.debootstrapPath()
	if err != nil {
		return Template{}, fmt.Errorf("build template %q: %w", name, err)
	}
	if err := os.MkdirAll(r.dir, 0o755); err != nil {
		return Template{}, fmt.Errorf("build template %q: %w", name, err)
	}
	lock, err := r.lock(ctx, name, rep)
	if err != nil {
		return Template{}, fmt.Errorf("build template %q: %w", name, err)
	}
	defer lock.unlock()

	if ifMissing {
		// Another process may have built it while we waited for the lock.
		if t, err := r.Get(name); err == nil {
			rep.printf("already built: %s", t.Version)
			return t, nil
		}
	}
	r.removeStale(name, rep)

	tmp, err := os.MkdirTemp(r.dir, ".build-"+name+"-")
	if err != nil {
		return Template{}, fmt.Errorf("build template %q: %w", name, err)
	}
	installed := false
	defer func() {
		if installed {
			return
		}
		if err := r.removeTree(tmp); err != nil {
			rep.printf("warning: could not remove unfinished build %s: %v", tmp, err)
		}
	}()
	rootfs := filepath.Join(tmp, rootfsDir)
	if err := os.Chmod(tmp, 0o755); err != nil {
		return Template{}, err
	}
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return Template{}, err
	}

	mirror := r.Mirror
	if mirror == "" {
		if mirror, err = HostMirror(); err != nil {
			return Template{}, fmt.Errorf("build template %q: %w", name, err)
		}
	}
	// Every step that runs the rootfs's programs runs in a container of
	// r.Runtime on the build network.
	net := &stepNet{cfg: r.BuildNetwork, run: r.RunCommand, printf: rep.printf}
	defer net.close()
	steps := &recipeSteps{rt: r.Runtime, net: net, rootfs: rootfs, rep: rep}

	rep.printf("building %s (%s, debootstrap --variant=%s) from %s", name, rec.Suite, rec.Variant, mirror)
	secondStage := func(ctx context.Context) error {
		// container=lxc: debootstrap then skips its test that it can make
		// device nodes in the target (gVisor's gofer root cannot; the
		// container's /dev is the runtime's).
		return steps.exec(ctx, rep.debootstrapLine, "/usr/bin/env", "container=lxc", "/debootstrap/debootstrap", "--second-stage")
	}
	if err := r.debootstrap(ctx, deb, rec, rootfs, mirror, lock.f, rep, secondStage); err != nil {
		return Template{}, fmt.Errorf("build template %q: %w", name, err)
	}

	rep.setStep(stepFinish)
	if len(rec.Install) > 0 {
		if err := steps.aptInstall(ctx, rec.Install); err != nil {
			return Template{}, fmt.Errorf("build template %q: %w", name, err)
		}
	}
	for _, s := range rec.Post {
		if err := ctx.Err(); err != nil {
			return Template{}, fmt.Errorf("build template %q: %w", name, err)
		}
		if err := s.Run(ctx, rootfs, steps.in); err != nil {
			return Template{}, fmt.Errorf("build template %q: %s: %w", name, s.Desc, err)
		}
	}
	for _, argv := range rec.Check {
		rep.printf("checking: %s", strings.Join(argv, " "))
		if err := steps.run(ctx, "check "+strings.Join(argv, " "), rep.toolLine, argv...); err != nil {
			return Template{}, fmt.Errorf("build template %q: %w", name, err)
		}
	}
	net.close()
	versions, err := readVersions(rootfs)
	if err != nil {
		return Template{}, fmt.Errorf("build template %q: read package versions: %w", name, err)
	}
	if err := os.Chmod(rootfs, 0o755); err != nil {
		return Template{}, err
	}
	size, err := treeSize(rootfs)
	if err != nil {
		return Template{}, fmt.Errorf("build template %q: measure rootfs: %w", name, err)
	}
	builtAt := time.Now().UTC().Truncate(time.Second)
	m := metadata{
		Name:      name,
		Version:   rec.Suite + "-" + builtAt.Format("20060102T150405Z"),
		SizeBytes: size,
		BuiltAt:   builtAt,
		Env:       rec.Env,
		Versions:  versions,
		Suite:     rec.Suite,
		Mirror:    mirror,
		Packages:  rec.allPackages(),
		Revision:  rec.Revision,
	}
	if err := writeMetadata(tmp, m); err != nil {
		return Template{}, fmt.Errorf("build template %q: write metadata: %w", name, err)
	}
	if err := ctx.Err(); err != nil {
		return Template{}, fmt.Errorf("build template %q: %w", name, err)
	}
	if err := r.install(name, tmp, rep); err != nil {
		return Template{}, fmt.Errorf("build template %q: %w", name, err)
	}
	installed = true
	t, err := r.Get(name)
	if err != nil {
		return Template{}, err
	}
	rep.printf("built %s: %s in %s → %s (%s)", t.Version, fmtBytes(t.SizeBytes), fmtSeconds(rep.elapsed()), t.Rootfs, FormatVersions(t.Versions))
	return t, nil
}

func (r *Registry) debootstrapPath() (string, error) {
	if r.Debootstrap != "" {
		return r.Debootstrap, nil
	}
	if p, err := exec.LookPath("debootstrap"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/debootstrap", "/sbin/debootstrap"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("debootstrap not found (apt-get install debootstrap, or make deps): %w", errdefs.ErrUnavailable)
}

// install makes the finished build tmp the current version of name (see
// installChecked).
func (r *Registry) install(name, tmp string, rep *reporter) error {
	_, err := r.installChecked(name, tmp, rep, nil)
	return err
}

// installChecked seals the finished build tmp (seal: its manifest and
// digest) and moves it to the version directory <dir>/.v/<name>@sha256-<hex>
// its digest names, calls check (may be nil) with that directory, and, if
// check succeeds, switches <dir>/<name> to it. When the registry holds that
// version already (a build of the same bits), tmp is removed and the
// version it holds is the one checked and switched to. Versions installed
// before stay where they are (see Prune). On failure a version this call
// placed is removed (one it found is kept: sandboxes may use it) and name's
// current version is untouched. The caller holds the build lock of name.
func (r *Registry) installChecked(name, tmp string, rep *reporter, check func(vdir string) error) (string, error) {
	vdir, placed, err := r.place(name, tmp)
	if err != nil {
		return "", err
	}
	if check != nil {
		err = check(vdir)
	}
	if err == nil {
		err = r.switchTo(name, vdir, rep)
	}
	if err != nil {
		if placed {
			if rerr := r.removeTree(vdir); rerr != nil {
				rep.printf("warning: could not remove unused version %s: %v", vdir, rerr)
			}
		}
		return "", err
	}
	return vdir, nil
}

// place seals the finished build tmp and moves it to its version
// directory, <dir>/.v/<name>@sha256-<hex>, and returns that directory;
// placed is false when that version was there already and tmp was removed.
func (r *Registry) place(name, tmp string) (vdir string, placed bool, err error) {
	vroot := filepath.Join(r.dir, versionsDir)
	if err := os.MkdirAll(vroot, 0o755); err != nil {
		return "", false, fmt.Errorf("make versions directory: %w", err)
	}
	digest, err := seal(name, tmp)
	if err != nil {
		return "", false, fmt.Errorf("digest of the build: %w", err)
	}
	vdir = filepath.Join(vroot, name+"@"+dirDigest(digest))
	if _, err := readVersion(vdir); err == nil {
		// The same bits are a version already: keep that one.
		if err := r.removeTree(tmp); err != nil {
			return "", false, fmt.Errorf("remove the build of a version held already: %w", err)
		}
		return vdir, false, nil
	}
	// Versions are renamed into place whole, so a directory without
	// metadata there is no version; rename(2) replaces it only if empty.
	if err := syscall.Rename(tmp, vdir); err != nil {
		return "", false, fmt.Errorf("move build into place: rename %s %s: %w", tmp, vdir, err)
	}
	syncDir(vroot)
	return vdir, true, nil
}

// reserveDir makes a new empty directory in dir whose name starts with
// prefix and ends with a random number: a unique name that a directory
// can then be renamed to with rename(2), which replaces an empty
// directory (os.Rename refuses to).
func reserveDir(dir, prefix string) (string, error) {
	d, err := os.MkdirTemp(dir, prefix)
	if err != nil {
		return "", fmt.Errorf("reserve a directory name: %w", err)
	}
	return d, nil
}

// switchTo makes the version directory vdir (in <dir>/.v) the current
// version of name: a new relative link <dir>/.link-<name>-<n> is renamed
// over <dir>/<name>, so readers see either the old version or the new one.
// A directory of the older layout at <dir>/<name> is first moved under .v
// (and moved back should the switch fail). The caller holds the build
// lock of name.
func (r *Registry) switchTo(name, vdir string, rep *reporter) error {
	final := filepath.Join(r.dir, name)
	target := filepath.Join(versionsDir, filepath.Base(vdir))
	legacy, err := r.moveLegacy(name)
	if err != nil {
		return err
	}
	restore := func() {
		if legacy == "" {
			return
		}
		if err := os.Rename(legacy, final); err != nil {
			rep.printf("warning: could not move old template %s back to %s: %v", legacy, final, err)
		}
	}
	link, err := r.newLink(name, target)
	if err != nil {
		restore()
		return err
	}
	if err := os.Rename(link, final); err != nil {
		os.Remove(link)
		restore()
		return fmt.Errorf("switch %s to %s: %w", final, target, err)
	}
	syncDir(r.dir)
	return nil
}

// moveLegacy moves <dir>/<name>, when it is a template directory of the
// older layout, to <dir>/.v/<name>@legacy-<n>, where it is a version like
// the others, and returns where it went ("" if there was none).
func (r *Registry) moveLegacy(name string) (string, error) {
	final := filepath.Join(r.dir, name)
	fi, err := os.Lstat(final)
	if errors.Is(err, fs.ErrNotExist) || (err == nil && !fi.IsDir()) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	o, err := reserveDir(filepath.Join(r.dir, versionsDir), name+"@legacy-")
	if err != nil {
		return "", err
	}
	if err := syscall.Rename(final, o); err != nil {
		os.Remove(o)
		return "", fmt.Errorf("move old template under %s: rename %s %s: %w", versionsDir, final, o, err)
	}
	syncDir(filepath.Dir(o))
	return o, nil
}

// newLink makes a symbolic link to target with a new name
// <dir>/.link-<name>-<n> and returns its path.
func (r *Registry) newLink(name, target string) (string, error) {
	for range 100 {
		link := filepath.Join(r.dir, fmt.Sprintf(".link-%s-%d", name, mrand.Uint32()))
		err := os.Symlink(target, link)
		if err == nil {
			return link, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return "", fmt.Errorf("make link to %s: %w", target, err)
		}
	}
	return "", fmt.Errorf("make link to %s: no free name", target)
}

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}

// removeStale removes what crashed builds of name left behind: build
// directories, old builds of the older layout, and links never renamed
// into place. The caller holds the build lock of name.
func (r *Registry) removeStale(name string, rep *reporter) {
	re := regexp.MustCompile(`^\.(build|old|link)-` + regexp.QuoteMeta(name) + `-[0-9]+$`)
	ents, err := os.ReadDir(r.dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if !re.MatchString(e.Name()) {
			continue
		}
		p := filepath.Join(r.dir, e.Name())
		rep.printf("removing leftover %s", p)
		if err := r.removeLeftover(p, e); err != nil {
			rep.printf("warning: could not remove %s: %v", p, err)
		}
	}
}

// removeLeftover removes p, a leftover of a build: a link is unlinked
// (never followed), anything else goes with removeTree.
func (r *Registry) removeLeftover(p string, e fs.DirEntry) error {
	if e.Type()&fs.ModeSymlink != 0 {
		return os.Remove(p)
	}
	return r.removeTree(p)
}

// removeTree removes a build or old-build directory or a version directory
// of the registry: first it unmounts whatever is mounted under it
// (debootstrap can leave proc, sysfs and /dev bind mounts behind when it
// dies), then removes the tree without following symlinks. It refuses
// paths that are neither hidden build entries of the registry nor entries
// of its .v, and trees that still have mounts.
func (r *Registry) removeTree(path string) error {
	if !r.removable(path) {
		return fmt.Errorf("refusing to remove %s: not a build or version directory of %s", path, r.dir)
	}
	if err := unmountUnder(path); err != nil {
		return err
	}
	return os.RemoveAll(path) // unlinkat/openat(O_NOFOLLOW): symlinks are removed, not followed
}

// removable reports whether removeTree may remove path: <dir>/.build-*,
// <dir>/.old-*, <dir>/.v/<name>@* or an entry of <dir>/.seeds.
func (r *Registry) removable(path string) bool {
	base := filepath.Base(path)
	switch filepath.Dir(path) {
	case r.dir:
		return strings.HasPrefix(base, ".build-") || strings.HasPrefix(base, ".old-")
	case filepath.Join(r.dir, seedsDir):
		return true
	case filepath.Join(r.dir, versionsDir):
		name, _, ok := strings.Cut(base, "@")
		return ok && validName(name)
	}
	return false
}

// ---- lock ----

type buildLock struct{ f *os.File }

// lock takes the build lock of name, waiting (and saying so) while another
// process or goroutine holds it.
func (r *Registry) lock(ctx context.Context, name string, rep *reporter) (*buildLock, error) {
	f, err := flock(ctx, r.lockPath(name), syscall.LOCK_EX, func() {
		rep.printf("waiting for another build of %s to finish", name)
	})
	if err != nil {
		return nil, err
	}
	return &buildLock{f: f}, nil
}

// tryLock takes the build lock of name if nobody holds it; ok is false
// when somebody does.
func (r *Registry) tryLock(name string) (l *buildLock, ok bool, err error) {
	f, ok, err := tryFlock(r.lockPath(name), syscall.LOCK_EX)
	if !ok {
		return nil, false, err
	}
	return &buildLock{f: f}, true, nil
}

func (r *Registry) lockPath(name string) string { return filepath.Join(r.dir, ".lock-"+name) }

func (l *buildLock) unlock() {
	syscall.Flock(int(l.f.Fd()), syscall.LOCK_UN)
	l.f.Close()
}

// ---- debootstrap ----

// runDebootstrap runs debootstrap into rootfs, feeding its output to rep:
// its first stage (downloading and unpacking, no package's code) on the
// host, with run, then secondStage: debootstrap's second stage (installing
// and configuring the packages: their maintainer scripts), which the
// caller runs in a container whose root is rootfs.
func runDebootstrap(ctx context.Context, run RunFunc, deb string, rec recipe, rootfs, mirror string, lockFile *os.File, rep *reporter, secondStage func(context.Context) error) error {
	args := []string{"--foreign", "--variant=" + rec.Variant}
	if len(rec.Packages) > 0 {
		args = append(args, "--include="+strings.Join(rec.Packages, ","))
	}
	args = append(args, rec.Suite, rootfs, mirror)

	cmd := exec.CommandContext(ctx, deb, args...)
	cmd.Dir = "/"
	cmd.Env = toolEnv()
	rep.setStep(stepResolve)
	werr := runTool(ctx, run, cmd, lockFile, rep, rep.debootstrapLine)
	if werr == nil {
		werr = prepareSecondStage(rootfs)
	}
	if werr == nil {
		werr = secondStage(ctx)
	}
	if werr == nil || ctx.Err() != nil {
		return werr
	}

	// Show why: the end of debootstrap's own log (it is removed with the
	// build directory) or of its output.
	tail := logTail(filepath.Join(rootfs, "debootstrap", "debootstrap.log"), 15)
	if len(tail) == 0 {
		tail = rep.outputTail()
	}
	reason := ""
	for _, l := range rep.outputTail() {
		if strings.HasPrefix(l, "E: ") {
			reason = strings.TrimPrefix(l, "E: ")
		}
	}
	rep.printf("debootstrap failed: %v; last output:", werr)
	for _, l := range tail {
		rep.printf("  | %s", l)
	}
	if reason != "" {
		return fmt.Errorf("debootstrap: %s (%v): %w", reason, werr, errdefs.ErrUnavailable)
	}
	return fmt.Errorf("debootstrap: %v: %w", werr, errdefs.ErrUnavailable)
}

// prepareSecondStage makes the tree of debootstrap's first stage one a
// container can start in: the first stage leaves /proc a symbolic link to
// the host's /proc (for a chroot), where the runtime mounts its own proc.
func prepareSecondStage(rootfs string) error {
	p := filepath.Join(rootfs, "proc")
	if fi, err := os.Lstat(p); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		if err := os.Remove(p); err != nil {
			return err
		}
		return os.Mkdir(p, 0o555)
	}
	return nil
}

// runTool runs cmd (a build tool: debootstrap, apt-get; made with
// exec.CommandContext(ctx)) to its end with run (nil: cmd.Run), feeding
// each line of its output to onLine. The tool gets the lock file as an extra
// descriptor so that, should this process die, the lock stays held until
// the tool is gone too. On cancellation the process group gets SIGTERM
// (debootstrap then unmounts what it mounted) and SIGKILL 15 s later; the
// result is then ctx.Err().
func runTool(ctx context.Context, run RunFunc, cmd *exec.Cmd, lockFile *os.File, rep *reporter, onLine func(string)) error {
	if run == nil {
		run = (*exec.Cmd).Run
	}
	rep.clearTail()
	lw := &lineWriter{fn: onLine}
	cmd.Stdout = lw
	cmd.Stderr = lw
	cmd.ExtraFiles = []*os.File{lockFile}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	cmd.SysProcAttr.Pdeathsig = syscall.SIGTERM
	cmd.Cancel = func() error {
		rep.printf("cancelling (%v)", ctx.Err())
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
	}
	// After Cancel: the leader is killed this long after the SIGTERM
	// (and the rest of its group below); also how long output is read
	// after it exits.
	cmd.WaitDelay = 15 * time.Second

	stop := rep.heartbeats()
	werr := run(cmd)
	stop()
	lw.Flush()
	if cmd.Process == nil {
		return fmt.Errorf("start %s: %w", filepath.Base(cmd.Path), werr)
	}
	if ctx.Err() != nil {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // stragglers of the group, if any
		return ctx.Err()
	}
	return werr
}

// toolEnv is the environment of debootstrap: the caller's (proxies and
// such) with a full PATH, the C locale and no debconf questions.
func toolEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case k == "PATH", k == "LANG", k == "LANGUAGE", strings.HasPrefix(k, "LC_"),
			k == "DEBIAN_FRONTEND", k == "DEBCONF_NONINTERACTIVE_SEEN":
			continue
		}
		env = append(env, kv)
	}
	return append(env, "PATH="+hostPath, "LC_ALL=C", "DEBIAN_FRONTEND=noninteractive", "DEBCONF_NONINTERACTIVE_SEEN=true")
}

func logTail(path string, n int) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return lines
}

// ---- measuring ----

// treeSize sums the sizes of the regular files under root, like du
// --apparent-size: hard links are counted once, symlinks are not followed.
func treeSize(root string) (int64, error) {
	type fileID struct{ dev, ino uint64 }
	seen := map[fileID]bool{}
	var total int64
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok && st.Nlink > 1 {
			id := fileID{uint64(st.Dev), uint64(st.Ino)}
			if seen[id] {
				return nil
			}
			seen[id] = true
		}
		total += info.Size()
		return nil
	})
	return total, err
}

// ---- mounts ----

const umountNoFollow = 0x8 // UMOUNT_NOFOLLOW

// unmountUnder detaches every mount at or below path (deepest first) and
// fails if any remain.
func unmountUnder(path string) error {
	real, err := filepath.EvalSymlinks(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for attempt := 0; attempt < 10; attempt++ {
		mps, err := mountsUnder(real)
		if err != nil {
			return err
		}
		if len(mps) == 0 {
			return nil
		}
		for _, mp := range mps {
			syscall.Unmount(mp, syscall.MNT_DETACH|umountNoFollow)
		}
	}
	mps, err := mountsUnder(real)
	if err != nil {
		return err
	}
	if len(mps) > 0 {
		return fmt.Errorf("mounts remain under %s: %s", path, strings.Join(mps, ", "))
	}
	return nil
}

// mountsUnder lists the mount points at or below dir (a path without
// symlinks), deepest first.
func mountsUnder(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseMountsUnder(f, dir)
}

func parseMountsUnder(r io.Reader, dir string) ([]string, error) {
	dir = filepath.Clean(dir)
	var out []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") || dir == "/" {
			out = append(out, mp)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	sort.SliceStable(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out, nil
}

// unescapeMount undoes the octal escapes (\040 for space, ...) of
// /proc/self/mountinfo.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1]) && isOctal(s[i+2]) && isOctal(s[i+3]) {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }
