package ready

import (
	"bufio"
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/errdefs"
)

const (
	// ListenWait is how long a start command without a ready command has
	// to open a port; one that opens none (a worker) is saved as it is
	// then.
	ListenWait = 10 * time.Second
	// Timeout bounds the wait for a ready command to pass.
	Timeout = 2 * time.Minute
	poll    = 100 * time.Millisecond
	// startLog and startExit are where a start command's output and exit
	// status go, in the sandbox's temporary directory (shell words: /tmp
	// unless the template sets TMPDIR).
	startLog  = `"${TMPDIR:-/tmp}/lizard-start.log"`
	startExit = `"${TMPDIR:-/tmp}/.lizard-start.exit"`
)

// QuoteArgv writes argv as a shell would read it, for messages.
func QuoteArgv(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		if a == "" || strings.ContainsAny(a, " \t\n\"'\\$`") {
			a = strconv.Quote(a)
		}
		q[i] = a
	}
	return strings.Join(q, " ")
}

// Command runs a template's start command, and what decides it is ready,
// through a sandbox's agent, as the template's user in its workdir.
type Command struct {
	Agent   *agent.Client
	User    string
	Workdir string
	Env     map[string]string
}

// run runs argv to its end and returns its exit code and output.
func (c Command) run(ctx context.Context, argv []string, user string, timeoutMs int64) (int, string, error) {
	var b strings.Builder
	code := -1
	err := c.Agent.Exec(ctx, agent.ExecRequest{Cmd: argv, Env: c.Env, User: user, Workdir: c.Workdir, TimeoutMs: timeoutMs},
		func(ev agent.Event) error {
			switch {
			case ev.Line != nil:
				b.WriteString(*ev.Line)
				if !ev.Partial {
					b.WriteByte('\n')
				}
			case ev.ExitCode != nil:
				code = *ev.ExitCode
			}
			return nil
		})
	return code, b.String(), err
}

// Start starts argv (see StartArgv) and returns its pid.
func (c Command) Start(ctx context.Context, argv []string) (int, error) {
	code, out, err := c.run(ctx, StartArgv(argv), c.User, 30_000)
	if err != nil {
		return 0, fmt.Errorf("start command: %w", err)
	}
	pid, perr := strconv.Atoi(strings.TrimSpace(out))
	if code != 0 || perr != nil {
		return 0, fmt.Errorf("start command %s did not start (exit %d): %s: %w", QuoteArgv(argv), code, strings.TrimSpace(out), errdefs.ErrInvalid)
	}
	return pid, nil
}

// StartArgv is the command that starts argv in the background, in a
// session of its own, with its output in startLog and its exit status, when
// it ends, in startExit, and prints its pid.
func StartArgv(argv []string) []string {
	script := `rm -f ` + startExit + `; setsid sh -c '"$@"; echo $? > ` + startExit + `' lizard-start "$@" > ` + startLog + ` 2>&1 < /dev/null & echo $!`
	return append([]string{"/bin/sh", "-c", script, "lizard-start"}, argv...)
}

// exited reports the start command's exit status once it has ended.
func (c Command) exited(ctx context.Context) (string, bool) {
	code, out, err := c.run(ctx, []string{"/bin/sh", "-c", "cat " + startExit}, "", 10_000)
	// The shell creates the file before it writes the status: empty is
	// not ended yet.
	status := strings.TrimSpace(out)
	if err != nil || code != 0 || status == "" {
		return "", false
	}
	return status, true
}

// lastLines is the end of the start command's output.
func (c Command) lastLines(ctx context.Context, n int) string {
	_, out, _ := c.run(ctx, []string{"/bin/sh", "-c", "tail -n " + strconv.Itoa(n) + " " + startLog}, "", 10_000)
	return strings.TrimRight(out, "\n")
}

// Listening returns the TCP ports listened on in the sandbox, but the
// agent's.
func (c Command) Listening(ctx context.Context) (map[int]bool, error) {
	code, out, err := c.run(ctx, []string{"cat", "/proc/net/tcp", "/proc/net/tcp6"}, "", 10_000)
	if err != nil {
		return nil, fmt.Errorf("read the sandbox's sockets: %w", err)
	}
	if code != 0 {
		return nil, fmt.Errorf("read the sandbox's sockets: exit %d: %s", code, strings.TrimSpace(out))
	}
	return listenPorts(out), nil
}

// listenPorts parses /proc/net/tcp{,6} for sockets in LISTEN (0A).
func listenPorts(procNet string) map[int]bool {
	ports := map[int]bool{}
	sc := bufio.NewScanner(strings.NewReader(procNet))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || f[3] != "0A" {
			continue
		}
		_, hexPort, ok := strings.Cut(f[1], ":")
		if !ok {
			continue
		}
		if p, err := strconv.ParseUint(hexPort, 16, 16); err == nil && int(p) != agent.Port {
			ports[int(p)] = true
		}
	}
	return ports
}

// WaitReady polls until the start command is ready: its ready command
// passes or, without one, it listens on a port that was not before (or
// ListenWait passes); one that exits 0 first (it daemonized) is
// waited for the same way. A command that fails first is an error with its
// status and last output.
func (c Command) WaitReady(ctx context.Context, readyCmd []string, before map[int]bool) (string, error) {
	began := time.Now()
	limit := Timeout
	if len(readyCmd) == 0 {
		limit = ListenWait
	}
	for {
		// A command that finishes well (a daemon that forked away) is
		// waited for like one that runs on; one that fails is an error.
		if status, ok := c.exited(ctx); ok && status != "0" {
			return "", fmt.Errorf("the start command exited (status %s) before it was ready; its last output:\n%s: %w",
				status, c.lastLines(ctx, 20), errdefs.ErrInvalid)
		}
		if len(readyCmd) > 0 {
			code, _, err := c.run(ctx, readyCmd, c.User, 10_000)
			if err != nil {
				return "", fmt.Errorf("ready command: %w", err)
			}
			if code == 0 {
				return "the ready command passed", nil
			}
		} else {
			now, err := c.Listening(ctx)
			if err != nil {
				return "", err
			}
			var opened []string
			for p := range now {
				if !before[p] {
					opened = append(opened, strconv.Itoa(p))
				}
			}
			if len(opened) > 0 {
				return "listening on port " + strings.Join(opened, ", "), nil
			}
		}
		if time.Since(began) > limit {
			if len(readyCmd) == 0 {
				return fmt.Sprintf("no port opened in %s; saved as it runs", ListenWait), nil
			}
			return "", fmt.Errorf("the ready command %s did not pass in %s; the start command's last output:\n%s: %w",
				QuoteArgv(readyCmd), Timeout, c.lastLines(ctx, 20), errdefs.ErrInvalid)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(poll):
		}
	}
}
