package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"

	"github.com/lizard-build/lizard/internal/apiclient"
)

// splitCommand separates the flags and positionals before "--" from the
// argv after it.
func splitCommand(args []string) (before, argv []string, dashed bool) {
	if i := slices.Index(args, "--"); i >= 0 {
		return args[:i], args[i+1:], true
	}
	return args, nil, false
}

func sandboxExec(ctx context.Context, c *apiclient.Client, args []string) error {
	fs, asJSON := sandboxFlags("exec")
	envs := envFlag{}
	fs.Var(envs, "env", "NAME=VALUE (repeatable)")
	user := fs.String("user", "", "run as this user (default: the template's)")
	workdir := fs.String("workdir", "", "working directory (default: the template's)")
	timeout := fs.Duration("timeout", 0, "kill the command after this long (default: the server's, 60s; at most 10m)")
	before, argv, dashed := splitCommand(args)
	pos, err := parse(fs, before)
	if err != nil {
		return err
	}
	req := map[string]any{}
	switch {
	case dashed && len(pos) == 1 && len(argv) > 0:
		req["cmd"] = argv
	case !dashed && len(pos) == 2:
		req["cmd"] = pos[1]
	default:
		return fmt.Errorf("exec needs a sandbox id and a command (a string for the shell, or -- ARGV...)\n%s", sandboxUsage)
	}
	id := pos[0]
	if len(envs) > 0 {
		req["envs"] = envs
	}
	if *user != "" {
		req["user"] = *user
	}
	if *workdir != "" {
		req["workdir"] = *workdir
	}
	if *timeout > 0 {
		req["timeoutMs"] = timeout.Milliseconds()
	}
	path := apiclient.SandboxPath(id, "/exec")
	if *asJSON {
		var rep struct {
			ExitCode int `json:"exitCode"`
		}
		raw, err := c.CallInto(ctx, http.MethodPost, path, req, &rep)
		if err != nil {
			return err
		}
		if err := printJSON(raw); err != nil {
			return err
		}
		return exitWith(rep.ExitCode)
	}
	code := -1
	err = c.Events(ctx, http.MethodPost, path, req, func(data []byte) error {
		var ev struct {
			Stream   string `json:"stream"`
			Line     string `json:"line"`
			ExitCode *int   `json:"exitCode"`
		}
		if err := json.Unmarshal(data, &ev); err != nil {
			return fmt.Errorf("decoding exec event %q: %w", data, err)
		}
		switch {
		case ev.ExitCode != nil:
			code = *ev.ExitCode
			return apiclient.ErrStop
		case ev.Stream == "stderr":
			_, err := fmt.Fprintln(os.Stderr, ev.Line)
			return err
		case ev.Stream == "stdout":
			_, err := fmt.Fprintln(os.Stdout, ev.Line)
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	if code < 0 {
		return fmt.Errorf("the exec stream ended without the command's exit status")
	}
	return exitWith(code)
}

// exitWith returns nil for 0, else the status to exit with.
func exitWith(code int) error {
	if code == 0 {
		return nil
	}
	if code < 0 || code > 255 {
		code = 255
	}
	return exitStatus(code)
}

func sandboxLogs(ctx context.Context, c *apiclient.Client, args []string) error {
	fs, asJSON := sandboxFlags("logs")
	follow := fs.Bool("f", false, "follow: print new lines as they come, until interrupted")
	tail := fs.Int("tail", 100, "how many of the last lines to print first")
	id, err := oneID(fs, args)
	if err != nil {
		return err
	}
	path := apiclient.SandboxPath(id, "/logs?tail="+strconv.Itoa(*tail))
	if !*follow {
		path += "&follow=false"
	}
	return c.Events(ctx, http.MethodGet, path, nil, func(data []byte) error {
		if *asJSON {
			_, err := fmt.Printf("%s\n", data)
			return err
		}
		var l apiclient.LogLine
		if err := json.Unmarshal(data, &l); err != nil {
			return fmt.Errorf("decoding log line %q: %w", data, err)
		}
		who := l.Type
		if l.Pid > 0 {
			who += " " + strconv.Itoa(l.Pid)
		}
		_, err := fmt.Printf("%s %-16s %s\n", l.Timestamp.Local().Format("15:04:05.000"), who, l.Message)
		return err
	})
}
