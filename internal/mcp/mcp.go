// Package mcp is lizard's Model Context Protocol server: sandboxes as tools
// and resources for agents (Claude Desktop and Code, Cursor, the OpenAI
// Agents SDK, …), on the official Go SDK. It is served two ways: over stdio
// by `lizard mcp`, for desktop agents, talking to a lizard server over its
// HTTP API (ServeStdio), and as Streamable HTTP at /mcp on the API listener
// (Handler), where the tools call the server's own API handler in-process
// with the credentials of the request that carries the call. Either way a
// tool is a client of the HTTP API (internal/apiclient), like the SDKs, the
// CLI and the dashboard: there is no second way into the sandbox service,
// so a key sees exactly what it sees on the API and every answer, error
// included, is the API's. Only cmd/lizard wires it.
package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/lizard-build/lizard/internal/apiclient"
)

// Name is the server's name in the MCP handshake.
const Name = "lizard"

// instructions tell the agent how the tools fit together.
const instructions = `lizard runs sandboxes: isolated Linux machines (gVisor) made from templates. ` +
	`Create one with create_sandbox (template "base" for a shell, "python", "node", "code-interpreter-v1" for run_code, "desktop" for the desktop tools), ` +
	`then use its sandboxId with the other tools. run_command runs a shell command to its end; start_command starts one in the background ` +
	`(a server, a long build) whose output read_command_output reads later. Files: read_file, write_file, list_directory, and the resources ` +
	`lizard://sandboxes/{id}/files/{path} and lizard://sandboxes/{id}/logs. expose_port gives a URL for a server in the sandbox. ` +
	`A sandbox is killed at its timeout (create_sandbox's timeoutSeconds, set_sandbox_timeout); kill_sandbox when done.`

// ClientFunc returns the API client that serves a request: one with the
// credentials the request came with (HTTP), or the server's own (stdio).
type ClientFunc func(extra *sdk.RequestExtra) (*apiclient.Client, error)

// Config configures the MCP server.
type Config struct {
	// Client returns the API client of a request.
	Client ClientFunc
	// Version is the server's version in the MCP handshake.
	Version string
	// Logger logs the SDK's server activity; nil logs nothing.
	Logger *slog.Logger
}

// NewServer returns the MCP server with every tool and resource.
func NewServer(cfg Config) *sdk.Server {
	s := sdk.NewServer(&sdk.Implementation{Name: Name, Title: "lizard sandboxes", Version: cfg.Version}, &sdk.ServerOptions{
		Instructions: instructions,
		Logger:       cfg.Logger,
		// Tools and resources never change while the server runs.
		Capabilities: &sdk.ServerCapabilities{
			Tools:     &sdk.ToolCapabilities{},
			Resources: &sdk.ResourceCapabilities{},
		},
	})
	t := &tools{client: cfg.Client}
	t.addSandboxTools(s)
	t.addCommandTools(s)
	t.addFileTools(s)
	t.addCodeTools(s)
	t.addDesktopTools(s)
	t.addResources(s)
	return s
}

// tools are the tool and resource handlers: each finds the request's API
// client and calls the API.
type tools struct {
	client ClientFunc
}

// clientOf is the API client of a request.
func (t *tools) clientOf(req sdk.Request) (*apiclient.Client, error) {
	if t.client == nil {
		return nil, errors.New("no API client configured")
	}
	return t.client(req.GetExtra())
}

// jsonResult answers a tool call with the API's JSON: as text for the
// model, and as structured content (an object: a list is wrapped under
// key) for programs.
func jsonResult(raw json.RawMessage, key string) (*sdk.CallToolResult, error) {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, fmt.Errorf("the API's answer is not JSON: %w", err)
	}
	if _, ok := v.(map[string]any); !ok {
		v = map[string]any{key: v}
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return nil, err
	}
	return &sdk.CallToolResult{
		Content:           []sdk.Content{&sdk.TextContent{Text: string(b)}},
		StructuredContent: v,
	}, nil
}

// textResult answers a tool call with text and, when v is not nil, v as
// structured content.
func textResult(text string, v any) *sdk.CallToolResult {
	return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: text}}, StructuredContent: v}
}

// detached is a context for the clean-up a cancelled call still owes (a
// command to kill): not cancelled with ctx, bounded.
func detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
}
