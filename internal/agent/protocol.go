// Package agent is the contract between the lizard node and lizard-agent, the
// PID 1 of every sandbox: the wire protocol's types (this file), the host-side
// Client, and (in subpackage server) the in-sandbox implementation.
//
// # Protocol
//
// The agent listens on TCP port Port on every address of the sandbox. Each
// request carries the per-sandbox token in header TokenHeader; a request
// without the right token gets 401. Bodies are JSON unless said otherwise.
// Errors are JSON Error with status 400 (invalid), 401, 403 (permission),
// 404 (not found), 409 (conflict), 413 (too large) or 500.
//
//	GET    /health                        → 200 Health
//	POST   /token         TokenRequest    → 204; from then on only the new
//	                                        token is accepted
//	POST   /exec          ExecRequest     → 200, NDJSON stream of Event:
//	                                        {pid} first, then {stream,line}
//	                                        per output line, {exitCode} last.
//	GET    /processes                     → []Process (exec-started, running)
//	POST   /processes/signal SignalRequest → 204
//	GET    /files?path=&user=             → raw bytes of a regular file
//	PUT    /files?path=&user=   raw bytes → 204; parents created, owned by user
//	DELETE /files?path=&user=             → 204; directories recursively
//	GET    /files/list?path=&user=        → []FileEntry
//	GET    /files/stat?path=&user=        → FileStat (lstat: symlinks not followed)
//	POST   /files/move    MoveRequest     → 204; destination parents created
//
// user is a name from the sandbox's /etc/passwd; empty means root. File
// operations run with that user's uid, gid and groups, so the sandbox's own
// permission checks apply.
package agent

// Port is the agent's TCP port inside every sandbox.
const Port = 49983

// TokenHeader carries the per-sandbox agent token.
const TokenHeader = "X-Lizard-Agent-Token"

// Environment variables the agent reads at boot; it removes them from the
// environment that commands inherit.
const (
	EnvToken = "LIZARD_AGENT_TOKEN"
)

// Health is the answer to GET /health.
type Health struct {
	OK bool `json:"ok"`
	// Pid is the agent's own pid (1 when it is the sandbox's init).
	Pid int `json:"pid"`
}

// ExecRequest starts one command.
type ExecRequest struct {
	// Cmd is the argv. When Shell is true, Cmd must have one element: a script
	// run as /bin/sh -c Cmd[0]. Otherwise Cmd[0] is looked up in PATH.
	Cmd   []string `json:"cmd"`
	Shell bool     `json:"shell,omitempty"`
	// Env is added to (and overrides) the default environment: PATH, HOME,
	// USER, LOGNAME, SHELL, LANG and TERM of the user.
	Env map[string]string `json:"env,omitempty"`
	// User runs the command as this user; "" means root.
	User string `json:"user,omitempty"`
	// Workdir is the working directory; "" means the user's home (or / when
	// it does not exist).
	Workdir string `json:"workdir,omitempty"`
	// TimeoutMs kills the command's whole process tree after this long; 0
	// means no deadline. The exit code is then 124 (as timeout(1)).
	TimeoutMs int64 `json:"timeoutMs,omitempty"`
	// Tag is recorded in the process table.
	Tag string `json:"tag,omitempty"`
}

// Event is one line of the exec stream. Exactly one of the groups is set.
type Event struct {
	Pid *int `json:"pid,omitempty"`

	// Stream is "stdout" or "stderr"; Line is one output line without its
	// newline (a last line without a newline is sent as is).
	Stream string  `json:"stream,omitempty"`
	Line   *string `json:"line,omitempty"`
	// Partial is set when Line did not end in a newline: the output's last
	// bytes, or a piece of a line longer than 1 MiB. Joining lines with a
	// newline after each one that is not partial gives the exact output.
	Partial bool `json:"partial,omitempty"`

	ExitCode *int `json:"exitCode,omitempty"`
	// Error is set, with ExitCode, when the command could not be started or
	// was killed by its deadline ("timeout").
	Error string `json:"error,omitempty"`
}

// Process is one running exec-started process.
type Process struct {
	Pid       int      `json:"pid"`
	Cmd       []string `json:"cmd"`
	Command   string   `json:"command"`
	Cwd       string   `json:"cwd"`
	Tag       string   `json:"tag"`
	StartedAt string   `json:"startedAt"` // RFC 3339, UTC
}

// SignalRequest signals the whole process tree of Pid.
type SignalRequest struct {
	Pid int `json:"pid"`
	// Signal is one of SIGTERM SIGKILL SIGINT SIGHUP SIGQUIT SIGUSR1 SIGUSR2.
	Signal string `json:"signal"`
}

// TokenRequest replaces the agent's token (at least 16 characters).
type TokenRequest struct {
	Token string `json:"token"`
}

// MoveRequest renames From to To.
type MoveRequest struct {
	From string `json:"from"`
	To   string `json:"to"`
	User string `json:"user,omitempty"`
}

// FileEntry is one entry of a directory listing.
type FileEntry struct {
	Name string `json:"name"`
	Path string `json:"path"`
	Type string `json:"type"` // file, dir or symlink
	Size int64  `json:"size"`
}

// FileStat describes one path.
type FileStat struct {
	Name          string `json:"name"`
	Path          string `json:"path"`
	Type          string `json:"type"` // file, dir or symlink
	Size          int64  `json:"size"`
	Mode          uint32 `json:"mode"`        // permission bits, e.g. 0644
	Permissions   string `json:"permissions"` // "-rw-r--r--"
	Owner         string `json:"owner"`
	Group         string `json:"group"`
	ModTime       int64  `json:"modTime"`    // unix ms
	ModifiedAt    string `json:"modifiedAt"` // RFC 3339
	SymlinkTarget string `json:"symlinkTarget,omitempty"`
}

// Error is the body of every non-2xx answer.
type Error struct {
	// Code is one of invalid, unauthenticated, permission, not_found,
	// conflict, too_large, internal.
	Code    string `json:"code"`
	Message string `json:"message"`
}
