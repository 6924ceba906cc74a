// Package runtime is the contract between the sandbox service and an
// isolation backend: it creates, starts, stops and destroys sandboxes and
// lists the ones it holds so that a restarted server can reattach. Commands
// and files do not go through it: they go to the agent (package agent) at the
// address a backend reports. Backends live in subpackages (gvisor) and must
// pass the conformance suite in runtimetest.
package runtime

import (
	"context"
	"net/netip"
	"os"

	"github.com/lizard-build/lizard/internal/network"
)

// Resources caps what a sandbox may use.
type Resources struct {
	CPUs     float64 // CPU quota in cores (0.5 = half a core)
	MemoryMB int64   // memory limit
	Pids     int64   // process limit
	DiskMB   int64   // size of the writable layer over the template
}

// Spec describes a sandbox to create.
type Spec struct {
	// ID names the sandbox; it is also its hostname. Lowercase letters and
	// digits, starting with a letter.
	ID string
	// Rootfs is the absolute path of the template's root filesystem. It is
	// never written: the sandbox sees it under a private writable layer.
	Rootfs string
	// AgentToken is the secret the sandbox's agent requires on every request.
	AgentToken string
	Resources  Resources
	// Egress is what the sandbox may reach outside the host; the zero value
	// is anything.
	Egress network.Egress
	// Mounts are host files or directories bind-mounted into the sandbox
	// (volumes, programs a template runs). A restore must be given the
	// mounts the checkpoint was taken with (runsc compares them).
	Mounts []Mount
	// Start makes Create start the sandbox too, as Start right after it
	// would, in one step where the backend can (the gVisor backend's one
	// runsc run instead of a create and a start): the Sandbox it returns
	// is running. Restore ignores it (a restore always starts).
	Start bool
}

// Mount is a host file or directory seen inside a sandbox.
type Mount struct {
	Source      string // absolute host path
	Destination string // absolute path in the sandbox
	ReadOnly    bool   // false: read-write
}

// State is what a backend knows of a sandbox.
type State string

const (
	StateCreated State = "created" // created, agent not started
	StateRunning State = "running"
	StateStopped State = "stopped" // its processes are gone; resources held until Destroy
	// StatePaused: checkpointed by Pause; no processes, no memory, its
	// network and image kept until Resume or Destroy.
	StatePaused State = "paused"
)

// Sandbox is a backend's view of one sandbox.
type Sandbox struct {
	ID    string
	State State
	// Addr is the sandbox's private address: its servers' ports are
	// reached on it.
	Addr netip.Addr
	// Agent is where the sandbox's agent listens (gVisor: Addr and
	// agent.Port). It stays the same while the sandbox exists, across
	// Stop, Pause and Resume.
	Agent netip.AddrPort
}

// Runtime is an isolation backend. Implementations are safe for concurrent
// use on different ids; calls for the same id are serialized by the caller.
type Runtime interface {
	// Create prepares a sandbox (filesystem, network, resource limits) and its
	// init process, the agent, without starting it unless spec.Start. A
	// second Create of an id that exists fails with errdefs.ErrConflict. A
	// failed Create leaves nothing behind, a started one included.
	Create(ctx context.Context, spec Spec) (Sandbox, error)
	// Start runs the agent of a created sandbox. Start of a running sandbox
	// is a no-op; of an unknown id, errdefs.ErrNotFound.
	Start(ctx context.Context, id string) error
	// Stop kills every process of the sandbox but keeps what it holds until
	// Destroy. Stop of a stopped sandbox is a no-op; of an unknown id,
	// errdefs.ErrNotFound.
	Stop(ctx context.Context, id string) error
	// Destroy kills the sandbox and frees everything it held: processes,
	// mounts, cgroups, network namespace and veth, files. It is idempotent:
	// an unknown id is not an error. It keeps going after a step fails and
	// reports every failure.
	Destroy(ctx context.Context, id string) error
	// List returns every sandbox the backend holds, including ones created by
	// an earlier process of the server, with their current state.
	List(ctx context.Context) ([]Sandbox, error)
}

// Checkpointer is implemented by backends that can save a sandbox whole —
// memory, running processes, open files and its writable layer — and bring
// it back, in place or as new sandboxes. The sandbox service finds it by type
// assertion.
// ImageFile is the file of a Checkpointer's image directory (Snapshot's
// dir) that holds the checkpoint itself: a directory without it is not an
// image (a Snapshot that crashed half-way), and is never restored.
const ImageFile = "checkpoint.img"

type Checkpointer interface {
	// Pause checkpoints the running sandbox to the backend's own storage and
	// frees its processes and memory; List then reports it paused. A failed
	// Pause leaves it running. Pause of a paused sandbox is a no-op; of an
	// unknown id, errdefs.ErrNotFound.
	Pause(ctx context.Context, id string) error
	// Resume restores a paused sandbox in place: same processes and pids,
	// same files, same network identity. Resume of a running sandbox is a
	// no-op. A failed Resume leaves it paused.
	Resume(ctx context.Context, id string) error
	// Snapshot writes the running sandbox's state into dir (which must not
	// exist) after a brief freeze; the sandbox keeps running. A failed
	// Snapshot removes dir and leaves the sandbox running.
	Snapshot(ctx context.Context, id, dir string) error
	// Restore creates sandbox spec.ID from the image in dir and starts it:
	// the image's processes and files with spec's identity (hostname, network
	// address, resources). One image can be restored any number of times,
	// also concurrently; the copies share nothing. A failed Restore leaves
	// nothing behind, as a failed Create.
	Restore(ctx context.Context, spec Spec, dir string) (Sandbox, error)
}

// FilesPauser is implemented by Checkpointers that can also pause a
// sandbox keeping its files only (E2B's keepMemory false): nothing of its
// memory or processes is saved, so the image is as small as what the
// sandbox wrote, and a resume boots it afresh over its files.
type FilesPauser interface {
	// PauseFiles saves the running sandbox's writable layer (what it
	// wrote over its root filesystem, deletions included) as its pause
	// image and ends its processes, freeing its memory; List then reports
	// it paused. Resume of it boots it: its init, the agent, answering to
	// the token it was created with, over its root filesystem plus that
	// layer, with the same network identity and mounts. Restore of a copy
	// of that image (IsFilesImage) boots sandbox spec.ID the same way,
	// its agent answering to spec.AgentToken. A failed PauseFiles leaves
	// the sandbox running. PauseFiles of a paused sandbox is a no-op; of
	// an unknown id, errdefs.ErrNotFound.
	PauseFiles(ctx context.Context, id string) error
	// IsFilesImage reports whether the image in dir was made by
	// PauseFiles (a restore of it boots) rather than by Pause.
	IsFilesImage(dir string) bool
}

// PauseImager is implemented by Checkpointers whose pause image is a
// directory of plain files: the sandbox service makes it durable in an
// object store after Pause and, when it is missing (the node lost it, or
// the sandbox comes from another node), downloads it there before Resume.
type PauseImager interface {
	// PauseImage is the directory Pause writes sandbox id's image into and
	// Resume reads it from. It exists only while the sandbox is paused.
	PauseImage(id string) string
}

// RunSpec is a command to run to its end in a container of its own (see
// Runner): a template build's step.
type RunSpec struct {
	// ID names the container while it runs; as Spec.ID. It must not be a
	// sandbox's.
	ID string
	// Rootfs is the absolute path of the container's root, which it
	// writes in place: what the command writes stays there.
	Rootfs   string
	Hostname string // "" is ID
	// The command, its environment, working directory and user.
	Args     []string
	Env      []string
	Cwd      string
	UID, GID uint32
	// Resources caps the container: CPUs 0 is no CPU quota; DiskMB does
	// not apply (the rootfs is written in place).
	Resources Resources
	Mounts    []Mount
	// Network is the network the container gets an address on (its own
	// namespace and veth, as a sandbox on the runtime's), with the gateway
	// as its nameserver; its egress policy is the network's.
	Network *network.Manager
	// Output gets the command's stdout and stderr as it writes them;
	// open it with O_APPEND (the two streams share it).
	Output *os.File
}

// Runner is implemented by backends that can run one command to its end in
// a container of its own, outside their sandboxes: template builds run
// their steps with it, so that there is one way to run a container.
type Runner interface {
	// Run runs spec's command and returns its exit status once it ends
	// (128+n when signal n killed it). A command that cannot start (no
	// such program, a bad spec) is an errdefs.ErrInvalid error naming why;
	// other failures of the backend are errors too. Cancelling ctx kills
	// the command. Run leaves nothing behind but what the command wrote
	// to spec.Rootfs and spec.Output.
	Run(ctx context.Context, spec RunSpec) (exitCode int, err error)
}

// EgressSetter is implemented by backends that can change what a sandbox
// may reach while it exists (E2B's updateNetwork).
type EgressSetter interface {
	// SetEgress replaces sandbox id's egress policy, running or paused:
	// new connections follow it once SetEgress returns (connections
	// already made keep going), and a resume or a restart of the server
	// keeps it. An unknown id is errdefs.ErrNotFound; a failed SetEgress
	// leaves the old policy.
	SetEgress(ctx context.Context, id string, e network.Egress) error
}

// Stater is implemented by backends that can tell one sandbox's state on
// its own, as it is at the time of the call (a listing may be older than a
// sandbox made while it was taken).
type Stater interface {
	// State is sandbox id's state now; errdefs.ErrNotFound when the backend
	// has no such sandbox.
	State(ctx context.Context, id string) (State, error)
}

// OOMReporter is implemented by backends that can tell whether the kernel
// killed a sandbox's processes for running out of memory.
type OOMReporter interface {
	// OOMKilled says whether sandbox id had a process killed for memory.
	// It must be asked before Destroy, which forgets the sandbox.
	OOMKilled(id string) bool
}

// Usage is what a running sandbox uses now: counters since it started
// (CPU time, network bytes) and current amounts (memory, disk).
type Usage struct {
	CPUNanos    uint64
	MemoryBytes int64
	MemoryLimit int64 // 0: none
	DiskBytes   int64 // its writable layer on the host's disk
	DiskLimit   int64 // 0: none
	RxBytes     uint64
	TxBytes     uint64
}

// UsageReporter is implemented by backends that can tell what a sandbox
// uses (its cgroup, its network interface, its writable layer).
type UsageReporter interface {
	// Usage reports a running sandbox's usage; an unknown or stopped id
	// is an error.
	Usage(id string) (Usage, error)
}
