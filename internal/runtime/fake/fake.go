// Package fake is an in-memory backend of runtime.Runtime for tests of the
// layers above it (the sandbox service, the API): it needs no root, no
// runsc and no kernel feature, and passes the runtimetest conformance suite
// with the capabilities it declares missing (runtimetest.Capabilities).
// Only tests may import it; no server wires it.
//
// Each sandbox is a real agent (package agent/server) served in the
// calling process on a loopback address of its own (127.x.y.z, a port of
// the kernel's choosing), so exec, files, processes and watches go through
// the real agent client. What the fake does not do:
//
//   - No isolation. Commands run on the host as the test's own user (what
//     asks for root runs as that user), see the host's files and hostname,
//     and have no resource limits; Spec.Resources, Egress and Mounts are
//     recorded, not applied. Each sandbox gets a directory of its own as
//     root's home and default working directory, and that directory is its
//     "filesystem": what Pause, Snapshot and Restore keep. A user other
//     than root is the host's, and file operations as such a user re-run
//     the test binary as the agent's file helper (server.FileOpCommand),
//     which the test's TestMain must then dispatch.
//   - Pause, Resume, Snapshot and Restore keep the home directory and the
//     agent's token, not processes or memory: Pause kills the sandbox's
//     processes, Resume starts a fresh agent over the kept files.
//   - Sandboxes live as long as the Runtime value: a "restarted server" is
//     a new sandbox.Service over the same Runtime.
//   - The agent's reaper makes the test process a child subreaper that
//     waits for every child: a test that also runs commands with os/exec
//     may find them already reaped.
//
// Crash stops a sandbox behind its caller's back, as a sandbox whose
// processes died would be.
package fake

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/lizard-build/lizard/internal/agent/server"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/network"
	"github.com/lizard-build/lizard/internal/runtime"
)

// Config configures a Runtime.
type Config struct {
	// Dir holds the sandboxes' directories; it is made if missing.
	Dir string
	// Logger receives the agents' logs; nil discards them.
	Logger *slog.Logger
}

// Runtime is the fake backend. It is safe for concurrent use.
type Runtime struct {
	cfg Config

	mu   sync.Mutex
	sbs  map[string]*sandbox
	next uint32 // the low 24 bits of the next loopback address
}

var (
	_ runtime.Runtime      = (*Runtime)(nil)
	_ runtime.FilesPauser  = (*Runtime)(nil)
	_ runtime.Checkpointer = (*Runtime)(nil)
	_ runtime.PauseImager  = (*Runtime)(nil)
	_ runtime.Stater       = (*Runtime)(nil)
	_ runtime.EgressSetter = (*Runtime)(nil)
)

// sandbox is one fake sandbox; its fields are guarded by Runtime.mu.
type sandbox struct {
	id    string
	state runtime.State
	addr  netip.Addr
	agent netip.AddrPort
	// tokenSum is the agent's token while it is not serving.
	tokenSum [sha256.Size]byte
	// bootSum is the token its agent boots with (its spec's): what a
	// files-only pause's resume answers to.
	bootSum [sha256.Size]byte
	srv     *server.Server // nil unless running
	hs      *http.Server   // nil unless running
	ln      net.Listener   // held from Create to Start, keeping the port
	egress  network.Egress // recorded, not applied
}

// New returns a Runtime keeping its sandboxes under cfg.Dir.
func New(cfg Config) (*Runtime, error) {
	if cfg.Dir == "" {
		return nil, fmt.Errorf("fake runtime: no directory: %w", errdefs.ErrInvalid)
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	// A random start keeps two runtimes (two test processes) on different
	// addresses; 127.0.x.y is left to the host.
	var b [3]byte
	rand.Read(b[:])
	b[0] = 1 + b[0]%254
	return &Runtime{cfg: cfg, sbs: map[string]*sandbox{}, next: uint32(b[0])<<16 | uint32(b[1])<<8 | uint32(b[2])}, nil
}

func (r *Runtime) dir(id string) string  { return filepath.Join(r.cfg.Dir, id) }
func (r *Runtime) home(id string) string { return filepath.Join(r.dir(id), "home") }

// PauseImage implements runtime.PauseImager: the image holds the home
// directory (home/) and, written last, the agent's token's digest as its
// runtime.ImageFile.
func (r *Runtime) PauseImage(id string) string { return filepath.Join(r.dir(id), "paused") }

func validID(id string) bool {
	if id == "" || id[0] < 'a' || id[0] > 'z' {
		return false
	}
	for _, c := range []byte(id) {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// Create implements runtime.Runtime.
func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) (runtime.Sandbox, error) {
	if spec.AgentToken == "" {
		return runtime.Sandbox{}, fmt.Errorf("sandbox %q: no agent token: %w", spec.ID, errdefs.ErrInvalid)
	}
	return r.create(spec, sha256.Sum256([]byte(spec.AgentToken)), "")
}

// create makes sandbox spec.ID answering to tokenSum, its home a copy of
// from ("" for an empty one).
func (r *Runtime) create(spec runtime.Spec, tokenSum [sha256.Size]byte, from string) (runtime.Sandbox, error) {
	if !validID(spec.ID) {
		return runtime.Sandbox{}, fmt.Errorf("sandbox id %q: lowercase letters and digits, starting with a letter: %w", spec.ID, errdefs.ErrInvalid)
	}
	if fi, err := os.Stat(spec.Rootfs); err != nil || !fi.IsDir() {
		return runtime.Sandbox{}, fmt.Errorf("sandbox %q: rootfs %q is not a directory: %w", spec.ID, spec.Rootfs, errdefs.ErrInvalid)
	}
	r.mu.Lock()
	if _, ok := r.sbs[spec.ID]; ok {
		r.mu.Unlock()
		return runtime.Sandbox{}, fmt.Errorf("sandbox %q: %w", spec.ID, errdefs.ErrConflict)
	}
	// Reserved under the lock, so that a concurrent Create of the id
	// conflicts; removed again if the rest fails.
	sb := &sandbox{id: spec.ID, state: runtime.StateCreated, tokenSum: tokenSum, egress: spec.Egress,
		bootSum: sha256.Sum256([]byte(spec.AgentToken))}
	r.sbs[spec.ID] = sb
	n := r.next
	r.next = (r.next + 1) % (254 << 16)
	r.mu.Unlock()

	fail := func(err error) (runtime.Sandbox, error) {
		os.RemoveAll(r.dir(spec.ID))
		r.mu.Lock()
		delete(r.sbs, spec.ID)
		r.mu.Unlock()
		return runtime.Sandbox{}, fmt.Errorf("sandbox %q: %w", spec.ID, err)
	}
	if err := os.Mkdir(r.dir(spec.ID), 0o755); err != nil {
		return fail(err)
	}
	var err error
	if from == "" {
		err = os.Mkdir(r.home(spec.ID), 0o755)
	} else {
		err = copyTree(from, r.home(spec.ID))
	}
	if err != nil {
		return fail(err)
	}
	addr := netip.AddrFrom4([4]byte{127, byte(1 + n>>16), byte(n >> 8), byte(n)})
	ln, err := net.Listen("tcp", netip.AddrPortFrom(addr, 0).String())
	if err != nil {
		return fail(fmt.Errorf("agent address: %w", err))
	}
	r.mu.Lock()
	sb.addr, sb.agent, sb.ln = addr, ln.Addr().(*net.TCPAddr).AddrPort(), ln
	if spec.Start && from == "" {
		if err := r.serve(sb); err != nil {
			r.mu.Unlock()
			ln.Close()
			return fail(err)
		}
	}
	out := sb.view()
	r.mu.Unlock()
	return out, nil
}

// SetEgress implements runtime.EgressSetter: it records the policy (see
// Egress); the fake applies none.
func (r *Runtime) SetEgress(ctx context.Context, id string, e network.Egress) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb, err := r.get(id)
	if err != nil {
		return err
	}
	sb.egress = e
	return nil
}

// Egress is the policy sandbox id was created or last set with.
func (r *Runtime) Egress(id string) (network.Egress, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb, ok := r.sbs[id]
	if !ok {
		return network.Egress{}, false
	}
	return sb.egress, true
}

func (sb *sandbox) view() runtime.Sandbox {
	return runtime.Sandbox{ID: sb.id, State: sb.state, Addr: sb.addr, Agent: sb.agent}
}

// get returns sandbox id; the caller holds r.mu.
func (r *Runtime) get(id string) (*sandbox, error) {
	sb, ok := r.sbs[id]
	if !ok {
		return nil, fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	return sb, nil
}

// Start implements runtime.Runtime. A stopped sandbox cannot be started
// again (errdefs.ErrConflict).
func (r *Runtime) Start(ctx context.Context, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb, err := r.moving(id, runtime.StateCreated, runtime.StateRunning)
	if sb == nil {
		return err
	}
	return r.serve(sb)
}

// serve starts sb's agent; the caller holds r.mu.
func (r *Runtime) serve(sb *sandbox) error {
	srv, err := server.New(server.Config{TokenSum: sb.tokenSum, Home: r.home(sb.id), Logger: r.cfg.Logger.With("sandbox", sb.id)})
	if err != nil {
		return fmt.Errorf("sandbox %q: agent: %w", sb.id, err)
	}
	ln := sb.ln
	sb.ln = nil
	if ln == nil {
		// After a pause: the same address and port again.
		if ln, err = net.Listen("tcp", sb.agent.String()); err != nil {
			return fmt.Errorf("sandbox %q: agent address: %w", sb.id, err)
		}
	}
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 30 * time.Second}
	go hs.Serve(ln)
	sb.srv, sb.hs, sb.state = srv, hs, runtime.StateRunning
	return nil
}

// halt ends sb's agent and its processes, keeping its token, and leaves it
// in state st; the caller holds r.mu.
func (sb *sandbox) halt(st runtime.State) {
	if sb.srv != nil {
		sb.tokenSum = sb.srv.TokenSum()
		sb.hs.Close()
		sb.srv.Kill()
		sb.srv, sb.hs = nil, nil
	}
	if sb.ln != nil {
		sb.ln.Close()
		sb.ln = nil
	}
	sb.state = st
}

// Stop implements runtime.Runtime.
func (r *Runtime) Stop(ctx context.Context, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb, err := r.get(id)
	if err != nil {
		return err
	}
	sb.halt(runtime.StateStopped)
	return nil
}

// Crash stops sandbox id as Stop does, as if its processes had died on
// their own: its caller is not told.
func (r *Runtime) Crash(id string) error { return r.Stop(context.Background(), id) }

// Destroy implements runtime.Runtime.
func (r *Runtime) Destroy(ctx context.Context, id string) error {
	r.mu.Lock()
	sb, ok := r.sbs[id]
	if ok {
		sb.halt(runtime.StateStopped)
		delete(r.sbs, id)
	}
	r.mu.Unlock()
	if err := os.RemoveAll(r.dir(id)); err != nil {
		return fmt.Errorf("sandbox %q: %w", id, err)
	}
	return nil
}

// List implements runtime.Runtime.
func (r *Runtime) List(ctx context.Context) ([]runtime.Sandbox, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]runtime.Sandbox, 0, len(r.sbs))
	for _, sb := range r.sbs {
		out = append(out, sb.view())
	}
	return out, nil
}

// State implements runtime.Stater.
func (r *Runtime) State(ctx context.Context, id string) (runtime.State, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb, err := r.get(id)
	if err != nil {
		return "", err
	}
	return sb.state, nil
}

// moving returns sandbox id when it is in state from, to be taken to state
// to; nil and no error when it is there already, nil and an error when it
// is missing or in another state. The caller holds r.mu.
func (r *Runtime) moving(id string, from, to runtime.State) (*sandbox, error) {
	sb, err := r.get(id)
	switch {
	case err != nil:
		return nil, err
	case sb.state == to:
		return nil, nil
	case sb.state != from:
		return nil, fmt.Errorf("sandbox %q is %s: %w", id, sb.state, errdefs.ErrConflict)
	}
	return sb, nil
}

// Pause implements runtime.Checkpointer: it moves the home directory into
// the pause image and kills the sandbox's processes.
func (r *Runtime) Pause(ctx context.Context, id string) error {
	return r.pause(id, false)
}

// filesMarker marks a pause image made by PauseFiles.
const filesMarker = "files-only"

// PauseFiles implements runtime.FilesPauser: the fake keeps no processes
// either way; its image is marked, and answers to the token the sandbox
// booted with.
func (r *Runtime) PauseFiles(ctx context.Context, id string) error {
	return r.pause(id, true)
}

// IsFilesImage implements runtime.FilesPauser.
func (r *Runtime) IsFilesImage(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, filesMarker))
	return err == nil
}

func (r *Runtime) pause(id string, files bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb, err := r.moving(id, runtime.StateRunning, runtime.StatePaused)
	if sb == nil {
		return err
	}
	image := r.PauseImage(id)
	if err := os.Mkdir(image, 0o755); err != nil {
		return fmt.Errorf("sandbox %q: pause image: %w", id, err)
	}
	sb.halt(runtime.StatePaused)
	err = os.Rename(r.home(id), filepath.Join(image, "home"))
	sum := sb.tokenSum
	if err == nil && files {
		sum = sb.bootSum
		err = os.WriteFile(filepath.Join(image, filesMarker), nil, 0o600)
	}
	if err == nil {
		if err = writeTokenSum(image, sum); err != nil {
			err = errors.Join(err, os.Rename(filepath.Join(image, "home"), r.home(id)))
		}
	}
	if err != nil {
		// A failed Pause leaves it running, with its files.
		os.RemoveAll(image)
		if serr := r.serve(sb); serr != nil {
			return errors.Join(err, serr)
		}
		return fmt.Errorf("sandbox %q: pause: %w", id, err)
	}
	return nil
}

// Resume implements runtime.Checkpointer: it brings the home directory
// back from the pause image (which may have been put there by someone
// else) and starts a fresh agent answering to the kept token.
func (r *Runtime) Resume(ctx context.Context, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb, err := r.moving(id, runtime.StatePaused, runtime.StateRunning)
	if sb == nil {
		return err
	}
	image := r.PauseImage(id)
	sum, err := readTokenSum(image)
	if err != nil {
		return fmt.Errorf("sandbox %q: pause image: %w", id, err)
	}
	if err := os.Rename(filepath.Join(image, "home"), r.home(id)); err != nil {
		return fmt.Errorf("sandbox %q: pause image: %w", id, err)
	}
	sb.tokenSum = sum
	if err := r.serve(sb); err != nil {
		// A failed Resume leaves it paused.
		return errors.Join(err, os.Rename(r.home(id), filepath.Join(image, "home")))
	}
	return os.RemoveAll(image)
}

// Snapshot implements runtime.Checkpointer: dir gets a copy of the home
// directory and the agent's token.
func (r *Runtime) Snapshot(ctx context.Context, id, dir string) (err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb, err := r.get(id)
	if err != nil {
		return err
	}
	if sb.state != runtime.StateRunning {
		return fmt.Errorf("sandbox %q is %s: %w", id, sb.state, errdefs.ErrConflict)
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("snapshot of %q: %w", id, err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("snapshot of %q: %s exists: %w", id, dir, errdefs.ErrConflict)
		}
		return fmt.Errorf("snapshot of %q: %w", id, err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	if err := copyTree(r.home(id), filepath.Join(dir, "home")); err != nil {
		return fmt.Errorf("snapshot of %q: %w", id, err)
	}
	if err := writeTokenSum(dir, sb.srv.TokenSum()); err != nil {
		return fmt.Errorf("snapshot of %q: %w", id, err)
	}
	return nil
}

// Restore implements runtime.Checkpointer: the copy's agent answers to the
// image's token, as a restored sandbox's does.
func (r *Runtime) Restore(ctx context.Context, spec runtime.Spec, dir string) (runtime.Sandbox, error) {
	sum, err := readTokenSum(dir)
	if err != nil {
		return runtime.Sandbox{}, fmt.Errorf("restore %q: image %s: %w", spec.ID, dir, err)
	}
	if r.IsFilesImage(dir) {
		sum = sha256.Sum256([]byte(spec.AgentToken)) // a boot
	}
	if _, err := r.create(spec, sum, filepath.Join(dir, "home")); err != nil {
		return runtime.Sandbox{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	sb, err := r.get(spec.ID)
	if err == nil {
		err = r.serve(sb)
	}
	if err != nil {
		if sb != nil {
			sb.halt(runtime.StateStopped)
		}
		delete(r.sbs, spec.ID)
		os.RemoveAll(r.dir(spec.ID))
		return runtime.Sandbox{}, err
	}
	return sb.view(), nil
}

// Leaks lists what sandbox id still holds: its entry, its directory, its
// agent's address.
func (r *Runtime) Leaks(id string) []string {
	var out []string
	r.mu.Lock()
	sb, ok := r.sbs[id]
	r.mu.Unlock()
	if ok {
		out = append(out, "sandbox "+id+" is still held")
		if c, err := net.DialTimeout("tcp", sb.agent.String(), time.Second); err == nil {
			c.Close()
			out = append(out, "agent still listening at "+sb.agent.String())
		}
	}
	if _, err := os.Lstat(r.dir(id)); err == nil {
		out = append(out, "directory "+r.dir(id))
	}
	return out
}

func writeTokenSum(dir string, sum [sha256.Size]byte) error {
	return os.WriteFile(filepath.Join(dir, runtime.ImageFile), []byte(hex.EncodeToString(sum[:])), 0o600)
}

func readTokenSum(dir string) ([sha256.Size]byte, error) {
	var sum [sha256.Size]byte
	b, err := os.ReadFile(filepath.Join(dir, runtime.ImageFile))
	if errors.Is(err, fs.ErrNotExist) {
		return sum, fmt.Errorf("no %s: %w", runtime.ImageFile, errdefs.ErrNotFound)
	}
	if err != nil {
		return sum, err
	}
	if n, err := hex.Decode(sum[:], b); err != nil || n != len(sum) {
		return sum, fmt.Errorf("%s is not a SHA-256: %w", runtime.ImageFile, errdefs.ErrInvalid)
	}
	return sum, nil
}

// copyTree copies directory from to to (which must not exist): files,
// directories and symlinks, with their modes. It runs no program (cp), as
// the agent's reaper would take its exit status.
func copyTree(from, to string) error {
	return filepath.WalkDir(from, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(from, p)
		if err != nil {
			return err
		}
		dst := filepath.Join(to, rel)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return os.Mkdir(dst, fi.Mode().Perm())
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(target, dst)
		case fi.Mode().IsRegular():
			return copyFile(p, dst, fi.Mode().Perm())
		}
		return nil // sockets, fifos: not kept
	})
}

func copyFile(from, to string, mode fs.FileMode) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_EXCL|os.O_WRONLY, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
