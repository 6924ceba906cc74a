// Package codeinterp ships the code-interpreter server that sandboxes of
// the template code-interpreter-v1 run: E2B's code-interpreter API on port
// 49999 and the Lizard SDK's on port 8080, one process and one set of
// contexts.
//
// The server is a Python program (server.py: asyncio, tornado and
// jupyter_client, all in the interpreter template) embedded in the lizard
// binary. The server writes it into its data directory under a name derived
// from its content (Revision), and the sandbox service bind-mounts that
// file read-only at SandboxPath in the sandboxes of code-interpreter-v1:
// templates stay made of Debian packages, and a new lizard brings its new
// server to the templates already built.
package codeinterp

import (
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"strconv"

	"github.com/lizard-build/lizard/internal/agent"
)

// Port is where the server listens inside the sandbox (E2B's JUPYTER_PORT).
const Port = 49999

// LizardPort is where the same server speaks the Lizard SDK's
// code-interpreter protocol (CodeSandbox of the Python SDK: /execute
// streaming stdout, stderr, result, error and done items, /contexts).
const LizardPort = 8080

// SandboxPath is where the program appears inside a code-interpreter-v1
// sandbox.
const SandboxPath = "/.lizard/code-interpreter.py"

// TokenFile is the file inside the sandbox whose content /execute requires
// as X-Access-Token: the envd access token of a secure sandbox, which the
// agent keeps there. While it does not exist, /execute is open, as E2B's is
// for sandboxes that are not secure.
const TokenFile = agent.EnvdTokenFile

//go:embed server.py
var program []byte

// Program returns the server's source.
func Program() []byte { return program }

// Revision is a short digest of the program: it changes whenever the
// program does, so what was made with an older one (a template's ready
// state) can be told apart.
func Revision() string {
	sum := sha256.Sum256(program)
	return hex.EncodeToString(sum[:])[:12]
}

// StartCommand is the start command of a template that serves the API.
func StartCommand() []string {
	return []string{"python3", SandboxPath, "--port", strconv.Itoa(Port), "--lizard-port", strconv.Itoa(LizardPort), "--token-file", TokenFile}
}

// ReadyCommand exits 0 once the server and its default Python kernel are
// up.
func ReadyCommand() []string {
	return []string{"curl", "-sf", "-o", "/dev/null", "http://127.0.0.1:" + strconv.Itoa(Port) + "/health"}
}
