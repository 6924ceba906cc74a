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
}

// State is what a backend knows of a sandbox.
type State string

const (
	StateCreated State = "created" // created, agent not started
	StateRunning State = "running"
	StateStopped State = "stopped" // its processes are gone; resources held until Destroy
)

// Sandbox is a backend's view of one sandbox.
type Sandbox struct {
	ID    string
	State State
	// Addr is the sandbox's private address; the agent listens on it.
	Addr netip.Addr
}

// Runtime is an isolation backend. Implementations are safe for concurrent
// use on different ids; calls for the same id are serialized by the caller.
type Runtime interface {
	// Create prepares a sandbox (filesystem, network, resource limits) and its
	// init process, the agent, without starting it. A second Create of an id
	// that exists fails with errdefs.ErrConflict. A failed Create leaves
	// nothing behind.
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
