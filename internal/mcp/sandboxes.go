package mcp

import (
	"context"
	"fmt"
	"net/http"
	"strconv"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/lizard-build/lizard/internal/apiclient"
)

// Sandbox lifetimes, in seconds. The API takes milliseconds up to
// 2^31-1; an agent's sandbox lives half an hour unless it says.
const (
	defaultLifetime = 1800
	maxLifetime     = 2147483
	maxFork         = 10
)

// sandboxRef names a sandbox.
type sandboxRef struct {
	SandboxID string `json:"sandboxId" jsonschema:"the sandbox's id (sandboxId of create_sandbox or list_sandboxes)"`
}

type pauseIn struct {
	SandboxID string `json:"sandboxId" jsonschema:"the sandbox's id (sandboxId of create_sandbox or list_sandboxes)"`
	FilesOnly bool   `json:"filesOnly,omitempty" jsonschema:"keep only its files: its processes end and resume_sandbox boots it afresh (default false: memory and processes are kept)"`
}

type createIn struct {
	Template       string            `json:"template,omitempty" jsonschema:"the template: base (Debian with a shell), python, node, code-interpreter-v1 (needed by run_code), desktop (needed by the desktop tools), or one of the project's own"`
	Size           string            `json:"size,omitempty" jsonschema:"the machine size: nano (0.5 vCPU, 1 GB), mini (1, 2 GB), small (2, 4 GB), medium (4, 8 GB), large (8, 16 GB), big (16, 32 GB)"`
	TimeoutSeconds int               `json:"timeoutSeconds,omitempty" jsonschema:"seconds until the sandbox is killed (0: never); set_sandbox_timeout changes it later"`
	Envs           map[string]string `json:"envs,omitempty" jsonschema:"environment variables of every command the sandbox runs"`
	InternetAccess *bool             `json:"internetAccess,omitempty" jsonschema:"false cuts the sandbox off the internet but for allowedHosts"`
	AllowedHosts   []string          `json:"allowedHosts,omitempty" jsonschema:"with internetAccess false: host names the sandbox may still reach (pypi.org, *.github.com)"`
	Metadata       map[string]string `json:"metadata,omitempty" jsonschema:"labels kept with the sandbox and shown in lists"`
}

type timeoutIn struct {
	SandboxID      string `json:"sandboxId" jsonschema:"the sandbox's id"`
	TimeoutSeconds int    `json:"timeoutSeconds" jsonschema:"seconds from now until the sandbox is killed (0: never)"`
}

type snapshotIn struct {
	SandboxID string `json:"sandboxId" jsonschema:"the sandbox's id"`
	Name      string `json:"name,omitempty" jsonschema:"a name for the snapshot"`
}

type restoreIn struct {
	SnapshotID     string `json:"snapshotId" jsonschema:"the snapshot's id (id of snapshot_sandbox)"`
	TimeoutSeconds int    `json:"timeoutSeconds,omitempty" jsonschema:"seconds until the new sandbox is killed (0: never)"`
}

type forkIn struct {
	SandboxID      string `json:"sandboxId" jsonschema:"the sandbox to copy"`
	Count          int    `json:"count,omitempty" jsonschema:"how many copies"`
	TimeoutSeconds int    `json:"timeoutSeconds,omitempty" jsonschema:"seconds until each copy is killed (0: never)"`
}

type exposeIn struct {
	SandboxID string `json:"sandboxId" jsonschema:"the sandbox's id"`
	Port      int    `json:"port" jsonschema:"the port a server listens on in the sandbox"`
}

func sandboxIDs(p props) { p.nonEmpty("sandboxId") }

func lifetime(name string) func(props) {
	return func(p props) {
		p.rangeOf(name, 0, maxLifetime)
		p.byDefault(name, defaultLifetime)
	}
}

func (t *tools) addSandboxTools(s *sdk.Server) {
	addTool(s, "create_sandbox", "Create a sandbox",
		"Create a sandbox from a template and return its info (sandboxId); it runs until its timeout (default 1800 s) or kill_sandbox.",
		adds, func(p props) {
			lifetime("timeoutSeconds")(p)
			p.byDefault("template", "base")
			p.enum("size", "nano", "mini", "small", "medium", "large", "big")
		}, t.createSandbox)
	addTool(s, "list_sandboxes", "List sandboxes",
		"List the project's sandboxes (running and paused) with their ids, templates, status and deadlines.",
		reads, nil, func(ctx context.Context, req *sdk.CallToolRequest, _ struct{}) (*sdk.CallToolResult, error) {
			return t.call(ctx, req, http.MethodGet, "/api/sandboxes", nil, "sandboxes")
		})
	addTool(s, "get_sandbox", "Sandbox info",
		"Get one sandbox's info: status, template, size, deadline, exposed ports and its latest CPU, memory and disk use.",
		reads, sandboxIDs, func(ctx context.Context, req *sdk.CallToolRequest, in sandboxRef) (*sdk.CallToolResult, error) {
			return t.call(ctx, req, http.MethodGet, apiclient.SandboxPath(in.SandboxID), nil, "sandbox")
		})
	addTool(s, "kill_sandbox", "Kill a sandbox",
		"Kill a sandbox: its processes, files and memory are gone (snapshot_sandbox first to keep them).",
		destroys, sandboxIDs, func(ctx context.Context, req *sdk.CallToolRequest, in sandboxRef) (*sdk.CallToolResult, error) {
			if _, err := t.call(ctx, req, http.MethodDelete, apiclient.SandboxPath(in.SandboxID), nil, ""); err != nil {
				return nil, err
			}
			return textResult(fmt.Sprintf("sandbox %s killed", in.SandboxID), nil), nil
		})
	addTool(s, "set_sandbox_timeout", "Set a sandbox's timeout",
		"Set how long from now a sandbox lives before it is killed (0: until kill_sandbox).",
		sets, func(p props) { sandboxIDs(p); p.rangeOf("timeoutSeconds", 0, maxLifetime) },
		func(ctx context.Context, req *sdk.CallToolRequest, in timeoutIn) (*sdk.CallToolResult, error) {
			body := map[string]int64{"timeoutMs": int64(in.TimeoutSeconds) * 1000}
			if _, err := t.call(ctx, req, http.MethodPost, apiclient.SandboxPath(in.SandboxID, "/timeout"), body, ""); err != nil {
				return nil, err
			}
			if in.TimeoutSeconds == 0 {
				return textResult(fmt.Sprintf("sandbox %s now lives until it is killed", in.SandboxID), nil), nil
			}
			return textResult(fmt.Sprintf("sandbox %s is killed in %d s", in.SandboxID, in.TimeoutSeconds), nil), nil
		})
	addTool(s, "pause_sandbox", "Pause a sandbox",
		"Pause a sandbox: its memory, processes and files are saved (with filesOnly, its files only) and it stops using CPU and memory until resume_sandbox.",
		sets, sandboxIDs, func(ctx context.Context, req *sdk.CallToolRequest, in pauseIn) (*sdk.CallToolResult, error) {
			var body any
			if in.FilesOnly {
				body = map[string]any{"memory": false}
			}
			return t.long(ctx, req, "pausing sandbox "+in.SandboxID, http.MethodPost, apiclient.SandboxPath(in.SandboxID, "/pause"), body, "sandbox")
		})
	addTool(s, "resume_sandbox", "Resume a sandbox",
		"Resume a paused sandbox where it was paused: same processes, files and id.",
		sets, sandboxIDs, func(ctx context.Context, req *sdk.CallToolRequest, in sandboxRef) (*sdk.CallToolResult, error) {
			return t.long(ctx, req, "resuming sandbox "+in.SandboxID, http.MethodPost, apiclient.SandboxPath(in.SandboxID, "/resume"), nil, "sandbox")
		})
	addTool(s, "snapshot_sandbox", "Snapshot a sandbox",
		"Save a running sandbox's memory, processes and files as a snapshot (it keeps running); restore_snapshot makes new sandboxes from it.",
		adds, sandboxIDs, func(ctx context.Context, req *sdk.CallToolRequest, in snapshotIn) (*sdk.CallToolResult, error) {
			body := map[string]string{}
			if in.Name != "" {
				body["name"] = in.Name
			}
			return t.long(ctx, req, "snapshotting sandbox "+in.SandboxID, http.MethodPost, apiclient.SandboxPath(in.SandboxID, "/snapshot"), body, "snapshot")
		})
	addTool(s, "restore_snapshot", "Restore a snapshot",
		"Create a new sandbox from a snapshot, as the snapshotted sandbox was (processes included); returns its info.",
		adds, func(p props) { p.nonEmpty("snapshotId"); lifetime("timeoutSeconds")(p) },
		func(ctx context.Context, req *sdk.CallToolRequest, in restoreIn) (*sdk.CallToolResult, error) {
			body := map[string]any{"snapshotId": in.SnapshotID, "timeoutMs": int64(in.TimeoutSeconds) * 1000}
			return t.long(ctx, req, "restoring snapshot "+in.SnapshotID, http.MethodPost, "/api/sandboxes", body, "sandbox")
		})
	addTool(s, "fork_sandbox", "Fork a sandbox",
		"Copy a running sandbox, processes and files included, into count new sandboxes; returns each copy's info or error.",
		adds, func(p props) {
			sandboxIDs(p)
			p.rangeOf("count", 1, maxFork)
			p.byDefault("count", 1)
			lifetime("timeoutSeconds")(p)
		},
		func(ctx context.Context, req *sdk.CallToolRequest, in forkIn) (*sdk.CallToolResult, error) {
			body := map[string]any{"count": in.Count, "timeoutMs": int64(in.TimeoutSeconds) * 1000}
			return t.long(ctx, req, "forking sandbox "+in.SandboxID, http.MethodPost, apiclient.SandboxPath(in.SandboxID, "/fork"), body, "forks")
		})
	addTool(s, "expose_port", "Expose a port",
		"Publish a port of the sandbox on the preview proxy and return its URL: open url (it carries the access token), or send the X-Lizard-Access-Token header to hostname.",
		sets, func(p props) { sandboxIDs(p); p.rangeOf("port", 1, 65535) },
		func(ctx context.Context, req *sdk.CallToolRequest, in exposeIn) (*sdk.CallToolResult, error) {
			return t.call(ctx, req, http.MethodPost, apiclient.SandboxPath(in.SandboxID, "/expose/", strconv.Itoa(in.Port)), nil, "port")
		})
}

func (t *tools) createSandbox(ctx context.Context, req *sdk.CallToolRequest, in createIn) (*sdk.CallToolResult, error) {
	body := map[string]any{"template": in.Template, "timeoutMs": int64(in.TimeoutSeconds) * 1000}
	if in.Size != "" {
		body["size"] = in.Size
	}
	if len(in.Envs) > 0 {
		body["envs"] = in.Envs
	}
	if len(in.Metadata) > 0 {
		body["metadata"] = in.Metadata
	}
	if in.InternetAccess != nil {
		body["internetAccess"] = *in.InternetAccess
	}
	if len(in.AllowedHosts) > 0 {
		body["allowedHosts"] = in.AllowedHosts
	}
	// A template's first sandbox may boot it and run its start command:
	// that can take a minute.
	return t.long(ctx, req, "creating a sandbox of template "+in.Template, http.MethodPost, "/api/sandboxes", body, "sandbox")
}

// call makes one API call and answers its JSON (nothing for a 204).
func (t *tools) call(ctx context.Context, req sdk.Request, method, path string, in any, key string) (*sdk.CallToolResult, error) {
	c, err := t.clientOf(req)
	if err != nil {
		return nil, err
	}
	raw, err := c.Call(ctx, method, path, in)
	if err != nil {
		return nil, err
	}
	if len(raw) == 0 {
		return &sdk.CallToolResult{Content: []sdk.Content{}}, nil
	}
	return jsonResult(raw, key)
}

// long is call for the calls that can take a while (a create, a pause, a
// snapshot): it reports progress while it waits.
func (t *tools) long(ctx context.Context, req *sdk.CallToolRequest, what, method, path string, in any, key string) (*sdk.CallToolResult, error) {
	p := startProgress(ctx, req, 0, what)
	defer p.end()
	return t.call(ctx, req, method, path, in, key)
}
