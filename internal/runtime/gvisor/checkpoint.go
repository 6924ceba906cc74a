package gvisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/lizard-build/lizard/internal/disk"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/network"
	"github.com/lizard-build/lizard/internal/runtime"
	"github.com/lizard-build/lizard/internal/tracing"
)

var (
	_ runtime.Checkpointer = (*Runtime)(nil)
	_ runtime.PauseImager  = (*Runtime)(nil)
	_ runtime.FilesPauser  = (*Runtime)(nil)
)

// A pause writes the image into checkpoint.tmp, renames it to checkpoint
// (complete), records Paused in state.json, and only then deletes the
// container. Each step is safe to be cut short by a crash: reconcile, at the
// next start, finishes or undoes it so that the sandbox is either running as
// before or paused.
const (
	checkpointDir = "checkpoint"
	tmpSuffix     = ".tmp"
)

func (r *Runtime) readState(id string) (state, error) {
	var st state
	if err := readJSON(filepath.Join(r.dir(id), "state.json"), &st); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return st, fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
		}
		return st, err
	}
	return st, nil
}

// rawStatus is runsc's own word for the container ("running", "paused"
// when frozen, "stopped", "created"), or "" when runsc has none or gave no
// answer (see queryStatus).
func (r *Runtime) rawStatus(ctx context.Context, id string) string {
	s, _, _ := r.queryStatus(ctx, id)
	return s
}

// save writes the container's checkpoint into image+".tmp" and renames it
// to image. runsc stops the sandbox's tasks while it saves, so the image is
// consistent, and --leave-running lets them go on afterwards: whatever
// happens to this process, the sandbox is never left stopped without a
// complete image. The rename publishes the image; it is not fsynced, as a
// crash of the server keeps the page cache and a clean reboot flushes it.
func (r *Runtime) save(ctx context.Context, id, image string) error {
	tmp := image + tmpSuffix
	os.RemoveAll(tmp)
	cctx, span := tracing.Start(ctx, "runsc checkpoint", tracing.SandboxID.String(id))
	err := r.runsc(cctx, nil, "checkpoint", "--leave-running", "--image-path", tmp, id)
	tracing.End(span, err)
	if err == nil {
		err = r.writeManifest(ctx, id, tmp, false)
	}
	if err == nil {
		err = os.Rename(tmp, image)
	}
	if err != nil {
		// Whether the disk filled is seen before the partial image goes.
		err = disk.Classify(filepath.Dir(tmp), err)
		os.RemoveAll(tmp)
		return fmt.Errorf("checkpoint: %w", err)
	}
	return nil
}

// freeze freezes container id (runsc pause) for the moment from its
// pause's image to its end, when it has writable mounts of host files, and
// returns what thaws it (a no-op when nothing was frozen): a container
// that ran on in between would write on to those mounts (volumes: host
// files the image does not hold) past what the image remembers, so that
// the resumed sandbox repeats what it did, or its restore fails on a file
// renamed away. What it writes elsewhere is in its memory and overlay,
// which only the image keeps, so a sandbox without such mounts is not
// frozen (a runsc run the less). A pause that fails after freeze thaws;
// a crash in between leaves the container frozen for reconcile to thaw.
func (r *Runtime) freeze(ctx context.Context, id string) (thaw func(), err error) {
	if !r.writesHostFiles(id) {
		return func() {}, nil
	}
	if err := r.runsc(ctx, nil, "pause", id); err != nil {
		return nil, fmt.Errorf("freeze: %w", err)
	}
	return func() {
		if err := r.runsc(context.WithoutCancel(ctx), nil, "resume", id); err != nil {
			r.cfg.Logger.Warn("thaw after a failed pause", "sandbox", id, "err", err)
		}
	}, nil
}

// writesHostFiles reports whether sandbox id has a writable bind mount of
// the host's besides its own /etc/hosts and /etc/resolv.conf (true when
// its spec cannot be read).
func (r *Runtime) writesHostFiles(id string) bool {
	var spec specs.Spec
	if err := readJSON(filepath.Join(r.dir(id), "bundle", "config.json"), &spec); err != nil {
		return true
	}
	for _, m := range spec.Mounts {
		if m.Type != "bind" || m.Destination == "/etc/hosts" || m.Destination == "/etc/resolv.conf" {
			continue
		}
		if !slices.Contains(m.Options, "ro") {
			return true
		}
	}
	return false
}

// Pause implements runtime.Checkpointer.
func (r *Runtime) Pause(ctx context.Context, id string) (err error) {
	ctx, span := tracing.Start(ctx, "runtime pause", tracing.SandboxID.String(id))
	defer func() { tracing.End(span, err) }()
	if err := r.ready(ctx); err != nil {
		return err
	}
	st, err := r.readState(id)
	if err != nil {
		return err
	}
	if st.Paused {
		return nil
	}
	image := filepath.Join(r.dir(id), checkpointDir)
	os.RemoveAll(image)
	thaw, err := r.freeze(ctx, id)
	if err != nil {
		return r.notRunning(ctx, id, err)
	}
	if err := r.save(ctx, id, image); err != nil {
		thaw()
		return r.notRunning(ctx, id, err)
	}
	st.Paused = true
	if err := writeJSON(filepath.Join(r.dir(id), "state.json"), st); err != nil {
		os.RemoveAll(image)
		thaw()
		return err
	}
	// The image is the sandbox now: what the container does from here on
	// is not kept.
	if err := r.runsc(context.WithoutCancel(ctx), nil, "delete", "--force", id); err != nil {
		r.cfg.Logger.Warn("delete container after pause; retried at next start", "sandbox", id, "err", err)
	}
	return nil
}

// filesImageFile is the file runsc fscheckpoint writes first into a
// files-only image: its index of what the image holds.
const filesImageFile = "fscheckpoint.pb"

// IsFilesImage implements runtime.FilesPauser.
func (r *Runtime) IsFilesImage(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, filesImageFile))
	return err == nil
}

// PauseFiles implements runtime.FilesPauser with runsc fscheckpoint: the
// overlay's upper layer (what the sandbox wrote, whiteouts for what it
// deleted) goes into the image, and the container is deleted. As Pause,
// the image is complete (renamed from .tmp) and state.json says paused
// before the container goes, so a crash in between leaves the sandbox
// either running or paused.
func (r *Runtime) PauseFiles(ctx context.Context, id string) (err error) {
	ctx, span := tracing.Start(ctx, "runtime pause files", tracing.SandboxID.String(id))
	defer func() { tracing.End(span, err) }()
	if err := r.ready(ctx); err != nil {
		return err
	}
	st, err := r.readState(id)
	if err != nil {
		return err
	}
	if st.Paused {
		return nil
	}
	image := filepath.Join(r.dir(id), checkpointDir)
	os.RemoveAll(image)
	tmp := image + tmpSuffix
	os.RemoveAll(tmp)
	failed := func(err error) error {
		err = disk.Classify(filepath.Dir(tmp), err)
		os.RemoveAll(tmp)
		return fmt.Errorf("files checkpoint: %w", err)
	}
	err = os.Mkdir(tmp, 0o700)
	if err == nil {
		err = r.writeManifest(ctx, id, tmp, true)
	}
	if err != nil {
		return r.notRunning(ctx, id, failed(err))
	}
	thaw, err := r.freeze(ctx, id)
	if err != nil {
		os.RemoveAll(tmp)
		return r.notRunning(ctx, id, err)
	}
	err = r.runsc(ctx, nil, "fscheckpoint", "--leave-running", "--image-path", tmp, id)
	if err == nil {
		err = os.Rename(tmp, image)
	}
	if err != nil {
		thaw()
		return r.notRunning(ctx, id, failed(err))
	}
	st.Paused = true
	if err := writeJSON(filepath.Join(r.dir(id), "state.json"), st); err != nil {
		os.RemoveAll(image)
		thaw()
		return err
	}
	if err := r.runsc(context.WithoutCancel(ctx), nil, "delete", "--force", id); err != nil {
		r.cfg.Logger.Warn("delete container after pause; retried at next start", "sandbox", id, "err", err)
	}
	return nil
}

// PauseImage implements runtime.PauseImager.
func (r *Runtime) PauseImage(id string) string { return filepath.Join(r.dir(id), checkpointDir) }

// Resume implements runtime.Checkpointer.
func (r *Runtime) Resume(ctx context.Context, id string) (err error) {
	ctx, span := tracing.Start(ctx, "runtime resume", tracing.SandboxID.String(id))
	defer func() { tracing.End(span, err) }()
	if err := r.ready(ctx); err != nil {
		return err
	}
	st, err := r.readState(id)
	if err != nil {
		return err
	}
	if !st.Paused {
		if s := r.rawStatus(ctx, id); s != "running" {
			return fmt.Errorf("sandbox %q is %s: %w", id, orNone(s), errdefs.ErrConflict)
		}
		return nil
	}
	image := filepath.Join(r.dir(id), checkpointDir)
	if err := r.compatible(ctx, image); err != nil {
		return err
	}
	// Whatever a pause or an earlier resume cut short left goes first — a
	// container, stray processes, a half-made cgroup (whose empty cpuset
	// would refuse the new sandbox): the image is the state.
	if r.hasStateFile(id) && r.rawStatus(ctx, id) != "" {
		r.runsc(ctx, nil, "delete", "--force", id)
	}
	if err := errors.Join(r.release(id, r.dir(id))...); err != nil {
		return fmt.Errorf("clear the way for resume: %w", err)
	}
	// After a reboot the namespace (on /run) is gone; the address is kept.
	_, nspan := tracing.Start(ctx, "network rebuild", tracing.SandboxID.String(id))
	err = r.cfg.Network.Rebuild(id, st.Endpoint, st.Egress)
	tracing.End(nspan, err)
	if err != nil {
		return fmt.Errorf("network: %w", err)
	}
	console, err := os.OpenFile(filepath.Join(r.dir(id), "console.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer console.Close()
	if r.IsFilesImage(image) {
		err = r.boot(ctx, st, image, console)
	} else {
		err = r.restore(ctx, st, image, console)
	}
	if err != nil {
		return err
	}
	st.Paused = false
	if err := writeJSON(filepath.Join(r.dir(id), "state.json"), st); err != nil {
		// Running but not recorded as such: undo, it stays paused.
		r.runsc(context.WithoutCancel(ctx), nil, "delete", "--force", id)
		return err
	}
	os.RemoveAll(image)
	return nil
}

// restore brings container st.ID up from image. runsc takes the addresses
// off the veth when a sandbox boots, so they are put back first. A failed
// restore leaves no container behind.
func (r *Runtime) restore(ctx context.Context, st state, image string, console *os.File) (err error) {
	ctx, span := tracing.Start(ctx, "runsc restore", tracing.SandboxID.String(st.ID))
	defer func() { tracing.End(span, err) }()
	if err := network.ConfigureInside(st.Endpoint); err != nil {
		return fmt.Errorf("network: %w", err)
	}
	args := append(r.overlayFlag(st), "restore", "--detach", "--image-path", image,
		"--bundle", filepath.Join(r.dir(st.ID), "bundle"), st.ID)
	if err := r.runsc(ctx, console, args...); err != nil {
		r.runsc(context.WithoutCancel(ctx), nil, "delete", "--force", st.ID)
		r.removeCgroups(st.ID)
		return fmt.Errorf("runsc restore: %w", err)
	}
	return nil
}

// boot creates and starts container st.ID afresh from its bundle over the
// files of the files-only image: the resume of a sandbox PauseFiles
// paused. A failed boot leaves no container behind.
func (r *Runtime) boot(ctx context.Context, st state, image string, console *os.File) (err error) {
	ctx, span := tracing.Start(ctx, "runsc boot over files", tracing.SandboxID.String(st.ID))
	defer func() { tracing.End(span, err) }()
	if err := network.ConfigureInside(st.Endpoint); err != nil {
		return fmt.Errorf("network: %w", err)
	}
	args := append(r.overlayFlag(st), "create", "--fs-restore-image-path", image,
		"--bundle", filepath.Join(r.dir(st.ID), "bundle"), st.ID)
	err = r.runsc(ctx, console, args...)
	if err != nil {
		err = fmt.Errorf("runsc create: %w", err)
	} else if err = r.runsc(ctx, console, "start", st.ID); err != nil {
		err = fmt.Errorf("runsc start: %w", err)
	}
	if err != nil {
		r.runsc(context.WithoutCancel(ctx), nil, "delete", "--force", st.ID)
		r.removeCgroups(st.ID)
		return err
	}
	return nil
}

// Snapshot implements runtime.Checkpointer.
func (r *Runtime) Snapshot(ctx context.Context, id, dir string) (err error) {
	ctx, span := tracing.Start(ctx, "runtime snapshot", tracing.SandboxID.String(id))
	defer func() { tracing.End(span, err) }()
	if err := r.ready(ctx); err != nil {
		return err
	}
	if _, err := r.readState(id); err != nil {
		return err
	}
	if _, err := os.Stat(dir); err == nil {
		return errdefs.WithCause(errdefs.ErrConflict, "the snapshot's directory exists", fmt.Errorf("snapshot directory %s", dir))
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return err
	}
	if err := r.save(ctx, id, dir); err != nil {
		return r.notRunning(ctx, id, err)
	}
	return nil
}

// notRunning explains a checkpoint that failed: a sandbox that is not
// running is a conflict (asked only then: a runsc state before every
// checkpoint would cost each one a runsc run).
func (r *Runtime) notRunning(ctx context.Context, id string, err error) error {
	if s := r.rawStatus(context.WithoutCancel(ctx), id); s != "running" {
		return fmt.Errorf("sandbox %q is %s, not running: %w", id, orNone(s), errdefs.ErrConflict)
	}
	return err
}

// Restore implements runtime.Checkpointer.
func (r *Runtime) Restore(ctx context.Context, spec runtime.Spec, dir string) (sb runtime.Sandbox, err error) {
	ctx, span := tracing.Start(ctx, "runtime restore", tracing.SandboxID.String(spec.ID))
	defer func() { tracing.End(span, err) }()
	if _, err := os.Stat(filepath.Join(dir, runtime.ImageFile)); err != nil && !r.IsFilesImage(dir) {
		return runtime.Sandbox{}, errdefs.WithCause(errdefs.ErrNotFound, "the checkpoint image is missing", fmt.Errorf("image %s: %w", dir, err))
	}
	if err := r.compatible(ctx, dir); err != nil {
		return runtime.Sandbox{}, err
	}
	return r.make(ctx, spec, dir)
}

// attachAll takes back each sandbox's address and egress policy, so that
// no new sandbox gets an address in use and the resolver knows every
// policy before recovery has judged anything. It returns the sandboxes'
// states by id (none for a runtime without a network, which has no
// sandboxes).
func (r *Runtime) attachAll() map[string]state {
	if r.cfg.Network == nil {
		return nil
	}
	start := time.Now()
	ents, err := os.ReadDir(r.cfg.StateDir)
	if err != nil {
		return nil
	}
	states := map[string]state{}
	for _, e := range ents {
		id := e.Name()
		if !e.IsDir() || !validID(id) {
			continue
		}
		st, err := r.readState(id)
		if err != nil {
			continue
		}
		states[id] = st
		if err := r.cfg.Network.Attach(id, st.Endpoint, st.Egress); err != nil {
			r.cfg.Logger.Error("re-apply network policy", "sandbox", id, "err", err)
		}
	}
	r.cfg.Logger.Debug("sandbox addresses and egress policies taken back", "sandboxes", len(states), "took", time.Since(start).Round(time.Millisecond))
	return states
}

// reconcile removes what Runs cut short left (removeRuns) and finishes or
// undoes checkpoint steps that a crash cut short: a paused sandbox whose
// container is still there loses the container (the image is its state),
// a frozen one is thawed, and partial images go. One runsc run for all: on
// a host busy with its sandboxes each run is slow.
func (r *Runtime) reconcile(ctx context.Context, states map[string]state) {
	r.removeRuns(ctx)
	if len(states) == 0 {
		return
	}
	start := time.Now()
	raws, err := r.runscListRaw(ctx)
	if err != nil {
		r.cfg.Logger.Error("reconcile: runsc list", "err", err)
		raws = nil
	}
	r.cfg.Logger.Debug("reconcile: runsc list", "took", time.Since(start).Round(time.Millisecond))
	for id, st := range states {
		os.RemoveAll(filepath.Join(r.dir(id), checkpointDir+tmpSuffix))
		if raws == nil {
			continue // nothing known of the containers: leave them be
		}
		switch raw := raws[id]; {
		case st.Paused && raw != "":
			r.cfg.Logger.Info("reconcile: removing the container of a paused sandbox", "sandbox", id, "status", raw)
			r.runsc(ctx, nil, "delete", "--force", id)
		case !st.Paused && raw == "paused":
			r.cfg.Logger.Info("reconcile: thawing a sandbox frozen by an interrupted checkpoint", "sandbox", id)
			r.runsc(ctx, nil, "resume", id)
		}
		if !st.Paused {
			os.RemoveAll(filepath.Join(r.dir(id), checkpointDir))
		}
	}
	r.cfg.Logger.Debug("reconcile: done", "sandboxes", len(states), "took", time.Since(start).Round(time.Millisecond))
}

func orNone(s string) string {
	if s == "" {
		return "gone"
	}
	return s
}
