package e2e

import (
	"context"
	"path/filepath"
	"testing"
	"time"
)

// TestMCP drives the MCP server with the official TypeScript MCP client
// (@modelcontextprotocol/sdk, js/mcp/*.test.mjs) over Streamable HTTP (/mcp
// on the API listener) and over stdio (`lizard mcp` spawned by the client
// with LIZARD_API_URL and LIZARD_API_KEY): tools and schemas, files and
// python3, the code interpreter's contexts and charts, a port exposed and
// fetched, keys (a wrong one, another project's), progress and
// cancellation. Needs the python, interpreter and desktop templates.
func TestMCP(t *testing.T) {
	s := startServer(t, "")
	s.cli(t, "projects", "create", "MCP Other")
	other := s.newKey(t, "mcp-other")
	files := jsFiles("js/mcp/*.test.mjs")
	if len(files) == 0 {
		t.Fatal("no MCP test files")
	}
	ctx, cancel := context.WithTimeout(context.Background(), budget(15*time.Minute))
	defer cancel()
	env := []string{"LIZARD_BIN=" + filepath.Join(s.bin, "lizard"), "LIZARD_OTHER_KEY=" + other}
	if err := s.runNodeEnv(ctx, env, files...); err != nil {
		t.Fatalf("MCP tests failed: %v", err)
	}
	s.waitNoLeaks(t)
}
