package api

import (
	"context"
	"time"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/egress"
	"github.com/lizard-build/lizard/internal/network"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/sandbox/desktop"
	"github.com/lizard-build/lizard/internal/sandbox/netconf"
	"github.com/lizard-build/lizard/internal/sandbox/preview"
	"github.com/lizard-build/lizard/internal/sandbox/schedule"
	"github.com/lizard-build/lizard/internal/sandbox/snapshot"
	"github.com/lizard-build/lizard/internal/sandbox/usage"
)

// What the API calls of the sandbox service (*sandbox.Service) and its
// feature packages, by concern. The E2B edge (internal/e2b) calls Lifecycle and Usages too.

// Lifecycle makes, finds, ends and pauses sandboxes.
type Lifecycle interface {
	Create(ctx context.Context, req sandbox.CreateRequest) (sandbox.Record, error)
	Get(projectID, id string) (sandbox.Record, error)
	List(projectID string) []sandbox.Record
	Kill(ctx context.Context, projectID, id string) error
	SetTimeout(ctx context.Context, projectID, id string, timeoutMs int64) error
	Pause(ctx context.Context, projectID, id string) error
	PauseFiles(ctx context.Context, projectID, id string) error
	Resume(ctx context.Context, projectID, id string) (sandbox.Record, error)
}

// Usages are a sandbox's samples of CPU, memory, disk and network use.
type Usages interface {
	Usage(projectID, id string, start, end time.Time) ([]usage.Sample, error)
	LatestUsage(id string) (usage.Sample, bool)
}

// Agents runs commands and file operations in a running sandbox (Wake:
// one made with autoResume is resumed by the request first).
type Agents interface {
	Wake(ctx context.Context, projectID, id string) (*agent.Client, sandbox.Record, error)
	Exec(ctx context.Context, projectID, id string, req sandbox.ExecRequest, onEvent func(agent.Event) error) error
	StartProcess(ctx context.Context, projectID, id string, req agent.StartRequest) (*agent.Client, int, error)
}

// Snapshots takes, lists, changes and deletes snapshots
// (*snapshot.Manager).
type Snapshots interface {
	Take(ctx context.Context, projectID, id, name string, poolSize int) (snapshot.Info, error)
	List(projectID string) []snapshot.Info
	Get(projectID, id string) (snapshot.Info, error)
	Update(ctx context.Context, projectID, id string, poolSize *int, poolPaused *bool) (snapshot.Info, error)
	Delete(ctx context.Context, projectID, id string) error
}

// Copies starts sandboxes from saved ones: restores of snapshots and
// forks (*snapshot.Manager).
type Copies interface {
	Restore(ctx context.Context, projectID, snapID string, timeoutMs int64) (sandbox.Record, error)
	Fork(ctx context.Context, projectID, id string, count int, timeoutMs int64) ([]snapshot.ForkResult, error)
}

// Ports opens and closes a sandbox's ports to previews
// (*preview.Service).
type Ports interface {
	Expose(ctx context.Context, projectID, id string, port int, opts ...preview.ExposeOption) (string, error)
	Unexpose(ctx context.Context, projectID, id string, port int) error
}

// Desktops starts, reads and stops a sandbox's desktop (*desktop.Service).
type Desktops interface {
	State(ctx context.Context, projectID, id string) (desktop.Desktop, error)
	Start(ctx context.Context, projectID, id string, size desktop.Size) (desktop.Desktop, error)
	Stop(ctx context.Context, projectID, id string) error
}

// Schedules keeps and runs sandboxes' schedules (*schedule.Service).
type Schedules interface {
	Create(ctx context.Context, projectID, sandboxID string, p schedule.Patch) (schedule.View, error)
	// OfSandbox lists one sandbox's schedules; an unknown sandbox is not
	// found.
	OfSandbox(ctx context.Context, projectID, sandboxID string) ([]schedule.View, error)
	List(ctx context.Context, projectID, sandboxID string) ([]schedule.View, error)
	Get(ctx context.Context, projectID, id string) (schedule.View, error)
	Update(ctx context.Context, projectID, id string, p schedule.Patch) (schedule.View, error)
	Delete(ctx context.Context, projectID, id string) error
	RunNow(ctx context.Context, projectID, id string) (schedule.View, error)
	Runs(ctx context.Context, projectID, id string, limit int) ([]schedule.RunView, error)
}

// Networks reads and replaces a sandbox's network configuration and reads
// its egress log (*netconf.Service).
type Networks interface {
	// Check refuses a new sandbox's configuration naming a secret the
	// project lacks or a workload token not in tokens.
	Check(ctx context.Context, projectID string, e network.Egress, tokens []string) error
	Network(projectID, id string) (network.Egress, error)
	SetNetwork(ctx context.Context, projectID, id string, e network.Egress) (network.Egress, error)
	Log(projectID, id string) ([]egress.Entry, error)
}

// Logs reads and follows a sandbox's log.
type Logs interface {
	// Get answers whether the sandbox is there before a stream begins.
	Get(projectID, id string) (sandbox.Record, error)
	LogTail(ctx context.Context, projectID, id string, tail int) ([]sandbox.LogLine, error)
	Logs(ctx context.Context, projectID, id string, tail int, fn func(sandbox.LogLine) error) error
}

// Sandboxes is what Config.Sandboxes must be: the core's concerns above.
// Usages, Snapshots, Copies, Ports, Desktops and Networks are the feature
// packages', in Config fields of their own.
type Sandboxes interface {
	Lifecycle
	Agents
	Logs
}

var (
	_ Sandboxes = (*sandbox.Service)(nil)
	_ Snapshots = (*snapshot.Manager)(nil)
	_ Copies    = (*snapshot.Manager)(nil)
	_ Usages    = (*usage.Sampler)(nil)
	_ Ports     = (*preview.Service)(nil)
	_ Desktops  = (*desktop.Service)(nil)
	_ Schedules = (*schedule.Service)(nil)
	_ Networks  = (*netconf.Service)(nil)
)
