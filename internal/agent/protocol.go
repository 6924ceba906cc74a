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
//	GET    /logs?after=N                  → LogsReply: output background
//	                                        processes wrote after their
//	                                        exec's stream ended
//	POST   /token         TokenRequest    → 204; from then on only the new
//	                                        token is accepted
//	POST   /envd/token    EnvdRequest     → 204: configures envd (below)
//	POST   /exec          ExecRequest     → 200, NDJSON stream of Event:
//	                                        {pid} first, then {stream,line}
//	                                        per output line, {exitCode} last.
//	GET    /processes                     → []Process (exec-started, running)
//	POST   /processes     StartRequest    → 200 StartReply: a process that
//	                                        outlives the request (see
//	                                        Interactive processes)
//	GET    /processes/{pid}/output        → 200, NDJSON stream of Output
//	POST   /processes/{pid}/stdin raw bytes → 204
//	DELETE /processes/{pid}/stdin         → 204: closes the stdin pipe
//	POST   /processes/{pid}/resize ResizeRequest → 204 (pty only)
//	POST   /processes/signal SignalRequest → 204
//	GET    /files?path=&user=             → raw bytes of a regular file
//	PUT    /files?path=&user=   raw bytes → 204; parents created, owned by user
//	DELETE /files?path=&user=             → 204; directories recursively
//	GET    /files/list?path=&user=        → []FileEntry
//	GET    /files/stat?path=&user=        → FileStat (lstat: symlinks not followed)
//	POST   /files/move    MoveRequest     → 204; destination parents created
//	POST   /watch         WatchRequest    → 200 WatchReply; 404 when the path
//	                                        is missing, 409 past MaxWatchers
//	                                        (or the kernel's inotify limits)
//	GET    /watch/events?watcherId=       → []WatchEvent queued since the
//	                                        last call ([] when none)
//	DELETE /watch?watcherId=              → 204; an unknown id is 404 (on
//	                                        events too)
//
// # envd
//
// The agent also speaks E2B's envd protocol on the same port, for requests
// carrying EnvdHeader: 1 (the node's proxy adds it to E2B traffic and never
// forwards TokenHeader). Those never reach the routes above; they are the
// Connect services process.Process and filesystem.Filesystem (JSON or
// binary protobuf, internal/envd), GET and POST /files, GET /health and GET
// /envs. When envd was configured secure, each needs the access token in
// X-Access-Token (or, for /files, E2B's signature parameters). The sandbox
// user comes from Basic auth (E2B's "user:"), else EnvdRequest.User, else
// "user" when the sandbox has that account (E2B's default), else root.
//
// The routes' user is a name from the sandbox's /etc/passwd; empty means
// root. File operations run with that user's uid, gid and groups, so the
// sandbox's own permission checks apply.
//
// # Interactive processes
//
// POST /processes starts a process that is not tied to any connection: on a
// pseudo-terminal (Pty set: stdin, stdout and stderr are the pty's slave, the
// process leads a new session with it as controlling terminal, so Ctrl-C
// written as byte 0x03 becomes SIGINT of the foreground job) or on pipes
// (stdout and stderr apart; stdin a pipe with Stdin, else /dev/null). The
// agent's process table entry owns the pty master or the stdin pipe, reads
// the output at once whoever listens, and keeps the last MaxKeptOutput
// bytes of it.
//
// GET /processes/{pid}/output attaches one more reader: the kept output
// first, then live output, then {exitCode} last. Any number of readers may
// be attached; a reader that falls more than MaxKeptOutput bytes behind
// skips ahead and is told how many bytes it missed (Output.Dropped), so a
// slow reader never holds the process or the other readers. A reader that
// goes away, or never comes, does not affect the process: it ends by
// itself, by its deadline (TimeoutMs) or by a signal. After the exit the
// entry is kept for ExitedKeepSeconds, so a late reader still gets the
// output and the status; then the pid is 404. A command that cannot be
// started (not found, not executable) is a 400 of the start.
//
// Input goes to POST /processes/{pid}/stdin (raw bytes, at most
// MaxStdinWrite per call, in order); DELETE …/stdin closes a pipe (the
// process reads EOF; a pty has no pipe to close: send Ctrl-D, 0x04). Input to
// a process without stdin is 409, to one that exited 409, to an unknown pid
// 404. A write to a pty waits while the terminal's input buffer is full
// (the process reads nothing). Resize changes the pty's window size (the
// foreground job gets SIGWINCH). POST /processes/signal signals these processes' trees too.
//
// # File watching
//
// A watcher reports changes under one path with inotify, and queues them
// until GET /watch/events drains the queue. Watching a directory reports its
// direct children, and with Recursive every directory under it, including
// directories created (or moved in) later; what such a directory already
// holds when its watch is added is reported as created. A watched
// directory's own removal or move is reported too (remove or rename of its
// path), after which the watcher reports nothing more; it stays open until
// it is deleted. A file is watched by name, through its directory: a file
// replaced by a rename, or removed and created again, is still reported.
//
// The inotify masks map to WatchEvent types: IN_CREATE and IN_MOVED_TO are
// create, IN_MODIFY and IN_CLOSE_WRITE write, IN_DELETE and IN_DELETE_SELF
// remove, IN_MOVED_FROM (and IN_MOVE_SELF of the watched path) rename,
// IN_ATTRIB chmod. Writes are coalesced: a write is not queued again for a
// path whose last queued event is already a write, so a burst of writes is
// one event per drain. The temp files of PUT /files are hidden: a file PUT
// writes is reported as create, then write, of its own path (create also
// when it replaced a file: the rename put a new file there).
//
// The queue holds at most MaxWatchEvents events. Past that, further events
// are dropped until the next drain, which ends with one event of type
// "overflow" (empty name, path the watched path); so does a drain after
// the kernel's own inotify queue overflowed. A watcher lives in the agent's
// memory only (no files, no helper process), so it survives a pause and
// resume, or a snapshot, of the sandbox like any other process state.
//
// The user must be able to read the watched path (for a directory: list
// it), or the answer is 403. The watches themselves are the agent's (root),
// so the user's permissions are not re-checked for each event; a recursive
// watch skips the directories below the path that the user could not list
// by their mode bits (ACLs are not considered), and it does not descend
// into /proc-, /sys- or cgroup-like pseudo file systems.
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
	// Version is the protocol version the agent speaks; agents from before
	// versions were reported leave it out, which means 1.
	Version int `json:"version,omitempty"`
}

// ProtocolVersion is the version of the protocol this package's agent
// speaks and its Client knows.
//
// Compatibility rule: the agent inside a paused sandbox, a snapshot or a
// ready state is the binary it was started with, so a server talks to
// agents older than itself for as long as such images exist. Changes to the
// protocol are therefore additive only: a new version may add endpoints and
// optional fields, never remove or change one. The server keeps the version
// each sandbox's agent reported (Client.Version, recorded per sandbox) and
// uses what a version added only with agents of at least that version.
// Versions: 1 — everything above; 2 — Health reports Version; 3 — GET
// /forward/{port}.
const ProtocolVersion = 3

// ForwardVersion is the first protocol version with GET /forward/{port}.
const ForwardVersion = 3

// ForwardUpgrade is the Upgrade token of GET /forward/{port}: the agent
// connects to port on the sandbox's loopback address (127.0.0.1, else ::1)
// and answers 101, after which the connection carries that port's bytes
// both ways; nothing listening there is a 404 not_found. The node uses it
// for servers bound to the loopback address only, which are not reachable
// at the sandbox's own address. The agent's own port is refused (400).
const ForwardUpgrade = "lizard-forward"

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
	// Pty and Stdin say how a process of POST /processes was started.
	Pty   bool `json:"pty,omitempty"`
	Stdin bool `json:"stdin,omitempty"`
}

// Interactive process limits.
const (
	// MaxKeptOutput is how many bytes of a process's latest output the
	// agent keeps for late or slow readers.
	MaxKeptOutput = 1 << 20
	// MaxStdinWrite bounds one POST /processes/{pid}/stdin.
	MaxStdinWrite = 1 << 20
	// ExitedKeepSeconds is how long an exited process's output and status
	// stay readable.
	ExitedKeepSeconds = 60
)

// PtySize is a terminal's size in character cells, each 1 to 65535.
type PtySize struct {
	Cols int `json:"cols"`
	Rows int `json:"rows"`
}

// StartRequest starts a process that outlives the request. The fields of
// ExecRequest mean what they mean for exec (TimeoutMs too).
type StartRequest struct {
	ExecRequest
	// Pty runs the process on a new pseudo-terminal of this size; stdin,
	// stdout and stderr are then the terminal (one "pty" output stream).
	Pty *PtySize `json:"pty,omitempty"`
	// Stdin gives a process without Pty a stdin pipe; without it, its
	// stdin is /dev/null.
	Stdin bool `json:"stdin,omitempty"`
}

// StartReply names the started process.
type StartReply struct {
	Pid int `json:"pid"`
}

// Output is one event of GET /processes/{pid}/output. Exactly one of the
// groups is set.
type Output struct {
	// Stream is "pty", "stdout" or "stderr"; Data the bytes as they were
	// read (base64 in JSON), with no line splitting.
	Stream string `json:"stream,omitempty"`
	Data   []byte `json:"data,omitempty"`

	// Dropped is how many bytes this reader missed, being too slow or
	// attaching after they left the kept output.
	Dropped int64 `json:"dropped,omitempty"`

	ExitCode *int `json:"exitCode,omitempty"`
	// Error is set with ExitCode when the deadline killed the process
	// ("timeout").
	Error string `json:"error,omitempty"`
}

// ResizeRequest sets a pty's window size.
type ResizeRequest = PtySize

// SignalRequest signals the whole process tree of Pid.
type SignalRequest struct {
	Pid int `json:"pid"`
	// Signal is one of SIGTERM SIGKILL SIGINT SIGHUP SIGQUIT SIGUSR1 SIGUSR2.
	Signal string `json:"signal"`
}

// LogLine is one line a background process wrote after its exec's stream
// ended.
type LogLine struct {
	Seq    int64  `json:"seq"`
	Time   string `json:"time"` // RFC 3339, UTC
	Pid    int    `json:"pid"`  // the exec's main pid
	Stream string `json:"stream"`
	Line   string `json:"line"`
}

// LogsReply answers GET /logs?after=N: the kept lines numbered N or later
// (the last 10,000 are kept) and the number the next line will get.
type LogsReply struct {
	Next  int64     `json:"next"`
	Lines []LogLine `json:"lines"`
}

// EnvdHeader marks a request for envd rather than the agent's own routes.
const EnvdHeader = "X-Lizard-Envd"

// EnvdTokenFile is where the agent keeps a secure envd's access token
// inside the sandbox (root's, mode 0600; absent when envd is not secure),
// for the other servers that E2B's SDKs send it to: the code interpreter on
// port 49999 (internal/codeinterp) checks /execute against it.
const EnvdTokenFile = "/run/lizard/envd-token"

// EgressCAFile is where the runtime mounts the egress proxy's CA
// certificate (PEM, read-only) in a sandbox: the agent adds it to the
// sandbox's trust store at boot and points the variables that Node,
// Python requests, pip, curl and OpenSSL read at it (see
// server.Config.EgressCA). Absent in sandboxes of servers without one.
const EgressCAFile = "/.lizard/egress-ca.pem"

// EnvdRequest configures envd (POST /envd/token).
type EnvdRequest struct {
	// Token is the access token; with Secure, every envd request must
	// carry it (at least 16 characters then).
	Token  string `json:"token,omitempty"`
	Secure bool   `json:"secure,omitempty"`
	// KeepDefaults leaves User, Workdir and Env as they were.
	KeepDefaults bool `json:"keepDefaults,omitempty"`
	// User, Workdir and Env are the template's command defaults: commands
	// and files of E2B clients that name no user are the User's ("": the
	// sandbox's "user" if it has one, else root), commands run in Workdir
	// (else the user's home) with Env under the request's envs.
	User    string            `json:"user,omitempty"`
	Workdir string            `json:"workdir,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
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
	ModifiedAt    int64  `json:"modifiedAt"` // unix ms, the same as ModTime (the SDK's type)
	SymlinkTarget string `json:"symlinkTarget,omitempty"`
}

// Limits of file watching.
const (
	// MaxWatchers is how many watchers the agent keeps open at once; one
	// more is a 409 conflict.
	MaxWatchers = 64
	// MaxWatchEvents bounds a watcher's queue of undrained events.
	MaxWatchEvents = 10000
)

// The types of WatchEvent.
const (
	WatchCreate = "create"
	WatchWrite  = "write"
	WatchRemove = "remove"
	WatchRename = "rename"
	WatchChmod  = "chmod"
	// WatchOverflow ends a drain after events were dropped.
	WatchOverflow = "overflow"
)

// WatchRequest starts a watcher of Path, an absolute path to a directory
// or a file.
type WatchRequest struct {
	Path string `json:"path"`
	// Recursive also watches every directory under Path (ignored for a
	// file).
	Recursive bool `json:"recursive,omitempty"`
	// User must be able to read Path; "" means root.
	User string `json:"user,omitempty"`
}

// WatchReply names a new watcher.
type WatchReply struct {
	WatcherID string `json:"watcherId"`
}

// WatchEvent is one change seen by a watcher.
type WatchEvent struct {
	// Type is one of create, write, remove, rename, chmod or overflow.
	Type string `json:"type"`
	// Name is the base name of Path ("" for overflow).
	Name string `json:"name"`
	// Path is the full path of what changed; for overflow, the watched
	// path.
	Path string `json:"path"`
}

// Error is the body of every non-2xx answer.
type Error struct {
	// Code is one of invalid, unauthenticated, permission, not_found,
	// conflict, too_large, internal.
	Code    string `json:"code"`
	Message string `json:"message"`
}
