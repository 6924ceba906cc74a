//go:build linux

package template

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// layerInfo is <layer>/layer.json: what made the layer (informational).
type layerInfo struct {
	Key         string    `json:"key"`
	Parent      string    `json:"parent"`
	Instruction string    `json:"instruction"`
	CreatedAt   time.Time `json:"created_at"`
}

// dbuild is one Dockerfile build in progress.
type dbuild struct {
	r      *Registry
	name   string
	opts   DockerfileOptions
	out    *dprogress
	layers string // <registry>/.layers

	net *stepNet // where RUN steps run

	// What FROM named, once parsed: a template, or a pulled image.
	base  Template
	image *pulledImage
	// version names the new version ("": dockerfile-<time>-<key>).
	version string
	// steps: a Steps build, whose messages name steps, not lines;
	// finalStep is the number its errors give the start command's.
	steps     bool
	finalStep int
}

// fromWhere names the build's base in messages: a Dockerfile's FROM line,
// or a Steps build's template or image.
func (b *dbuild) fromWhere(from string, line int, image bool) string {
	switch {
	case !b.steps:
		return fmt.Sprintf("%s:%d: FROM %s", b.opts.DockerfileName, line, from)
	case image:
		return "image " + from
	}
	return "template " + from
}

// BuildDockerfile builds template name from a Dockerfile (see
// DockerfileOptions) as a new version of it, which becomes the current one
// only once it is complete (and opts.BeforeSwitch accepted it); the version
// it replaces stays until Prune removes it. A failed build leaves the
// current version and nothing else. Progress and the output of RUN steps
// are written to progress (may be nil).
func (r *Registry) BuildDockerfile(ctx context.Context, name string, opts DockerfileOptions, progress io.Writer) (Template, error) {
	t, err := r.buildDockerfile(ctx, name, opts, progress)
	if err != nil {
		return Template{}, fmt.Errorf("build template %q: %w", name, err)
	}
	return t, nil
}

// BuildSteps builds template name from steps (see Steps) as a new version
// of it, exactly as BuildDockerfile does with a Dockerfile: the same
// options (but Dockerfile, DockerfileName, BuildArgs and ReadyCommand,
// which steps give otherwise), layer cache and rules for the current
// version. Its errors name the step that failed (FailedStep).
func (r *Registry) BuildSteps(ctx context.Context, name string, steps Steps, opts DockerfileOptions, progress io.Writer) (Template, error) {
	opts.Dockerfile, opts.BuildArgs, opts.ReadyCommand = nil, nil, ""
	opts.DockerfileName = "steps"
	t, err := r.buildPlan(ctx, name, opts, progress, func(b *dbuild) (*dfPlan, error) {
		b.steps, b.finalStep = true, len(steps.Steps)+1
		base, err := b.resolveStepsBase(ctx, steps)
		if err != nil {
			return nil, stepError(0, err)
		}
		b.version = steps.Version
		return planSteps(steps, base)
	})
	if err != nil {
		return Template{}, fmt.Errorf("build template %q: %w", name, err)
	}
	return t, nil
}

// resolveStepsBase finds a Steps build's base: the template, or the image
// pulled.
func (b *dbuild) resolveStepsBase(ctx context.Context, s Steps) (baseInfo, error) {
	if s.From == "" {
		return baseInfo{}, fmt.Errorf("no base: a template or an image to build from: %w", errdefs.ErrInvalid)
	}
	if s.FromImage {
		return b.pull(ctx, s.From, 0)
	}
	if looksLikeImage(s.From) {
		return baseInfo{}, errdefs.WithCode(CodeNotFound, fmt.Errorf("template %q: not a template name (an image is built from with fromImage): %w", s.From, errdefs.ErrNotFound))
	}
	return b.resolveBase(ctx)(s.From, 0)
}

func (r *Registry) buildDockerfile(ctx context.Context, name string, opts DockerfileOptions, progress io.Writer) (Template, error) {
	return r.buildPlan(ctx, name, opts, progress, func(b *dbuild) (*dfPlan, error) {
		plan, err := parseDockerfile(opts.DockerfileName, opts.Dockerfile, opts.BuildArgs, b.resolveBase(ctx))
		if err != nil {
			return nil, err
		}
		if opts.ReadyCommand != "" {
			if len(plan.StartCommand) == 0 {
				return nil, fmt.Errorf("a ready command needs a start command (CMD or ENTRYPOINT) to test: %w", errdefs.ErrInvalid)
			}
			plan.ReadyCommand = []string{"/bin/sh", "-c", opts.ReadyCommand}
		}
		return plan, nil
	})
}

// buildPlan builds template name from the plan that plan makes (which may
// pull its base into the layer cache).
func (r *Registry) buildPlan(ctx context.Context, name string, opts DockerfileOptions, progress io.Writer, plan func(b *dbuild) (*dfPlan, error)) (Template, error) {
	if !validName(name) {
		return Template{}, fmt.Errorf("not a valid template name (letters, digits, '.', '_', '-'): %w", errdefs.ErrInvalid)
	}
	if IsBuiltin(name) || Resolve(name) != name {
		return Template{}, fmt.Errorf("%s is a built-in template; give the Dockerfile's template another name: %w", name, errdefs.ErrConflict)
	}
	if os.Geteuid() != 0 {
		return Template{}, fmt.Errorf("Dockerfile builds need root (gVisor sandboxes, network namespaces): %w", errdefs.ErrPermission)
	}
	if opts.Runtime == nil {
		return Template{}, fmt.Errorf("no runtime to run RUN steps with: %w", errdefs.ErrUnavailable)
	}
	if opts.DockerfileName == "" {
		opts.DockerfileName = "Dockerfile"
	}
	if opts.BuildBridge == "" {
		opts.BuildBridge = DefaultBuildBridge
	}
	if !opts.BuildSubnet.IsValid() {
		opts.BuildSubnet = DefaultBuildSubnet
	}
	if err := os.MkdirAll(r.dir, 0o755); err != nil {
		return Template{}, err
	}
	ctxDir, err := filepath.Abs(opts.Context)
	if err != nil {
		return Template{}, err
	}
	if fi, err := os.Stat(ctxDir); err != nil || !fi.IsDir() {
		return Template{}, fmt.Errorf("build context %s is not a directory: %w", opts.Context, errdefs.ErrInvalid)
	}
	opts.Context = ctxDir
	b := &dbuild{r: r, name: name, opts: opts, out: newDProgress(progress, name), layers: filepath.Join(r.dir, ".layers")}
	b.net = &stepNet{cfg: opts.Network(), run: opts.RunCommand, log: opts.Logger, printf: b.out.printf}
	defer b.net.close()

	// The layer cache is in use from the parse on: FROM an image pulls
	// into it.
	if err := os.MkdirAll(b.layers, 0o700); err != nil {
		return Template{}, err
	}
	inUse, err := layersShared(ctx, b.layers)
	if err != nil {
		return Template{}, err
	}
	defer inUse.Close()
	p, err := plan(b)
	if err != nil {
		return Template{}, err
	}
	for _, w := range p.Warnings {
		b.out.printf("warning: %s", w)
	}
	lock, err := r.lock(ctx, name, newReporter(progress, name))
	if err != nil {
		return Template{}, err
	}
	defer lock.unlock()
	r.removeStale(name, newReporter(progress, name))
	b.removeStaleLayers()

	base := b.base
	total := len(p.Steps) + 1
	if b.image != nil {
		base = Template{Name: b.image.ref, Version: b.image.digest, Rootfs: b.image.rootfs}
		b.out.printf("step 1/%d FROM %s (image %s)", total, p.From, b.image.digest)
	} else {
		b.out.printf("step 1/%d FROM %s (template %s %s)", total, p.From, base.Name, base.Version)
	}
	cur, key := base.Rootfs, p.FromKey
	for i, st := range p.Steps {
		if err := ctx.Err(); err != nil {
			return Template{}, err
		}
		n := i + 2
		// where names the step in errors: its Dockerfile line, or which
		// step of a Steps build (StepError) it is.
		where := func(err error) error {
			if p.steps {
				return stepError(st.Line, fmt.Errorf("step %d (%s): %w", st.Line, st.Op, err))
			}
			return fmt.Errorf("%s:%d: %w", opts.DockerfileName, st.Line, err)
		}
		switch st.Kind {
		case stepMeta:
			key = stepKey(key, st.KeyText, "")
			b.out.printf("step %d/%d %s", n, total, st.Text)
		case stepCopy:
			srcs, err := expandSources(opts.Context, st.Srcs)
			if err != nil {
				return Template{}, where(fmt.Errorf("%s: %w", st.Op, err))
			}
			sum, size, err := hashSources(srcs)
			if err != nil {
				return Template{}, where(fmt.Errorf("%s: %w", st.Op, err))
			}
			parent := key
			key = stepKey(key, st.KeyText, sum)
			if l, ok := b.cached(key); ok {
				b.out.printf("step %d/%d %s CACHED", n, total, st.Text)
				cur = l
				continue
			}
			b.out.printf("step %d/%d %s (%s)", n, total, st.Text, fmtBytes(size))
			start := time.Now()
			var copied int64
			l, err := b.makeLayer(ctx, cur, parent, key, st, func(rootfs string) error {
				if !path.IsAbs(st.Dest) {
					// A Steps build's destination relative to a workdir
					// not set yet: the user's home.
					_, _, home, err := lookupUser(rootfs, st.User)
					if err != nil {
						return err
					}
					dest := path.Join(home, st.Dest)
					if strings.HasSuffix(st.Dest, "/") || st.Dest == "." {
						dest += "/"
					}
					st.Dest = dest
				}
				var err error
				copied, err = copyStep(rootfs, srcs, st)
				return err
			})
			if err != nil {
				return Template{}, where(fmt.Errorf("%s: %w", st.Op, err))
			}
			b.out.printf("step %d/%d done: %s copied in %s", n, total, fmtBytes(copied), fmtDuration(time.Since(start)))
			cur = l
		case stepUser:
			if _, _, _, err := lookupUser(cur, st.User); err == nil {
				key = stepKey(key, st.KeyText, "present")
				b.out.printf("step %d/%d %s", n, total, st.Text)
				continue
			}
			// The rootfs lacks the user: a RUN of its Argv, as root, makes it.
			st.User, st.Workdir, st.WorkdirOwner = "", "/", ""
			st.KeyText += " made"
			st.Text += ": making the user"
			fallthrough
		case stepRun:
			parent := key
			key = stepKey(key, st.KeyText, "")
			if l, ok := b.cached(key); ok {
				b.out.printf("step %d/%d %s CACHED", n, total, st.Text)
				cur = l
				continue
			}
			b.out.printf("step %d/%d %s", n, total, st.Text)
			start := time.Now()
			l, err := b.makeLayer(ctx, cur, parent, key, st, func(rootfs string) error {
				return b.run(ctx, rootfs, st)
			})
			if err != nil {
				return Template{}, where(err)
			}
			b.out.printf("step %d/%d done in %s", n, total, fmtDuration(time.Since(start)))
			cur = l
		}
	}
	b.net.close()
	return b.install(ctx, p, base, cur, key)
}

// log is where the build logs what clients are not told.
func (b *dbuild) log() *slog.Logger {
	if b.opts.Logger != nil {
		return b.opts.Logger
	}
	return slog.Default()
}

// resolveBase finds what FROM names: a template (a built-in one that is
// not built yet is built first) or an image, which is pulled.
func (b *dbuild) resolveBase(ctx context.Context) baseResolver {
	return func(from string, line int) (baseInfo, error) {
		t, err := b.r.getFrom(from)
		if errors.Is(err, errdefs.ErrNotFound) {
			switch builtin := IsBuiltin(from); {
			case builtin:
				b.out.printf("FROM %s: building the built-in template first", from)
				t, err = b.r.top().EnsureBuilt(ctx, from, b.out.w)
			case looksLikeImage(from):
				return b.pull(ctx, from, line)
			default:
				names := b.r.top().Builtins()
				if ts, err := b.r.List(); err == nil {
					for _, t := range ts {
						if !IsBuiltin(t.Name) {
							names = append(names, t.Name)
						}
					}
				}
				hint := fmt.Sprintf("; an image needs its tag or registry, e.g. %s:latest", from)
				if b.steps {
					hint = ""
				}
				return baseInfo{}, errdefs.WithCode(CodeNotFound, fmt.Errorf("%s: no such lizard template (templates: %s%s): %w",
					b.fromWhere(from, line, false), strings.Join(names, ", "), hint, errdefs.ErrNotFound))
			}
		}
		if err != nil {
			return baseInfo{}, fmt.Errorf("%s: %w", b.fromWhere(from, line, false), err)
		}
		b.base = t
		return baseInfo{
			Key: fromKey(t.Name, t.Version, t.BuiltAt.UTC().Format(time.RFC3339Nano)),
			Env: t.Env, Workdir: t.Workdir, User: t.User, Entrypoint: t.Entrypoint, Cmd: inheritedCmd(t), Ready: t.ReadyCommand,
		}, nil
	}
}

// getFrom returns the template a Dockerfile's FROM names: a built-in one,
// or one of r's own (its project's).
func (r *Registry) getFrom(name string) (Template, error) {
	if IsBuiltin(name) {
		return r.top().Get(name)
	}
	return r.Get(name)
}

// inheritedCmd is the CMD a Dockerfile FROM t starts with: t's, or its
// whole start command for templates built before the two were kept apart.
func inheritedCmd(t Template) []string {
	if len(t.Entrypoint)+len(t.Cmd) == 0 {
		return t.StartCommand
	}
	return t.Cmd
}

// cached returns the rootfs of layer key when it is complete.
func (b *dbuild) cached(key string) (string, bool) {
	dir := filepath.Join(b.layers, key)
	if _, err := os.Stat(filepath.Join(dir, "layer.json")); err != nil {
		return "", false
	}
	touchLayer(dir)
	return filepath.Join(dir, rootfsDir), true
}

// makeLayer makes layer key: a copy of the rootfs from (an empty one when
// from is "") changed by fn, in a temporary directory renamed into place
// once complete, so a layer that exists is whole.
func (b *dbuild) makeLayer(ctx context.Context, from, parentKey, key string, st dfStep, fn func(rootfs string) error) (string, error) {
	tmp, err := os.MkdirTemp(b.layers, fmt.Sprintf(".tmp-%d-%s-", os.Getpid(), key[:12]))
	if err != nil {
		return "", err
	}
	done := false
	defer func() {
		if !done {
			os.RemoveAll(tmp)
		}
	}()
	rootfs := filepath.Join(tmp, rootfsDir)
	if from == "" {
		if err := os.Mkdir(rootfs, 0o755); err != nil {
			return "", err
		}
	} else {
		// A real copy (not hard links): RUN writes into it in place.
		cp := exec.CommandContext(ctx, "cp", "-a", "--reflink=auto", from, rootfs)
		if out, err := b.combinedOutput(cp); err != nil {
			return "", fmt.Errorf("copy the previous layer: %v: %s", err, strings.TrimSpace(string(out)))
		}
	}
	if err := fn(rootfs); err != nil {
		return "", err
	}
	if err := ctx.Err(); err != nil {
		return "", err
	}
	info := layerInfo{Key: key, Parent: parentKey, Instruction: st.Text, CreatedAt: time.Now().UTC()}
	bs, _ := json.MarshalIndent(info, "", "  ")
	if err := os.WriteFile(filepath.Join(tmp, "layer.json"), append(bs, '\n'), 0o644); err != nil {
		return "", err
	}
	final := filepath.Join(b.layers, key)
	if err := os.Rename(tmp, final); err != nil {
		// Another build made the same layer meanwhile: use that one.
		if _, ok := b.cached(key); ok {
			return filepath.Join(final, rootfsDir), nil
		}
		return "", err
	}
	done = true
	return filepath.Join(final, rootfsDir), nil
}

// removeStaleLayers removes layer directories that builds of processes no
// longer running left half-made (this process's may be another build's
// under way; PruneLayers removes those once no build runs).
func (b *dbuild) removeStaleLayers() {
	ents, err := os.ReadDir(b.layers)
	if err != nil {
		return
	}
	for _, e := range ents {
		f := strings.SplitN(e.Name(), "-", 3)
		if len(f) < 3 || f[0] != ".tmp" {
			continue
		}
		pid, err := strconv.Atoi(f[1])
		if err != nil {
			continue
		}
		if pid == os.Getpid() || syscall.Kill(pid, 0) == nil {
			continue // its build may still be running
		}
		os.RemoveAll(filepath.Join(b.layers, e.Name()))
	}
}

// install makes the template's new version: a hard-linked copy of the last
// layer (layers and templates are never written in place, so they may share
// files), the WORKDIR made, and the metadata; then, once
// opts.BeforeSwitch has accepted it, makes it the current version.
func (b *dbuild) install(ctx context.Context, plan *dfPlan, base Template, layer, key string) (Template, error) {
	tmp, err := os.MkdirTemp(b.r.dir, ".build-"+b.name+"-")
	if err != nil {
		return Template{}, err
	}
	installed := false
	defer func() {
		if !installed {
			if err := b.r.removeTree(tmp); err != nil {
				b.out.printf("warning: could not remove unfinished build %s: %v", tmp, err)
			}
		}
	}()
	if err := os.Chmod(tmp, 0o755); err != nil {
		return Template{}, err
	}
	rootfs := filepath.Join(tmp, rootfsDir)
	cp := exec.CommandContext(ctx, "cp", "-a", "--link", layer, rootfs)
	if out, err := b.combinedOutput(cp); err != nil {
		return Template{}, fmt.Errorf("copy the last layer: %v: %s", err, strings.TrimSpace(string(out)))
	}
	if plan.Workdir != "" {
		owner, err := workdirOwner(rootfs, plan.WorkdirOwner)
		if err != nil {
			return Template{}, err
		}
		if err := mkdirInRoot(rootfs, plan.Workdir, owner); err != nil {
			return Template{}, fmt.Errorf("WORKDIR %s: %w", plan.Workdir, err)
		}
	}
	size, err := treeSize(rootfs)
	if err != nil {
		return Template{}, fmt.Errorf("measure rootfs: %w", err)
	}
	versions, _ := readVersions(rootfs) // a rootfs without dpkg has none
	env := plan.Env
	if _, ok := lookupEnv(env, "PATH"); !ok {
		env = setEnv(env, "PATH", hostPath)
	}
	builtAt := time.Now().UTC().Truncate(time.Second)
	version := b.version
	if version == "" {
		version = "dockerfile-" + builtAt.Format("20060102T150405Z") + "-" + key[:12]
	}
	m := metadata{
		Name:         b.name,
		Version:      version,
		SizeBytes:    size,
		BuiltAt:      builtAt,
		Env:          env,
		Versions:     versions,
		From:         base.Name,
		Layer:        key,
		Workdir:      plan.Workdir,
		User:         plan.User,
		StartCommand: plan.StartCommand,
		Entrypoint:   plan.Entrypoint,
		Cmd:          plan.Cmd,
		ReadyCommand: plan.ReadyCommand,
	}
	if err := writeMetadata(tmp, m); err != nil {
		return Template{}, fmt.Errorf("write metadata: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return Template{}, err
	}
	var t Template
	check := func(vdir string) error {
		var err error
		t, err = b.beforeSwitch(ctx, vdir)
		return err
	}
	if _, err := b.r.installChecked(b.name, tmp, newReporter(b.out.w, b.name), check); err != nil {
		return Template{}, err
	}
	installed = true
	b.out.printf("built %s: %s in %s → %s", t.Version, fmtBytes(t.SizeBytes), fmtDuration(b.out.elapsed()), t.Rootfs)
	return t, nil
}

// beforeSwitch reads the new version vdir of the template and lets
// opts.BeforeSwitch see it before the name is switched to it.
func (b *dbuild) beforeSwitch(ctx context.Context, vdir string) (Template, error) {
	t, err := b.r.read(b.name, vdir)
	if err != nil {
		return Template{}, err
	}
	if b.opts.BeforeSwitch == nil {
		return t, nil
	}
	if err := b.opts.BeforeSwitch(ctx, t, b.out.w); err != nil {
		if b.steps {
			// The start and ready commands: the step after the last.
			return Template{}, stepError(b.finalStep, err)
		}
		return Template{}, err
	}
	// A cancelled build does not switch, even if the hook missed it.
	return t, ctx.Err()
}

// ---- RUN ----

// run runs a RUN step with the node's runtime (opts.Runtime), in a
// container on the build network whose root is rootfs itself: the writes
// are the layer.
func (b *dbuild) run(ctx context.Context, rootfs string, st dfStep) (err error) {
	uid, gid, home, err := lookupUser(rootfs, st.User)
	if err != nil {
		return fmt.Errorf("USER %s: %w", st.User, err)
	}
	if st.Workdir == "" {
		st.Workdir = home // a Steps build before any WORKDIR
	}
	owner, err := workdirOwner(rootfs, st.WorkdirOwner)
	if err != nil {
		return err
	}
	if err := mkdirInRoot(rootfs, st.Workdir, owner); err != nil {
		return fmt.Errorf("WORKDIR %s: %w", st.Workdir, err)
	}
	env := st.Env
	if _, ok := lookupEnv(env, "PATH"); !ok {
		env = setEnv(env, "PATH", hostPath)
	}
	if _, ok := lookupEnv(env, "HOME"); !ok {
		env = setEnv(env, "HOME", home)
	}
	code, last, rerr := runStep(ctx, b.opts.Runtime, b.net, step{
		Rootfs: rootfs, Args: st.Argv, Env: env, Cwd: st.Workdir, UID: uid, GID: gid,
		OnLine: func(l string) { b.out.printf("  | %s", l) },
	})
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if errors.Is(rerr, errdefs.ErrInvalid) {
		return fmt.Errorf("RUN %s: %w", strings.Join(st.Argv, " "), rerr)
	}
	if rerr != nil {
		return fmt.Errorf("RUN: %w", rerr)
	}
	if code == 0 {
		return nil
	}
	status := fmt.Sprintf("exit code %d", code)
	if code > 128 && code < 128+65 {
		status = fmt.Sprintf("exit code %d (signal %s)", code, syscall.Signal(code-128))
	}
	b.out.printf("RUN failed (%s); last output:", status)
	for _, l := range last {
		b.out.printf("  | %s", l)
	}
	msg := fmt.Sprintf("RUN %s: %s", strings.Join(st.Argv, " "), status)
	if len(last) > 0 {
		msg += "; last output: " + strings.Join(last, " ⏎ ")
	}
	return fmt.Errorf("%s: %w", msg, errdefs.ErrInvalid)
}

// combinedOutput runs cmd with opts.RunCommand (see combinedOutput).
func (b *dbuild) combinedOutput(cmd *exec.Cmd) ([]byte, error) {
	return combinedOutput(b.opts.RunCommand, cmd)
}

// ---- users ----

// lookupUser resolves USER ("name", "uid", "name:group", "uid:gid") with
// the rootfs's /etc/passwd and /etc/group. "" is root.
func lookupUser(rootfs, spec string) (uid, gid uint32, home string, err error) {
	if spec == "" {
		return 0, 0, "/root", nil
	}
	u, g, hasGroup := strings.Cut(spec, ":")
	home = "/"
	found := false
	if e, ok := findEntry(rootfs, "/etc/passwd", u, 2); ok && len(e) >= 6 {
		uid = parseID(e[2])
		gid = parseID(e[3])
		home = e[5]
		found = true
	} else if n, perr := strconv.ParseUint(u, 10, 32); perr == nil {
		uid, gid = uint32(n), 0
		found = true
	}
	if !found {
		return 0, 0, "", fmt.Errorf("no user %q in /etc/passwd: %w", u, errdefs.ErrInvalid)
	}
	if hasGroup {
		if e, ok := findEntry(rootfs, "/etc/group", g, 2); ok && len(e) >= 3 {
			gid = parseID(e[2])
		} else if n, perr := strconv.ParseUint(g, 10, 32); perr == nil {
			gid = uint32(n)
		} else {
			return 0, 0, "", fmt.Errorf("no group %q in /etc/group: %w", g, errdefs.ErrInvalid)
		}
	}
	return uid, gid, home, nil
}

// workdirOwner is the owner of the directories made for a workdir: user
// (with its group), or root when user is "".
func workdirOwner(rootfs, user string) (*[2]uint32, error) {
	if user == "" {
		return nil, nil
	}
	uid, gid, _, err := lookupUser(rootfs, user)
	if err != nil {
		return nil, fmt.Errorf("owner of the workdir: %w", err)
	}
	return &[2]uint32{uid, gid}, nil
}

// lookupChown resolves COPY --chown: as USER, except that a user without a
// group gets the gid equal to its uid (Docker's rule).
func lookupChown(rootfs, spec string) (uid, gid uint32, err error) {
	uid, gid, _, err = lookupUser(rootfs, spec)
	if err != nil {
		return 0, 0, err
	}
	if !strings.Contains(spec, ":") {
		gid = uid
	}
	return uid, gid, nil
}

// findEntry finds the line of a passwd-style file whose first field (or,
// for a number, field idField) is name.
func findEntry(rootfs, file, name string, idField int) ([]string, bool) {
	p, err := resolveInRoot(rootfs, file)
	if err != nil {
		return nil, false
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ":")
		if len(fields) > idField && (fields[0] == name || fields[idField] == name) {
			return fields, true
		}
	}
	return nil, false
}

func parseID(s string) uint32 {
	n, _ := strconv.ParseUint(s, 10, 32)
	return uint32(n)
}

// ---- paths inside a rootfs ----

// resolveInRoot returns the host path of p inside root, following symbolic
// links as if root were /, so that nothing resolves outside root.
func resolveInRoot(root, p string) (string, error) {
	resolved := "/"
	rest := strings.Split(path.Clean("/"+p), "/")
	links := 0
	for len(rest) > 0 {
		c := rest[0]
		rest = rest[1:]
		if c == "" || c == "." {
			continue
		}
		if c == ".." {
			resolved = path.Dir(resolved)
			continue
		}
		next := path.Join(resolved, c)
		fi, err := os.Lstat(filepath.Join(root, next))
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				resolved = next
				continue
			}
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			resolved = next
			continue
		}
		if links++; links > 255 {
			return "", fmt.Errorf("%s: too many levels of symbolic links", p)
		}
		t, err := os.Readlink(filepath.Join(root, next))
		if err != nil {
			return "", err
		}
		if path.IsAbs(t) {
			resolved = "/"
		}
		rest = append(strings.Split(t, "/"), rest...)
	}
	return filepath.Join(root, resolved), nil
}

// mkdirInRoot makes directory p (and its parents) inside root; new
// directories are 0755 and owned by owner (root if nil).
func mkdirInRoot(root, p string, owner *[2]uint32) error {
	dir := "/"
	for _, c := range strings.Split(path.Clean("/"+p), "/") {
		if c == "" {
			continue
		}
		host, err := resolveInRoot(root, path.Join(dir, c))
		if err != nil {
			return err
		}
		dir = "/" + strings.TrimPrefix(strings.TrimPrefix(host, root), "/")
		fi, err := os.Lstat(host)
		if err == nil {
			if !fi.IsDir() {
				return fmt.Errorf("%s exists and is not a directory: %w", dir, errdefs.ErrInvalid)
			}
			continue
		}
		if err := os.Mkdir(host, 0o755); err != nil {
			return err
		}
		if owner != nil {
			if err := os.Lchown(host, int(owner[0]), int(owner[1])); err != nil {
				return err
			}
		}
	}
	return nil
}

// ---- progress ----

// dprogress prints a Dockerfile build's progress lines.
type dprogress struct {
	mu    sync.Mutex
	w     io.Writer
	name  string
	start time.Time
}

func newDProgress(w io.Writer, name string) *dprogress {
	if w == nil {
		w = io.Discard
	}
	return &dprogress{w: w, name: name, start: time.Now()}
}

func (p *dprogress) elapsed() time.Duration { return time.Since(p.start) }

func (p *dprogress) printf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "[%s] %s\n", p.name, fmt.Sprintf(format, args...))
}

func fmtDuration(d time.Duration) string {
	return fmt.Sprintf("%.1f s", d.Seconds())
}
