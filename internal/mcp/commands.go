package mcp

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/lizard-build/lizard/internal/apiclient"
)

// Command limits.
const (
	// outputCap is what a tool answers of each of a command's streams.
	outputCap = 32 << 10
	// defaultCommandTimeout and maxCommandTimeout bound run_command, in
	// seconds, as the API's exec does.
	defaultCommandTimeout = 60
	maxCommandTimeout     = 600
	// maxWait bounds read_command_output's wait, in seconds.
	maxWait = 300
	// commandDir holds the background commands' files in the sandbox:
	// <dir>/<id>/{pid,out,exit}, under $TMPDIR (the fake runtime's
	// sandboxes have one of their own), else /tmp. Its mode lets every
	// user start one.
	commandDir = "lizard-mcp-commands"
)

// commandIn is a command and what it runs as.
type commandIn struct {
	SandboxID string            `json:"sandboxId" jsonschema:"the sandbox's id"`
	Command   string            `json:"command" jsonschema:"a shell command (run by sh -c)"`
	Envs      map[string]string `json:"envs,omitempty" jsonschema:"environment variables of the command, over the sandbox's"`
	User      string            `json:"user,omitempty" jsonschema:"the user to run as (default: the template's, else root)"`
	Workdir   string            `json:"workdir,omitempty" jsonschema:"the working directory (default: the user's home)"`
}

type runIn struct {
	commandIn
	TimeoutSeconds int `json:"timeoutSeconds,omitempty" jsonschema:"the command is killed after this many seconds"`
}

// commandRef names a background command.
type commandRef struct {
	SandboxID string `json:"sandboxId" jsonschema:"the sandbox's id"`
	CommandID string `json:"commandId" jsonschema:"the commandId start_command returned"`
}

type readOutputIn struct {
	commandRef
	Offset      int64 `json:"offset,omitempty" jsonschema:"the byte of the output to read from: 0, or nextOffset of the previous read"`
	WaitSeconds int   `json:"waitSeconds,omitempty" jsonschema:"wait up to this many seconds for the command to end before reading"`
}

type stopIn struct {
	commandRef
	Signal string `json:"signal,omitempty" jsonschema:"the signal sent to the command's processes"`
}

func commandIDs(p props) {
	sandboxIDs(p)
	p.pattern("commandId", "^[0-9a-f]{16}$")
}

func (t *tools) addCommandTools(s *sdk.Server) {
	addTool(s, "run_command", "Run a command",
		fmt.Sprintf("Run a shell command in a sandbox to its end and return its exit code, stdout and stderr (each capped at %d KiB: the first and last %d KiB are kept).", outputCap>>10, outputCap>>11),
		adds, func(p props) {
			sandboxIDs(p)
			p.nonEmpty("command")
			p.rangeOf("timeoutSeconds", 1, maxCommandTimeout)
			p.byDefault("timeoutSeconds", defaultCommandTimeout)
		}, t.runCommand)
	addTool(s, "start_command", "Start a background command",
		"Start a shell command in the background (a server, a long build) and return its commandId at once; read_command_output reads its output later.",
		adds, func(p props) { sandboxIDs(p); p.nonEmpty("command") }, t.startCommand)
	addTool(s, "read_command_output", "Read a background command's output",
		fmt.Sprintf("Read a background command's output from offset (at most %d KiB a call; pass nextOffset back for more) and whether it still runs or its exit code.", outputCap>>10),
		reads, func(p props) {
			commandIDs(p)
			p.rangeOf("offset", 0, 1<<53)
			p.rangeOf("waitSeconds", 0, maxWait)
		}, t.readOutput)
	addTool(s, "stop_command", "Stop a background command",
		"Stop a background command of start_command: send its processes a signal (SIGTERM, or SIGKILL to be sure).",
		destroys, func(p props) {
			commandIDs(p)
			p.enum("signal", "SIGTERM", "SIGKILL", "SIGINT", "SIGHUP")
			p.byDefault("signal", "SIGTERM")
		}, t.stopCommand)
}

// execEvent is one Server-Sent Event of the API's exec stream.
type execEvent struct {
	Pid      *int    `json:"pid"`
	Stream   string  `json:"stream"`
	Line     *string `json:"line"`
	ExitCode *int    `json:"exitCode"`
}

// execution is a command run to its end through the API's exec stream.
type execution struct {
	stdout, stderr *capped
	exitCode       int
	took           time.Duration
}

// execOpts are what a command runs with beyond its argv.
type execOpts struct {
	envs          map[string]string
	user, workdir string
	timeout       time.Duration
}

// execute runs cmd (a string for the shell, or an argv) in the sandbox
// through the API's exec stream and collects its output, each stream
// capped at cap; onLine sees every line as it comes. When ctx ends before
// the command does, the command is killed in the sandbox (its process
// tree, through the API's signal route) and ctx's error returned.
func execute(ctx context.Context, c *apiclient.Client, id string, cmd any, o execOpts, cap int, onLine func(stream, line string)) (*execution, error) {
	body := map[string]any{"cmd": cmd, "pidEvent": true}
	if len(o.envs) > 0 {
		body["envs"] = o.envs
	}
	if o.user != "" {
		body["user"] = o.user
	}
	if o.workdir != "" {
		body["workdir"] = o.workdir
	}
	if o.timeout > 0 {
		body["timeoutMs"] = o.timeout.Milliseconds()
	}
	ex := &execution{stdout: newCapped(cap), stderr: newCapped(cap)}
	pid := 0
	var exit *int
	start := time.Now()
	err := c.Events(ctx, http.MethodPost, apiclient.SandboxPath(id, "/exec"), body, func(data []byte) error {
		var ev execEvent
		if err := json.Unmarshal(data, &ev); err != nil {
			return fmt.Errorf("decoding an exec event: %w", err)
		}
		switch {
		case ev.Pid != nil:
			pid = *ev.Pid
		case ev.Line != nil:
			w := ex.stdout
			if ev.Stream == "stderr" {
				w = ex.stderr
			}
			w.Write([]byte(*ev.Line + "\n"))
			if onLine != nil {
				onLine(ev.Stream, *ev.Line)
			}
		case ev.ExitCode != nil:
			exit = ev.ExitCode
			return apiclient.ErrStop
		}
		return nil
	})
	ex.took = time.Since(start)
	if ctx.Err() != nil {
		if pid > 0 && exit == nil {
			kill(ctx, c, id, pid)
		}
		return nil, ctx.Err()
	}
	if err != nil {
		return nil, err
	}
	if exit == nil {
		return nil, errors.New("the command's output ended without an exit code (the sandbox went away?)")
	}
	ex.exitCode = *exit
	if ex.exitCode == -1 {
		// The API ends a stream it cannot finish with its message on
		// stderr and this code.
		return nil, errors.New(strings.TrimSpace(lastLine(ex.stderr.String())))
	}
	return ex, nil
}

// kill kills a command of a cancelled call, and what it started, in the
// sandbox.
func kill(ctx context.Context, c *apiclient.Client, id string, pid int) {
	kctx, cancel := detached(ctx)
	defer cancel()
	// A command that ended meanwhile is a 404: nothing to do.
	c.Call(kctx, http.MethodPost, apiclient.SandboxPath(id, "/processes/signal"), map[string]any{"pid": pid, "signal": "SIGKILL"})
}

func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	return s[strings.LastIndexByte(s, '\n')+1:]
}

func (t *tools) runCommand(ctx context.Context, req *sdk.CallToolRequest, in runIn) (*sdk.CallToolResult, error) {
	c, err := t.clientOf(req)
	if err != nil {
		return nil, err
	}
	timeout := time.Duration(in.TimeoutSeconds) * time.Second
	p := startProgress(ctx, req, float64(in.TimeoutSeconds), "running: "+clip(in.Command, 200))
	ex, err := execute(ctx, c, in.SandboxID, in.Command, execOpts{envs: in.Envs, user: in.User, workdir: in.Workdir, timeout: timeout}, outputCap,
		func(_, line string) { p.say(clip(line, 200)) })
	p.end()
	if err != nil {
		return nil, err
	}
	status := fmt.Sprintf("exit code %d", ex.exitCode)
	if ex.exitCode == 124 && ex.took >= timeout {
		status += fmt.Sprintf(" (killed at its timeout of %d s)", in.TimeoutSeconds)
	}
	text := status + "\n" + section("stdout", ex.stdout) + section("stderr", ex.stderr)
	return textResult(text, map[string]any{
		"exitCode": ex.exitCode, "stdout": ex.stdout.String(), "stderr": ex.stderr.String(),
		"stdoutBytes": ex.stdout.total, "stderrBytes": ex.stderr.total,
		"truncated": ex.stdout.Truncated() || ex.stderr.Truncated(), "durationMs": ex.took.Milliseconds(),
	}), nil
}

// section is a stream of a command in a tool's text, "" when empty.
func section(name string, c *capped) string {
	if c.total == 0 {
		return ""
	}
	return "--- " + name + " ---\n" + c.String()
}

// clip shortens s to at most n bytes, between characters.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}

// The background commands' scripts. Each runs through the API's exec as
// sh -c, its values in environment variables (never in the script).
const (
	// startScript starts $LZ_CMD in a session of its own, detached from
	// the exec, writing its output, pid and exit code in its directory.
	startScript = `set -e
top="${TMPDIR:-/tmp}/$LZ_DIR"
mkdir -p -m 1777 "$top" 2>/dev/null || true
d="$top/$LZ_ID"
mkdir -m 700 "$d"
setsid sh -c 'echo $$ > "$1/pid"; c=$LZ_CMD; unset LZ_CMD LZ_DIR LZ_ID; sh -c "$c"; echo $? > "$1/exit"' sh "$d" > "$d/out" 2>&1 < /dev/null &
i=0
while [ ! -s "$d/pid" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done
cat "$d/pid"`
	// readScript prints "pid size running exit" (exit "-" while none),
	// then the output from $LZ_OFFSET, at most $LZ_MAX bytes, in base64.
	readScript = `d="${TMPDIR:-/tmp}/$LZ_DIR/$LZ_ID"
[ -d "$d" ] || { echo "no command $LZ_ID in this sandbox" >&2; exit 3; }
pid=$(cat "$d/pid" 2>/dev/null)
alive() { [ -n "$pid" ] && kill -0 "-$pid" 2>/dev/null; }
i=0
while [ ! -e "$d/exit" ] && [ $i -lt $((LZ_WAIT * 10)) ] && alive; do sleep 0.1; i=$((i+1)); done
running=0; [ ! -e "$d/exit" ] && alive && running=1
exit=$(cat "$d/exit" 2>/dev/null); [ -n "$exit" ] || exit=-
echo "${pid:-0} $(stat -c %s "$d/out") $running $exit"
tail -c +$((LZ_OFFSET + 1)) "$d/out" | head -c "$LZ_MAX" | base64 -w0
echo`
	// stopScript signals the command's process group (dash's kill takes
	// no "--": a group is "-PGID" after the signal).
	stopScript = `d="${TMPDIR:-/tmp}/$LZ_DIR/$LZ_ID"
pid=$(cat "$d/pid" 2>/dev/null) || { echo "no command $LZ_ID in this sandbox" >&2; exit 3; }
kill -"$LZ_SIG" "-$pid" 2>/dev/null || echo "command $LZ_ID has already ended"`
)

func (t *tools) startCommand(ctx context.Context, req *sdk.CallToolRequest, in commandIn) (*sdk.CallToolResult, error) {
	c, err := t.clientOf(req)
	if err != nil {
		return nil, err
	}
	b := make([]byte, 8)
	rand.Read(b)
	cid := hex.EncodeToString(b)
	envs := map[string]string{}
	for k, v := range in.Envs {
		envs[k] = v
	}
	envs["LZ_CMD"], envs["LZ_DIR"], envs["LZ_ID"] = in.Command, commandDir, cid
	ex, err := execute(ctx, c, in.SandboxID, startScript, execOpts{envs: envs, user: in.User, workdir: in.Workdir, timeout: 30 * time.Second}, outputCap, nil)
	if err != nil {
		return nil, err
	}
	pid, perr := strconv.Atoi(strings.TrimSpace(lastLine(ex.stdout.String())))
	if ex.exitCode != 0 || perr != nil {
		return nil, fmt.Errorf("starting the command failed (exit code %d): %s", ex.exitCode, strings.TrimSpace(ex.stderr.String()+ex.stdout.String()))
	}
	return textResult(fmt.Sprintf("started command %s (pid %d); read its output with read_command_output", cid, pid),
		map[string]any{"commandId": cid, "pid": pid}), nil
}

func (t *tools) readOutput(ctx context.Context, req *sdk.CallToolRequest, in readOutputIn) (*sdk.CallToolResult, error) {
	c, err := t.clientOf(req)
	if err != nil {
		return nil, err
	}
	envs := map[string]string{"LZ_DIR": commandDir, "LZ_ID": in.CommandID, "LZ_OFFSET": strconv.FormatInt(in.Offset, 10),
		"LZ_MAX": strconv.Itoa(outputCap), "LZ_WAIT": strconv.Itoa(in.WaitSeconds)}
	var p *progress
	if in.WaitSeconds > 0 {
		p = startProgress(ctx, req, float64(in.WaitSeconds), "waiting for command "+in.CommandID)
	}
	// As root: the command may be another user's.
	ex, err := execute(ctx, c, in.SandboxID, readScript, execOpts{envs: envs, user: "root", timeout: time.Duration(in.WaitSeconds+30) * time.Second}, 2*outputCap, nil)
	if p != nil {
		p.end()
	}
	if err != nil {
		return nil, err
	}
	if ex.exitCode != 0 {
		return nil, errors.New(strings.TrimSpace(ex.stderr.String()))
	}
	lines := strings.Split(strings.TrimRight(ex.stdout.String(), "\n"), "\n")
	var pid, running int
	var size int64
	var exit string
	if len(lines) != 2 {
		return nil, fmt.Errorf("reading the command's state: unexpected answer %q", clip(ex.stdout.String(), 200))
	}
	if _, err := fmt.Sscan(lines[0], &pid, &size, &running, &exit); err != nil {
		return nil, fmt.Errorf("reading the command's state %q: %w", lines[0], err)
	}
	out, err := base64.StdEncoding.DecodeString(lines[1])
	if err != nil {
		return nil, fmt.Errorf("reading the command's output: %w", err)
	}
	next := in.Offset + int64(len(out))
	v := map[string]any{"commandId": in.CommandID, "pid": pid, "running": running == 1, "output": strings.ToValidUTF8(string(out), "\uFFFD"),
		"offset": in.Offset, "nextOffset": next, "totalBytes": size}
	var state string
	switch {
	case running == 1:
		state = "still running"
	case exit != "-":
		code, _ := strconv.Atoi(exit)
		v["exitCode"] = code
		state = fmt.Sprintf("ended with exit code %d", code)
	default:
		state = "ended without an exit code (killed by a signal)"
	}
	text := fmt.Sprintf("command %s %s; output bytes %d to %d of %d", in.CommandID, state, in.Offset, next, size)
	if next < size {
		text += fmt.Sprintf(" (more: read again with offset %d)", next)
	}
	text += "\n" + v["output"].(string)
	return textResult(text, v), nil
}

func (t *tools) stopCommand(ctx context.Context, req *sdk.CallToolRequest, in stopIn) (*sdk.CallToolResult, error) {
	c, err := t.clientOf(req)
	if err != nil {
		return nil, err
	}
	envs := map[string]string{"LZ_DIR": commandDir, "LZ_ID": in.CommandID, "LZ_SIG": strings.TrimPrefix(in.Signal, "SIG")}
	ex, err := execute(ctx, c, in.SandboxID, stopScript, execOpts{envs: envs, user: "root", timeout: 30 * time.Second}, outputCap, nil)
	if err != nil {
		return nil, err
	}
	if ex.exitCode != 0 {
		return nil, errors.New(strings.TrimSpace(ex.stderr.String()))
	}
	if msg := strings.TrimSpace(ex.stdout.String()); msg != "" {
		return textResult(msg, nil), nil
	}
	return textResult(fmt.Sprintf("sent %s to command %s", in.Signal, in.CommandID), nil), nil
}
