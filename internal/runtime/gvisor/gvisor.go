// Package gvisor is the runtime backend that runs each sandbox as a gVisor
// (runsc, systrap platform) container: the template's rootfs under a
// disk-backed overlay held in the sandbox's own directory, lizard-agent
// bind-mounted read-only as PID 1, a network namespace from package network,
// and a cgroup of its own sized from the spec. Only the server's wiring
// imports it; everything else sees runtime.Runtime.
package gvisor

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/network"
	"github.com/lizard-build/lizard/internal/reaper"
	"github.com/lizard-build/lizard/internal/runtime"
	"github.com/lizard-build/lizard/internal/stray"
	"github.com/lizard-build/lizard/internal/tracing"
)

// Config wires the backend.
type Config struct {
	Runsc     string // path of the runsc binary
	StateDir  string // per-sandbox directories live here
	RunscRoot string // runsc's own state (--root), e.g. /run/lizard/runsc
	AgentPath string // host path of the static lizard-agent binary
	// CLIPath is the host path of the static lizard binary, bind-mounted
	// read-only at CLIPath in every sandbox created (a restore mounts it
	// when its image's sandbox had it: see Manifest.LizardCLI); "": none.
	CLIPath string
	// EgressCA is the host path of the egress proxy's CA certificate
	// (PEM), bind-mounted read-only at agent.EgressCAFile in every sandbox
	// created, whose agent trusts it (a restore mounts it when its image's
	// sandbox had it: see Manifest.EgressCA); "": none.
	EgressCA string
	Platform string // "systrap" unless told otherwise
	// Network is the sandboxes' network. A runtime without one (and
	// without an agent) makes no sandboxes: it only Runs commands, each
	// on the network its RunSpec names (`lizard template build`).
	Network *network.Manager
	// Reaper runs runsc commands in a server that is a child subreaper;
	// nil runs them directly.
	Reaper *reaper.Reaper
	Logger *slog.Logger

	// CgroupParent is the cgroup (one name, in every hierarchy) the
	// containers' cgroups go under, the sandboxes' and Run's alike:
	// /<parent>/<id>; "" means DefaultCgroupParent. Servers sharing a
	// host pass parents of their own, so that each one's cgroup scans see
	// only its own containers.
	CgroupParent string
}

// Runtime implements runtime.Runtime with runsc.
type Runtime struct {
	cfg   Config
	build build // what checkpoints record of this server's runsc and CPU
	// reconciled is closed once the containers a crash left half-way
	// are settled (see reconcile); every operation that runs runsc waits
	// for it.
	reconciled chan struct{}
}

var _ runtime.Runtime = (*Runtime)(nil)

// New checks the configuration and prepares the state directories.
func New(cfg Config) (*Runtime, error) {
	if cfg.Platform == "" {
		cfg.Platform = "systrap"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = DefaultCgroupParent
	}
	if err := ValidCgroupParent(cfg.CgroupParent); err != nil {
		return nil, fmt.Errorf("gvisor: %w", err)
	}
	for _, p := range []string{cfg.Runsc, cfg.AgentPath} {
		if p == "" && cfg.Network == nil {
			continue // no sandboxes: no agent needed
		}
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("gvisor: %w", err)
		}
	}
	if cfg.CLIPath != "" {
		if _, err := os.Stat(cfg.CLIPath); err != nil {
			return nil, fmt.Errorf("gvisor: the lizard CLI: %w", err)
		}
	}
	for _, d := range []string{cfg.StateDir, cfg.RunscRoot} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("gvisor: %w", err)
		}
	}
	r := &Runtime{cfg: cfg, reconciled: make(chan struct{})}
	// Addresses and egress policies are taken back at once (no runsc run);
	// what needs runsc runs in the background: on a host busy with its
	// sandboxes one runsc run can take many seconds, and the server must
	// not wait for it before it serves.
	states := r.attachAll()
	go func() {
		defer close(r.reconciled)
		r.reconcile(context.Background(), states)
	}()
	return r, nil
}

// ready waits until reconcile is over.
func (r *Runtime) ready(ctx context.Context) error {
	select {
	case <-r.reconciled:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("gvisor: waiting for the sandboxes of the last run to be settled: %w", ctx.Err())
	}
}

// RunscRootFor is runsc's state directory (--root) for a server whose data
// directory is dataDir. It is per data directory so that two servers on one
// host (a test beside a dev server) never see, or clean up, each other's
// sandboxes.
func RunscRootFor(dataDir string) string {
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		abs = dataDir
	}
	sum := sha256.Sum256([]byte(abs))
	return "/run/lizard/runsc-" + hex.EncodeToString(sum[:])[:12]
}

// state is what the backend keeps on disk for each sandbox.
type state struct {
	ID       string           `json:"id"`
	Endpoint network.Endpoint `json:"endpoint"`
	DiskMB   int64            `json:"diskMb"`
	Egress   network.Egress   `json:"egress"`
	// Paused: the sandbox's whole state is in its checkpoint directory and
	// it has no container; set only once the image is complete.
	Paused bool `json:"paused,omitempty"`
}

func (r *Runtime) dir(id string) string { return filepath.Join(r.cfg.StateDir, id) }

// DefaultCgroupParent is the cgroup sandboxes go under unless
// Config.CgroupParent says otherwise.
const DefaultCgroupParent = "lizard"

// ValidCgroupParent checks that parent is one cgroup name (no path): 1 to
// 64 letters, digits, '.', '_' or '-', not starting with '.' or '-'.
func ValidCgroupParent(parent string) error {
	ok := parent != "" && len(parent) <= 64 && parent[0] != '.' && parent[0] != '-'
	for _, c := range parent {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == '-':
		default:
			ok = false
		}
	}
	if !ok {
		return fmt.Errorf("cgroup parent %q: want one name of 1 to 64 letters, digits, '.', '_' or '-': %w", parent, errdefs.ErrInvalid)
	}
	return nil
}

// cgroupPath is the sandbox's cgroup, relative to each hierarchy's root.
func (r *Runtime) cgroupPath(id string) string { return cgroupPath(r.cfg.CgroupParent, id) }

func cgroupPath(parent, id string) string { return "/" + parent + "/" + id }

// Create implements runtime.Runtime.
func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) (sb runtime.Sandbox, err error) {
	ctx, span := tracing.Start(ctx, "runtime create", tracing.SandboxID.String(spec.ID))
	defer func() { tracing.End(span, err) }()
	return r.make(ctx, spec, "")
}

// make prepares a sandbox's directory, network and bundle, then either
// creates its container (image "") or restores it from a checkpoint image,
// which also starts it.
func (r *Runtime) make(ctx context.Context, spec runtime.Spec, image string) (sb runtime.Sandbox, err error) {
	if err := r.ready(ctx); err != nil {
		return runtime.Sandbox{}, err
	}
	if !validID(spec.ID) {
		return sb, fmt.Errorf("sandbox id %q: %w", spec.ID, errdefs.ErrInvalid)
	}
	if !filepath.IsAbs(spec.Rootfs) {
		return sb, fmt.Errorf("rootfs %q: must be absolute: %w", spec.Rootfs, errdefs.ErrInvalid)
	}
	if r.cfg.Network == nil {
		return sb, fmt.Errorf("this runtime makes no sandboxes (no network): %w", errdefs.ErrUnavailable)
	}
	dir := r.dir(spec.ID)
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return sb, fmt.Errorf("sandbox %q: %w", spec.ID, errdefs.ErrConflict)
		}
		return sb, err
	}
	defer func() {
		if err != nil {
			if derr := r.Destroy(context.WithoutCancel(ctx), spec.ID); derr != nil {
				r.cfg.Logger.Error("cleanup after failed create", "sandbox", spec.ID, "err", derr)
			}
		}
	}()
	for _, d := range []string{"bundle", "overlay"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			return sb, err
		}
	}
	_, nspan := tracing.Start(ctx, "network setup", tracing.SandboxID.String(spec.ID))
	ep, err := r.cfg.Network.Setup(spec.ID, spec.Egress)
	tracing.End(nspan, err)
	if err != nil {
		return sb, fmt.Errorf("network: %w", err)
	}
	// Written before anything else can fail, so that Destroy finds the
	// endpoint to tear down.
	st := state{ID: spec.ID, Endpoint: ep, DiskMB: diskMB(spec.Resources), Egress: spec.Egress}
	if err := writeJSON(filepath.Join(dir, "state.json"), st); err != nil {
		r.cfg.Network.Teardown(ep)
		return sb, err
	}
	etc := filepath.Join(dir, "etc")
	if err := os.Mkdir(etc, 0o755); err != nil {
		return sb, err
	}
	for name, content := range etcFiles(spec.ID, ep) {
		if err := os.WriteFile(filepath.Join(etc, name), []byte(content), 0o644); err != nil {
			return sb, err
		}
	}
	// runsc restores an image only into a spec with the mounts it was
	// taken with: the CLI and the CA go where the image's sandbox had them.
	cli, ca := r.cfg.CLIPath, r.cfg.EgressCA
	files := image != "" && r.IsFilesImage(image)
	if image != "" && !files {
		hadCLI, hadCA, err := imageMounts(image)
		if err != nil {
			return sb, err
		}
		if !hadCLI {
			cli = ""
		} else if cli == "" {
			return sb, errdefs.WithCause(errdefs.ErrConflict, "the image was taken of a sandbox with the lizard CLI mounted, and this runtime has none to mount", fmt.Errorf("image %s", image))
		}
		if !hadCA {
			ca = ""
		} else if ca == "" {
			return sb, errdefs.WithCause(errdefs.ErrConflict, "the image was taken of a sandbox with the egress CA mounted, and this runtime has none to mount", fmt.Errorf("image %s", image))
		}
	}
	if err := writeJSON(filepath.Join(dir, "bundle", "config.json"), ociSpec(spec, r.cfg.AgentPath, cli, ca, etc, r.cgroupPath(spec.ID), ep)); err != nil {
		return sb, err
	}
	console, err := os.OpenFile(filepath.Join(dir, "console.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return sb, err
	}
	defer console.Close()
	if image != "" {
		if files {
			err = r.boot(ctx, st, image, console)
		} else {
			err = r.restore(ctx, st, image, console)
		}
		if err != nil {
			return sb, err
		}
		return runtime.Sandbox{ID: spec.ID, State: runtime.StateRunning, Addr: ep.Addr, Agent: agentAt(ep.Addr)}, nil
	}
	// A sandbox to start at once is one runsc run: a create and a start
	// in one runsc process, one start-up of runsc the fewer.
	cmd, state := []string{"create"}, runtime.StateCreated
	if spec.Start {
		cmd, state = []string{"run", "--detach"}, runtime.StateRunning
	}
	args := append(append(r.overlayFlag(st), cmd...), "--bundle", filepath.Join(dir, "bundle"), spec.ID)
	cctx, cspan := tracing.Start(ctx, "runsc "+cmd[0], tracing.SandboxID.String(spec.ID))
	err = r.runsc(cctx, console, args...)
	tracing.End(cspan, err)
	if err != nil {
		return sb, fmt.Errorf("runsc %s: %w", cmd[0], err)
	}
	return runtime.Sandbox{ID: spec.ID, State: state, Addr: ep.Addr, Agent: agentAt(ep.Addr)}, nil
}

// overlayFlag is the sandbox's writable layer: gVisor's overlay, backed by a
// file in the sandbox's own directory, capped at its disk size.
func (r *Runtime) overlayFlag(st state) []string {
	return []string{"--overlay2", fmt.Sprintf("root:dir=%s,size=%dm", filepath.Join(r.dir(st.ID), "overlay"), st.DiskMB)}
}

// Start implements runtime.Runtime.
func (r *Runtime) Start(ctx context.Context, id string) (err error) {
	ctx, span := tracing.Start(ctx, "runtime start", tracing.SandboxID.String(id))
	defer func() { tracing.End(span, err) }()
	if err := r.ready(ctx); err != nil {
		return err
	}
	if _, err := os.Stat(r.dir(id)); err != nil {
		return fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	// Start first and ask why only when it fails: a runsc state before
	// every start costs a create one more runsc run.
	err = r.runsc(ctx, nil, "start", id)
	if err == nil {
		return nil
	}
	switch st, serr := r.status(ctx, id); {
	case serr != nil:
		return serr
	case st == runtime.StateRunning:
		return nil
	case st != runtime.StateCreated:
		return fmt.Errorf("sandbox %q is %s: %w", id, st, errdefs.ErrConflict)
	}
	return fmt.Errorf("runsc start: %w", err)
}

// Stop implements runtime.Runtime.
func (r *Runtime) Stop(ctx context.Context, id string) error {
	if err := r.ready(ctx); err != nil {
		return err
	}
	st, err := r.status(ctx, id)
	if err != nil {
		return err
	}
	if st == runtime.StateStopped {
		return nil
	}
	if err := r.runsc(ctx, nil, "kill", "--all", id, "KILL"); err != nil {
		// It may have stopped between status and kill, or be stopping:
		// a sandbox process that has exited (its control server refuses
		// the kill) counts as running to runsc until the reaper has
		// waited for it, which a busy host delays.
		for wait := time.Now().Add(stopSettle); ; time.Sleep(50 * time.Millisecond) {
			if st2, err2 := r.status(ctx, id); err2 == nil && st2 == runtime.StateStopped {
				return nil
			}
			if time.Now().After(wait) || ctx.Err() != nil {
				break
			}
		}
		return fmt.Errorf("runsc kill: %w", err)
	}
	return nil
}

// stopSettle bounds Stop's wait for a sandbox whose kill failed to be
// seen stopped.
const stopSettle = 3 * time.Second

// Destroy implements runtime.Runtime.
func (r *Runtime) Destroy(ctx context.Context, id string) (err error) {
	ctx, span := tracing.Start(ctx, "runtime destroy", tracing.SandboxID.String(id))
	defer func() { tracing.End(span, err) }()
	if err := r.ready(ctx); err != nil {
		return err
	}
	if !validID(id) || r.cfg.Network == nil {
		return nil // a runtime without a network has no sandboxes
	}
	var errs []error
	dir := r.dir(id)
	var st state
	stateErr := readJSON(filepath.Join(dir, "state.json"), &st)
	dctx, dspan := tracing.Start(ctx, "runsc delete", tracing.SandboxID.String(id))
	err = r.deleteContainer(dctx, id)
	tracing.End(dspan, err)
	if err != nil {
		// Keep the directory: it is how the next attempt finds the sandbox.
		return err
	}
	_, rspan := tracing.Start(ctx, "host cleanup", tracing.SandboxID.String(id))
	defer func() { tracing.End(rspan, err) }()
	errs = append(errs, r.release(id, dir)...)
	if stateErr == nil {
		errs = append(errs, r.cfg.Network.Teardown(st.Endpoint))
	} else {
		// No record of the address: remove the namespace and veth by name.
		errs = append(errs, r.cfg.Network.Teardown(r.cfg.Network.EndpointFor(id)))
	}
	if err := os.RemoveAll(dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// deleteContainer deletes container id from runsc; an error only when
// runsc failed and still knows the container.
func (r *Runtime) deleteContainer(ctx context.Context, id string) error {
	if err := r.runsc(ctx, nil, "delete", "--force", id); err != nil && r.known(ctx, id) {
		return fmt.Errorf("runsc delete: %w", err)
	}
	return nil
}

// release frees what container id, whose files are in dir, holds on the
// host besides its network and files: what a runsc create, restore or run
// cut short leaves (sandbox and gofer processes that runsc has no state
// for, which go by their command line), its cgroups, its control sockets.
// runsc must know the container no more (deleteContainer).
func (r *Runtime) release(id, dir string) []error {
	return []error{r.killStray(id, dir), r.removeCgroups(id), r.removeSockets(id)}
}

// List implements runtime.Runtime. Sandboxes whose directory exists but that
// runsc no longer knows (after a reboot, or a create cut short) are reported
// as stopped so that the caller destroys them.
func (r *Runtime) List(ctx context.Context) ([]runtime.Sandbox, error) {
	if err := r.ready(ctx); err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(r.cfg.StateDir)
	if err != nil {
		return nil, err
	}
	states, err := r.runscList(ctx)
	if err != nil {
		return nil, err
	}
	var out []runtime.Sandbox
	seen := map[string]bool{}
	for _, e := range ents {
		if !e.IsDir() || !validID(e.Name()) {
			continue
		}
		var st state
		sb := runtime.Sandbox{ID: e.Name(), State: runtime.StateStopped}
		if err := readJSON(filepath.Join(r.dir(e.Name()), "state.json"), &st); err == nil {
			sb.Addr, sb.Agent = st.Endpoint.Addr, agentAt(st.Endpoint.Addr)
			if err := r.cfg.Network.Attach(e.Name(), st.Endpoint, st.Egress); err != nil {
				r.cfg.Logger.Error("re-apply network policy", "sandbox", e.Name(), "err", err)
			}
		}
		if s, ok := states[e.Name()]; ok {
			sb.State = s
		}
		if st.Paused {
			sb.State = runtime.StatePaused
		}
		seen[e.Name()] = true
		out = append(out, sb)
	}
	return out, nil
}

var _ runtime.Stater = (*Runtime)(nil)

// State implements runtime.Stater: paused by its state.json, else what
// runsc says now.
func (r *Runtime) State(ctx context.Context, id string) (runtime.State, error) {
	if err := r.ready(ctx); err != nil {
		return "", err
	}
	st, err := r.readState(id)
	if err != nil {
		return "", err
	}
	if st.Paused {
		return runtime.StatePaused, nil
	}
	s, err := r.status(ctx, id)
	if err == nil && ctx.Err() != nil {
		// runsc state killed by the context says nothing of the sandbox.
		return "", ctx.Err()
	}
	return s, err
}

// runscQueryTimeout bounds one runsc state or list. Both ask each running
// sandbox's sentry over its control socket, so a sandbox whose processes
// are frozen or starved (SIGSTOP, a host under load) holds them for as
// long as it does not answer: such a sandbox must not stall the listing of
// the others, nor be taken for stopped.
var runscQueryTimeout = 10 * time.Second

// errNoAnswer is a runsc query that ran out of runscQueryTimeout: it says
// nothing of the sandbox's state.
var errNoAnswer = errors.New("runsc did not answer in time (the sandbox may be frozen or starved)")

// status reads one sandbox's state from runsc; errNoAnswer (with
// errdefs.ErrUnavailable) when runsc does not answer in time.
func (r *Runtime) status(ctx context.Context, id string) (runtime.State, error) {
	if _, err := os.Stat(r.dir(id)); err != nil {
		return "", fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	raw, ok, err := r.queryStatus(ctx, id)
	if err != nil {
		return "", err
	}
	if !ok {
		return runtime.StateStopped, nil
	}
	return mapStatus(raw), nil
}

// queryStatus is runsc state's word for container id: ok false when runsc
// does not know it; errNoAnswer when runsc does not answer in time, the
// caller's context error when that ends first.
func (r *Runtime) queryStatus(ctx context.Context, id string) (status string, ok bool, err error) {
	qctx, cancel := context.WithTimeout(ctx, runscQueryTimeout)
	defer cancel()
	var out bytes.Buffer
	if err := r.runCmd(r.command(qctx, &out, "state", id)); err != nil {
		switch {
		case ctx.Err() != nil:
			return "", false, ctx.Err()
		case qctx.Err() != nil:
			return "", false, fmt.Errorf("runsc state %s: %w: %w", id, errNoAnswer, errdefs.ErrUnavailable)
		}
		return "", false, nil
	}
	var s struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(out.Bytes(), &s); err != nil {
		return "", false, fmt.Errorf("runsc state: %w", err)
	}
	return s.Status, true, nil
}

// hasStateFile reports whether runsc keeps a state file for container id
// in its root (runsc's "<container>_sandbox:<sandbox>.state", which runsc
// delete removes): without one runsc knows no such container, and asking
// it (a runsc run) can be skipped.
func (r *Runtime) hasStateFile(id string) bool {
	ms, err := filepath.Glob(filepath.Join(r.cfg.RunscRoot, id+"_sandbox:*.state"))
	return err != nil || len(ms) > 0
}

func (r *Runtime) known(ctx context.Context, id string) bool {
	states, err := r.runscList(ctx)
	if err != nil {
		return true
	}
	_, ok := states[id]
	return ok
}

func (r *Runtime) runscList(ctx context.Context) (map[string]runtime.State, error) {
	raw, err := r.runscListRaw(ctx)
	if err != nil {
		return nil, err
	}
	m := make(map[string]runtime.State, len(raw))
	for id, s := range raw {
		m[id] = mapStatus(s)
	}
	return m, nil
}

// runscListRaw is runsc's own word for each container it has (see
// rawStatus), in one runsc run. When that run does not answer in time (a
// frozen sandbox holds it), each container of the state directory is asked
// on its own instead, and those that do not answer either are reported
// "running": nothing is ever judged stopped for not answering.
func (r *Runtime) runscListRaw(ctx context.Context) (map[string]string, error) {
	qctx, cancel := context.WithTimeout(ctx, runscQueryTimeout)
	defer cancel()
	var out bytes.Buffer
	if err := r.runCmd(r.command(qctx, &out, "list", "--format", "json")); err != nil {
		if ctx.Err() == nil && qctx.Err() != nil {
			r.cfg.Logger.Warn("runsc list did not answer in time: asking each sandbox", "timeout", runscQueryTimeout)
			return r.listEach(ctx)
		}
		return nil, fmt.Errorf("runsc list: %w", err)
	}
	var list []struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	}
	if s := bytes.TrimSpace(out.Bytes()); len(s) > 0 && !bytes.Equal(s, []byte("null")) {
		if err := json.Unmarshal(s, &list); err != nil {
			return nil, fmt.Errorf("runsc list: %w", err)
		}
	}
	m := make(map[string]string, len(list))
	for _, c := range list {
		m[c.ID] = c.Status
	}
	return m, nil
}

// listEach is runscListRaw one container at a time, several at once: the
// sandboxes and Run's containers of the state directory.
func (r *Runtime) listEach(ctx context.Context) (map[string]string, error) {
	var ids []string
	for _, dir := range []string{r.cfg.StateDir, filepath.Join(r.cfg.StateDir, runsDir)} {
		ents, err := os.ReadDir(dir)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		for _, e := range ents {
			if e.IsDir() && validID(e.Name()) {
				ids = append(ids, e.Name())
			}
		}
	}
	var (
		mu  sync.Mutex
		wg  sync.WaitGroup
		out = map[string]string{}
		sem = make(chan struct{}, 8)
	)
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			status, ok, err := r.queryStatus(ctx, id)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				r.cfg.Logger.Warn("runsc state gave no state: taking the sandbox for running", "sandbox", id, "err", err)
				status, ok = "running", true
			}
			if ok {
				mu.Lock()
				out[id] = status
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

func mapStatus(s string) runtime.State {
	switch s {
	case "created", "creating":
		return runtime.StateCreated
	case "running", "paused":
		return runtime.StateRunning
	default:
		return runtime.StateStopped
	}
}

func (r *Runtime) command(ctx context.Context, stdout *bytes.Buffer, args ...string) *exec.Cmd {
	// --allow-suid: set-user-ID programs (sudo, ping, passwd) work as in
	// any Linux, raising a user of the sandbox to the sandbox's root, who
	// is gVisor's guest like every other user of it.
	full := append([]string{"--root", r.cfg.RunscRoot, "--platform", r.cfg.Platform, "--allow-suid"}, args...)
	cmd := exec.CommandContext(ctx, r.cfg.Runsc, full...)
	// A runsc command dies with the server rather than finish a step that
	// the next server's recovery already judged.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if stdout != nil {
		cmd.Stdout = stdout
	}
	return cmd
}

// runCmd runs cmd to its end through the reaper, if there is one.
func (r *Runtime) runCmd(cmd *exec.Cmd) error {
	if r.cfg.Reaper == nil {
		return cmd.Run()
	}
	return r.cfg.Reaper.Run(cmd)
}

// runsc runs one runsc command; stdio, when given, becomes the stdout and
// stderr of the command (and so of a container it creates). An error carries
// what runsc printed (its stderr, or what it added to stdio) as its
// errdefs.Detailed cause: for the log, not the client.
func (r *Runtime) runsc(ctx context.Context, stdio *os.File, args ...string) error {
	cmd := r.command(ctx, nil, args...)
	var stderr bytes.Buffer
	var from int64
	if stdio != nil {
		cmd.Stdout, cmd.Stderr = stdio, stdio
		if fi, err := stdio.Stat(); err == nil {
			from = fi.Size()
		}
	} else {
		cmd.Stderr = &stderr
	}
	start := time.Now()
	err := r.runCmd(cmd)
	r.cfg.Logger.Debug("runsc", "args", strings.Join(args, " "), "took", time.Since(start), "err", err)
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if stdio != nil {
			msg = appended(stdio.Name(), from, 2048)
		}
		// runsc's output names host paths: the client reads only that
		// runsc failed.
		return errdefs.WithCause(errdefs.ErrUnavailable, "runsc failed (its output is in the server log)", fmt.Errorf("%w: %s", err, msg))
	}
	return nil
}

var _ runtime.OOMReporter = (*Runtime)(nil)

// OOMKilled implements runtime.OOMReporter from the sandbox's memory cgroup
// (cgroup v1 memory.oom_control, v2 memory.events).
func (r *Runtime) OOMKilled(id string) bool {
	for _, f := range []string{cgroupRoot + "/memory" + r.cgroupPath(id) + "/memory.oom_control", cgroupRoot + r.cgroupPath(id) + "/memory.events"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, " "); ok && k == "oom_kill" && v != "0" {
				return true
			}
		}
	}
	return false
}

// removeSockets removes the control socket files a runsc command cut short
// left for sandbox id, and runsc's lock files for it. runsc tries a fixed list of directories for them and
// fails once every one holds a stale file, which repeated crashes of the
// same sandbox's resume can bring about. Call it only when runsc has no
// container id.
func (r *Runtime) removeSockets(id string) error {
	var errs []error
	for _, dir := range []string{r.cfg.RunscRoot, "/var/run", "/run", "/tmp"} {
		if err := os.Remove(filepath.Join(dir, "runsc-"+id+".sock")); err != nil && !os.IsNotExist(err) {
			errs = append(errs, err)
		}
	}
	// runsc keeps an empty lock file per container after delete.
	locks, _ := filepath.Glob(filepath.Join(r.cfg.RunscRoot, id+"_*.lock"))
	for _, l := range locks {
		os.Remove(l)
	}
	return errors.Join(errs...)
}

// killStray kills the runsc processes of container id (files in dir) that
// runsc itself no longer knows, and waits for them to go.
func (r *Runtime) killStray(id, dir string) error {
	pids, err := stray.Kill("runsc", r.cfg.RunscRoot, dir+"/")
	if len(pids) > 0 {
		r.cfg.Logger.Warn("killed runsc processes left by an interrupted command", "sandbox", id, "pids", pids)
	}
	return err
}

// removeCgroups removes the sandbox's cgroup directories in every hierarchy
// (cgroup v1 has one per controller; v2 a single one). runsc removes them on
// delete; this covers a create that failed half-way.
func (r *Runtime) removeCgroups(id string) error {
	var errs []error
	for _, m := range CgroupDirs(cgroupRoot, r.cfg.CgroupParent, id) {
		if err := stray.RemoveDir(m); err != nil {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", m, err))
		}
	}
	return errors.Join(errs...)
}

func validID(id string) bool {
	if id == "" || len(id) > 63 {
		return false
	}
	for i, c := range id {
		switch {
		case c >= 'a' && c <= 'z':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

func diskMB(r runtime.Resources) int64 {
	if r.DiskMB > 0 {
		return r.DiskMB
	}
	return 10 * 1024
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// appended returns what path gained past offset from, at most its last n
// bytes.
func appended(path string, from, n int64) string {
	b, err := os.ReadFile(path)
	if err != nil || int64(len(b)) < from {
		return ""
	}
	b = b[from:]
	if int64(len(b)) > n {
		b = b[int64(len(b))-n:]
	}
	return strings.TrimSpace(string(b))
}

// agentAt is where the agent of the sandbox at addr listens.
func agentAt(addr netip.Addr) netip.AddrPort {
	return netip.AddrPortFrom(addr, agent.Port)
}
