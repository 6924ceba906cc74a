package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/lizard-build/lizard/internal/apiclient"
)

const sandboxUsage = `usage: lizard sandbox COMMAND (the API at $LIZARD_API_URL, default ` + defaultAPIURL + `, with key $LIZARD_API_KEY)
  ls [--json]                                   list the project's sandboxes
  create [--template T] [--timeout D] [--size S] [--env K=V]... [--json]
                                                create one and print its id
  info ID [--json]
  exec ID [--env K=V]... [--user U] [--workdir W] [--timeout D] [--json] CMD
  exec ID [flags] -- ARGV...                    run a command (CMD by a shell, ARGV as is),
                                                stream its output, exit with its status
  shell ID [--cmd CMD]                          an interactive terminal (exit with the shell's status)
  logs ID [-f] [--tail N] [--json]              the sandbox's log (-f: follow)
  cp SRC DST                                    one of them ID:/path; - is stdin or stdout
  pause ID [--files-only] | resume ID [--json]
  snapshot ID [--name N] [--json]               print the snapshot's id
  schedule ls|add|info|set|run|runs|rm ...      schedules (lizard sandbox schedule help)
  kill ID... [--json]`

// sandboxCmd dispatches `lizard sandbox …`.
func sandboxCmd(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		fmt.Println(sandboxUsage)
		return nil
	}
	cmds := map[string]func(context.Context, *apiclient.Client, []string) error{
		"ls": sandboxList, "list": sandboxList,
		"create":   sandboxCreate,
		"info":     sandboxInfo,
		"exec":     sandboxExec,
		"shell":    sandboxShell,
		"logs":     sandboxLogs,
		"cp":       sandboxCopy,
		"pause":    sandboxLifecycle("pause"),
		"resume":   sandboxLifecycle("resume"),
		"snapshot": sandboxSnapshot,
		"schedule": sandboxSchedule,
		"kill":     sandboxKill,
	}
	fn, ok := cmds[args[0]]
	if !ok {
		return fmt.Errorf("unknown sandbox command %q\n%s", args[0], sandboxUsage)
	}
	c, err := newAPIClient()
	if err != nil {
		return err
	}
	return fn(ctx, c, args[1:])
}

// sandboxFlags is a flag set with --json.
func sandboxFlags(name string) (*flag.FlagSet, *bool) {
	fs := flag.NewFlagSet("sandbox "+name, flag.ContinueOnError)
	return fs, fs.Bool("json", false, "print the API's JSON")
}

// oneID parses args that are flags and exactly one sandbox id.
func oneID(fs *flag.FlagSet, args []string) (string, error) {
	pos, err := parse(fs, args)
	if err != nil {
		return "", err
	}
	if len(pos) != 1 || pos[0] == "" {
		return "", fmt.Errorf("%s needs one sandbox id\n%s", fs.Name(), sandboxUsage)
	}
	return pos[0], nil
}

// sandboxInfoReply is the part of SandboxInfo the tables show.
type sandboxInfoReply struct {
	SandboxID string            `json:"sandboxId"`
	Template  string            `json:"template"`
	Status    string            `json:"status"`
	StartedAt string            `json:"startedAt"`
	EndAt     *string           `json:"endAt"`
	Size      string            `json:"size"`
	CPUs      float64           `json:"cpus"`
	MemoryMB  int64             `json:"memoryMb"`
	Metadata  map[string]string `json:"metadata"`
}

func (s sandboxInfoReply) row() []string {
	end := "-"
	if s.EndAt != nil {
		end = shortTime(*s.EndAt)
	}
	return []string{s.SandboxID, s.Template, s.Status, shortTime(s.StartedAt), end}
}

var sandboxHeader = []string{"ID", "TEMPLATE", "STATUS", "STARTED", "ENDS"}

// shortTime shows an RFC 3339 time in local time to the second.
func shortTime(s string) string {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return s
	}
	return t.Local().Format("2006-01-02 15:04:05")
}

func sandboxList(ctx context.Context, c *apiclient.Client, args []string) error {
	fs, asJSON := sandboxFlags("ls")
	if pos, err := parse(fs, args); err != nil {
		return err
	} else if len(pos) != 0 {
		return fmt.Errorf("ls takes no arguments\n%s", sandboxUsage)
	}
	var list []sandboxInfoReply
	raw, err := c.CallInto(ctx, http.MethodGet, "/api/sandboxes", nil, &list)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(raw)
	}
	rows := make([][]string, len(list))
	for i, s := range list {
		rows[i] = s.row()
	}
	return printTable(os.Stdout, sandboxHeader, rows)
}

// envFlag collects --env K=V.
type envFlag map[string]string

func (f envFlag) String() string { return "" }

func (f envFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("--env %q: need NAME=VALUE", s)
	}
	f[k] = v
	return nil
}

func sandboxCreate(ctx context.Context, c *apiclient.Client, args []string) error {
	fs, asJSON := sandboxFlags("create")
	tmpl := fs.String("template", "", "template name (default: the server's, base)")
	size := fs.String("size", "", "size name")
	timeout := fs.Duration("timeout", -1, "lifetime, e.g. 10m; 0 means none (default: the server's)")
	envs := envFlag{}
	fs.Var(envs, "env", "NAME=VALUE for every command (repeatable)")
	if pos, err := parse(fs, args); err != nil {
		return err
	} else if len(pos) != 0 {
		return fmt.Errorf("create takes no arguments, only flags\n%s", sandboxUsage)
	}
	req := map[string]any{}
	if *tmpl != "" {
		req["template"] = *tmpl
	}
	if *size != "" {
		req["size"] = *size
	}
	if *timeout >= 0 {
		req["timeoutMs"] = timeout.Milliseconds()
	}
	if len(envs) > 0 {
		req["envs"] = envs
	}
	var info sandboxInfoReply
	raw, err := c.CallInto(ctx, http.MethodPost, "/api/sandboxes", req, &info)
	return printIDOrJSON(raw, err, *asJSON, func() string { return info.SandboxID })
}

// printIDOrJSON prints the answer of a call that made something: its JSON,
// or the new thing's id.
func printIDOrJSON(raw json.RawMessage, err error, asJSON bool, id func() string) error {
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(raw)
	}
	_, err = fmt.Println(id())
	return err
}

func sandboxInfo(ctx context.Context, c *apiclient.Client, args []string) error {
	fs, asJSON := sandboxFlags("info")
	id, err := oneID(fs, args)
	if err != nil {
		return err
	}
	var info sandboxInfoReply
	raw, err := c.CallInto(ctx, http.MethodGet, apiclient.SandboxPath(id), nil, &info)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(raw)
	}
	end := "-"
	if info.EndAt != nil {
		end = shortTime(*info.EndAt)
	}
	rows := [][]string{
		{"ID", info.SandboxID},
		{"TEMPLATE", info.Template},
		{"STATUS", info.Status},
		{"STARTED", shortTime(info.StartedAt)},
		{"ENDS", end},
		{"SIZE", fmt.Sprintf("%s (%g CPU, %d MiB)", info.Size, info.CPUs, info.MemoryMB)},
	}
	keys := make([]string, 0, len(info.Metadata))
	for k := range info.Metadata {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		rows = append(rows, []string{"META " + k, info.Metadata[k]})
	}
	tw := newTabWriter(os.Stdout)
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\n", r[0], r[1])
	}
	return tw.Flush()
}

// sandboxLifecycle is pause or resume.
func sandboxLifecycle(op string) func(context.Context, *apiclient.Client, []string) error {
	return func(ctx context.Context, c *apiclient.Client, args []string) error {
		fs, asJSON := sandboxFlags(op)
		var filesOnly *bool
		if op == "pause" {
			filesOnly = fs.Bool("files-only", false, "keep its files only: its processes end, its memory is freed, a resume boots it")
		}
		id, err := oneID(fs, args)
		if err != nil {
			return err
		}
		var body any
		if filesOnly != nil && *filesOnly {
			body = map[string]any{"memory": false}
		}
		raw, err := c.Call(ctx, http.MethodPost, apiclient.SandboxPath(id, "/", op), body)
		if err != nil {
			return err
		}
		if *asJSON {
			if len(raw) == 0 {
				raw = json.RawMessage("{}")
			}
			return printJSON(raw)
		}
		fmt.Printf("%s: %sd\n", id, op)
		return nil
	}
}

func sandboxSnapshot(ctx context.Context, c *apiclient.Client, args []string) error {
	fs, asJSON := sandboxFlags("snapshot")
	name := fs.String("name", "", "snapshot name")
	id, err := oneID(fs, args)
	if err != nil {
		return err
	}
	req := map[string]any{}
	if *name != "" {
		req["name"] = *name
	}
	var snap struct {
		ID string `json:"id"`
	}
	raw, err := c.CallInto(ctx, http.MethodPost, apiclient.SandboxPath(id, "/snapshot"), req, &snap)
	return printIDOrJSON(raw, err, *asJSON, func() string { return snap.ID })
}

func sandboxKill(ctx context.Context, c *apiclient.Client, args []string) error {
	fs, asJSON := sandboxFlags("kill")
	ids, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(ids) == 0 {
		return fmt.Errorf("kill needs sandbox ids\n%s", sandboxUsage)
	}
	// The API answers a kill with no body; --json reports each id.
	type result struct {
		SandboxID string `json:"sandboxId"`
		Killed    bool   `json:"killed"`
		Error     string `json:"error,omitempty"`
	}
	var (
		errs    []error
		results []result
	)
	for _, id := range ids {
		r := result{SandboxID: id, Killed: true}
		if _, err := c.Call(ctx, http.MethodDelete, apiclient.SandboxPath(id), nil); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", id, err))
			r = result{SandboxID: id, Error: err.Error()}
		} else if !*asJSON {
			fmt.Printf("%s: killed\n", id)
		}
		results = append(results, r)
	}
	if *asJSON {
		b, err := json.Marshal(results)
		if err != nil {
			return err
		}
		if err := printJSON(b); err != nil {
			return err
		}
	}
	return errors.Join(errs...)
}
