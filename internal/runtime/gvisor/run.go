package gvisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/network"
	"github.com/lizard-build/lizard/internal/runtime"
)

var _ runtime.Runner = (*Runtime)(nil)

// runsDir holds the working directories of Run's containers, in the state
// directory under a name no sandbox can have (List and reconcile skip it).
const runsDir = ".run"

// Run implements runtime.Runner: `runsc run` (create, start and wait in
// one, so the exit status is runsc's own; a detached container's is gone
// by the time a later runsc wait asks) with --overlay2=none, so the
// container's root is spec.Rootfs itself.
func (r *Runtime) Run(ctx context.Context, spec runtime.RunSpec) (code int, err error) {
	if !validID(spec.ID) {
		return 0, fmt.Errorf("container id %q: %w", spec.ID, errdefs.ErrInvalid)
	}
	if !filepath.IsAbs(spec.Rootfs) {
		return 0, fmt.Errorf("rootfs %q: must be absolute: %w", spec.Rootfs, errdefs.ErrInvalid)
	}
	if spec.Network == nil || spec.Output == nil || len(spec.Args) == 0 {
		return 0, fmt.Errorf("run %s: a network, an output and a command are needed: %w", spec.ID, errdefs.ErrInvalid)
	}
	// Not before the leftovers of Runs cut short are gone (reconcile): one
	// could have this id.
	if err := r.ready(ctx); err != nil {
		return 0, err
	}
	if err := os.MkdirAll(filepath.Join(r.cfg.StateDir, runsDir), 0o700); err != nil {
		return 0, err
	}
	dir := filepath.Join(r.cfg.StateDir, runsDir, spec.ID)
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return 0, fmt.Errorf("container %q: %w", spec.ID, errdefs.ErrConflict)
		}
		return 0, err
	}
	ep, err := spec.Network.Setup(spec.ID, network.Egress{})
	if err != nil {
		os.RemoveAll(dir)
		return 0, fmt.Errorf("network: %w", err)
	}
	defer func() {
		// A container runsc still knows keeps its directory, which the
		// next start's reconcile finds.
		if derr := r.deleteContainer(context.WithoutCancel(ctx), spec.ID); derr != nil {
			r.cfg.Logger.Warn("delete a run's container; removed at the next start", "container", spec.ID, "err", derr)
			if err == nil {
				err = derr
			}
			return
		}
		errs := r.release(spec.ID, dir)
		errs = append(errs, spec.Network.Teardown(ep))
		if rerr := os.RemoveAll(dir); rerr != nil {
			errs = append(errs, rerr)
		}
		if cerr := errors.Join(errs...); cerr != nil {
			r.cfg.Logger.Warn("clean up after a run", "container", spec.ID, "err", cerr)
			if err == nil {
				err = fmt.Errorf("clean up container %s: %w", spec.ID, cerr)
			}
		}
	}()
	hostname := spec.Hostname
	if hostname == "" {
		hostname = spec.ID
	}
	etc := filepath.Join(dir, "etc")
	bundle := filepath.Join(dir, "bundle")
	for _, d := range []string{etc, bundle} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return 0, err
		}
	}
	for name, content := range etcFiles(hostname, ep) {
		if err := os.WriteFile(filepath.Join(etc, name), []byte(content), 0o644); err != nil {
			return 0, err
		}
	}
	if err := writeJSON(filepath.Join(bundle, "config.json"), runSpec(spec, etc, r.cgroupPath(spec.ID), ep)); err != nil {
		return 0, err
	}
	var from int64
	if fi, err := spec.Output.Stat(); err == nil {
		from = fi.Size()
	}
	rerr := r.runsc(ctx, spec.Output, "--overlay2=none", "run", "--bundle", bundle, spec.ID)
	if ctx.Err() != nil {
		return 0, ctx.Err()
	}
	if rerr == nil {
		return 0, nil
	}
	var ee *exec.ExitError
	if !errors.As(rerr, &ee) || ee.ExitCode() < 0 {
		return 0, fmt.Errorf("runsc run: %w", rerr)
	}
	// runsc's own failures (a missing program, a bad spec) exit 128 with
	// its message last.
	if ee.ExitCode() == 128 {
		out := appended(spec.Output.Name(), from, 4096)
		if i := strings.LastIndexByte(out, '\n'); i >= 0 {
			out = out[i+1:]
		}
		if strings.HasPrefix(out, "running container:") {
			return 0, fmt.Errorf("%s: %w", out, errdefs.ErrInvalid)
		}
	}
	return ee.ExitCode(), nil
}

// removeRuns removes the containers of Runs that a process of the server
// that ended mid-run left: their containers, processes, cgroups (under the
// runtime's parent, as its sandboxes') and files. It runs in reconcile,
// in the background of New; Run waits for it.
// Their addresses were on networks of their own, which go with them.
func (r *Runtime) removeRuns(ctx context.Context) {
	root := filepath.Join(r.cfg.StateDir, runsDir)
	ents, err := os.ReadDir(root)
	if err != nil {
		return
	}
	for _, e := range ents {
		id, dir := e.Name(), filepath.Join(root, e.Name())
		if !validID(id) {
			continue
		}
		if err := r.deleteContainer(ctx, id); err != nil {
			r.cfg.Logger.Error("reconcile: remove a run's container", "container", id, "err", err)
			continue
		}
		errs := append(r.release(id, dir), os.RemoveAll(dir))
		if err := errors.Join(errs...); err != nil {
			r.cfg.Logger.Error("reconcile: remove a run's leftovers", "container", id, "err", err)
		}
	}
}

// RemoveState removes the runtime's state directory and runsc's, for a
// runtime of one process that makes no sandboxes (`lizard template build`'s)
// once its runs are over: runsc leaves a bind mount ("null-netns") in its
// root.
func (r *Runtime) RemoveState() error {
	if r.cfg.Network != nil {
		return fmt.Errorf("a runtime with sandboxes keeps its state: %w", errdefs.ErrInvalid)
	}
	var errs []error
	for _, d := range []string{r.cfg.RunscRoot, r.cfg.StateDir} {
		for unix.Unmount(filepath.Join(d, "null-netns"), unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW) == nil {
		}
		if err := os.RemoveAll(d); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
