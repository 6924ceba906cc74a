package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"runtime/debug"

	"github.com/lizard-build/lizard/internal/apiclient"
	"github.com/lizard-build/lizard/internal/mcp"
)

const mcpUsage = `usage: lizard mcp
  serves MCP (the Model Context Protocol) over stdin and stdout, for agents such as Claude
  Desktop and Claude Code: sandboxes as tools, on the API at $LIZARD_API_URL (default ` + defaultAPIURL + `)
  with the key $LIZARD_API_KEY. A lizard server serves the same over HTTP at /mcp.`

// mcpCmd is `lizard mcp`: the MCP server over stdio, a client of a lizard
// server's HTTP API. Its log goes to stderr, which MCP clients show.
func mcpCmd(ctx context.Context, args []string) error {
	if len(args) > 0 {
		if args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
			fmt.Println(mcpUsage)
			return nil
		}
		return fmt.Errorf("lizard mcp takes no arguments\n%s", mcpUsage)
	}
	c, err := newAPIClient()
	if err != nil {
		return err
	}
	// A key the server refuses would fail every tool: say so at once,
	// where the agent's MCP log shows it. A server that does not answer
	// yet may later; its tools say so until then.
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if _, err := c.Call(ctx, http.MethodGet, "/api/projects", nil); err != nil {
		var ae *apiclient.Error
		if errors.As(err, &ae) && ae.Status == http.StatusUnauthorized {
			return fmt.Errorf("LIZARD_API_KEY is refused by %s: %w", c.Base(), err)
		}
		log.Warn("the lizard API does not answer (yet)", "url", c.Base(), "err", err)
	}
	return mcp.ServeStdio(ctx, c, lizardVersion(), log)
}

// lizardVersion is this binary's version: its module version and VCS
// revision as the Go toolchain recorded them.
func lizardVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			v += "+" + s.Value[:12]
		}
	}
	return v
}
