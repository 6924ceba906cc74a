package main

import (
	"context"
	"flag"
	"fmt"
	"github.com/lizard-build/lizard/internal/apiclient"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
)

const scheduleUsage = `usage: lizard sandbox schedule COMMAND
  ls [ID] [--json]                              the project's schedules (one sandbox's with ID)
  add ID (--every D | --cron EXPR [--timezone TZ]) (--command CMD | --prompt TEXT [--agent A] [--model M] [--effort E])
      [--name N] [--timeout SECONDS] [--json]   print the new schedule's id
  info SCHEDULE [--json]
  set SCHEDULE [the add flags] [--on | --off] [--json]
  run SCHEDULE [--json]                         run it now (and switch it back on)
  runs SCHEDULE [--limit N] [--json]            its last runs, newest first
  rm SCHEDULE...`

// sandboxSchedule dispatches `lizard sandbox schedule …`.
func sandboxSchedule(ctx context.Context, c *apiclient.Client, args []string) error {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		fmt.Println(scheduleUsage)
		return nil
	}
	cmds := map[string]func(context.Context, *apiclient.Client, []string) error{
		"ls": scheduleList, "list": scheduleList,
		"add": scheduleAdd, "create": scheduleAdd,
		"info": scheduleInfo,
		"set":  scheduleSet, "update": scheduleSet,
		"run":  scheduleRun,
		"runs": scheduleRuns,
		"rm":   scheduleRemove, "delete": scheduleRemove,
	}
	fn, ok := cmds[args[0]]
	if !ok {
		return fmt.Errorf("unknown schedule command %q\n%s", args[0], scheduleUsage)
	}
	return fn(ctx, c, args[1:])
}

func schedulePath(id string, rest ...string) string {
	return "/api/sandbox-schedules/" + url.PathEscape(id) + strings.Join(rest, "")
}

// scheduleReply is the part of a schedule the tables show.
type scheduleReply struct {
	ID                  string  `json:"id"`
	SandboxID           string  `json:"sandboxId"`
	Name                *string `json:"name"`
	Every               *string `json:"every"`
	Cron                *string `json:"cron"`
	Timezone            string  `json:"timezone"`
	Kind                string  `json:"kind"`
	Command             *string `json:"command"`
	Prompt              *string `json:"prompt"`
	Agent               *string `json:"agent"`
	Enabled             bool    `json:"enabled"`
	DisabledReason      *string `json:"disabledReason"`
	NextRunAt           *string `json:"nextRunAt"`
	Running             bool    `json:"running"`
	LastRunAt           *string `json:"lastRunAt"`
	LastStatus          *string `json:"lastStatus"`
	ConsecutiveFailures int     `json:"consecutiveFailures"`
	SkippedCount        int     `json:"skippedCount"`
}

func or(p *string, def string) string {
	if p == nil || *p == "" {
		return def
	}
	return *p
}

func timeOr(p *string) string {
	if p == nil {
		return "-"
	}
	return shortTime(*p)
}

// when is how a schedule runs: "every 5m" or "cron 0 9 * * * Europe/Berlin".
func (s scheduleReply) when() string {
	if s.Every != nil {
		return "every " + *s.Every
	}
	return "cron " + or(s.Cron, "") + " " + s.Timezone
}

func (s scheduleReply) state() string {
	switch {
	case s.Running:
		return "running"
	case !s.Enabled:
		return "off"
	}
	return "on"
}

var scheduleHeader = []string{"ID", "SANDBOX", "NAME", "WHEN", "KIND", "STATE", "NEXT", "LAST"}

func (s scheduleReply) row() []string {
	return []string{s.ID, s.SandboxID, or(s.Name, "-"), s.when(), s.Kind, s.state(), timeOr(s.NextRunAt), or(s.LastStatus, "-")}
}

func scheduleList(ctx context.Context, c *apiclient.Client, args []string) error {
	fs, asJSON := sandboxFlags("schedule ls")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	path := "/api/sandbox-schedules"
	switch len(pos) {
	case 0:
	case 1:
		path = apiclient.SandboxPath(pos[0], "/schedules")
	default:
		return fmt.Errorf("schedule ls takes at most one sandbox id\n%s", scheduleUsage)
	}
	var out struct {
		Schedules []scheduleReply `json:"schedules"`
	}
	raw, err := c.CallInto(ctx, http.MethodGet, path, nil, &out)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(raw)
	}
	rows := make([][]string, len(out.Schedules))
	for i, s := range out.Schedules {
		rows[i] = s.row()
	}
	return printTable(os.Stdout, scheduleHeader, rows)
}

// scheduleFlags are the settings add and set take; only those given are
// sent.
func scheduleFlags(fs *flag.FlagSet) func() map[string]any {
	str := map[string]*string{}
	for name, usage := range map[string]string{
		"every":    `how often: "5m", "1h", "2d" or seconds (at least a minute)`,
		"cron":     "when, as a 5-field cron expression",
		"timezone": "IANA time zone of --cron (default UTC)",
		"command":  "shell command, run as root in /workspace (a volume's) or root's home",
		"prompt":   "prompt for the sandbox's coding agent",
		"agent":    "coding agent: claude or codex (default: the template's)",
		"model":    "the agent's model",
		"effort":   "the agent's reasoning effort: minimal, low, medium, high, xhigh",
		"name":     "a name",
	} {
		str[name] = fs.String(name, "", usage)
	}
	timeout := fs.Int("timeout", 0, "stop a run after this many seconds (default 600)")
	return func() map[string]any {
		req := map[string]any{}
		fs.Visit(func(f *flag.Flag) {
			switch f.Name {
			case "effort":
				req["reasoningEffort"] = *str["effort"]
			case "timeout":
				req["timeoutSeconds"] = *timeout
			default:
				if p, ok := str[f.Name]; ok {
					req[f.Name] = *p
				}
			}
		})
		return req
	}
}

func scheduleAdd(ctx context.Context, c *apiclient.Client, args []string) error {
	fs, asJSON := sandboxFlags("schedule add")
	settings := scheduleFlags(fs)
	id, err := oneID(fs, args)
	if err != nil {
		return err
	}
	var s scheduleReply
	raw, err := c.CallInto(ctx, http.MethodPost, apiclient.SandboxPath(id, "/schedules"), settings(), &s)
	return printIDOrJSON(raw, err, *asJSON, func() string { return s.ID })
}

func scheduleSet(ctx context.Context, c *apiclient.Client, args []string) error {
	fs, asJSON := sandboxFlags("schedule set")
	settings := scheduleFlags(fs)
	on := fs.Bool("on", false, "switch it on")
	off := fs.Bool("off", false, "switch it off")
	id, err := oneID(fs, args)
	if err != nil {
		return err
	}
	req := settings()
	switch {
	case *on && *off:
		return fmt.Errorf("schedule set: --on or --off, not both")
	case *on:
		req["enabled"] = true
	case *off:
		req["enabled"] = false
	}
	var s scheduleReply
	raw, err := c.CallInto(ctx, http.MethodPatch, schedulePath(id), req, &s)
	return printSchedule(raw, err, *asJSON, s)
}

func scheduleInfo(ctx context.Context, c *apiclient.Client, args []string) error {
	fs, asJSON := sandboxFlags("schedule info")
	id, err := oneID(fs, args)
	if err != nil {
		return err
	}
	var s scheduleReply
	raw, err := c.CallInto(ctx, http.MethodGet, schedulePath(id), nil, &s)
	return printSchedule(raw, err, *asJSON, s)
}

func scheduleRun(ctx context.Context, c *apiclient.Client, args []string) error {
	fs, asJSON := sandboxFlags("schedule run")
	id, err := oneID(fs, args)
	if err != nil {
		return err
	}
	var s scheduleReply
	raw, err := c.CallInto(ctx, http.MethodPost, schedulePath(id, "/run"), map[string]any{}, &s)
	return printSchedule(raw, err, *asJSON, s)
}

// printSchedule prints one schedule: its JSON, or its fields.
func printSchedule(raw []byte, err error, asJSON bool, s scheduleReply) error {
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(raw)
	}
	what := or(s.Command, "")
	if s.Kind == "prompt" {
		what = or(s.Agent, "agent") + ": " + or(s.Prompt, "")
	}
	tw := newTabWriter(os.Stdout)
	for _, r := range [][2]string{
		{"ID", s.ID}, {"SANDBOX", s.SandboxID}, {"NAME", or(s.Name, "-")}, {"WHEN", s.when()},
		{"RUNS", what}, {"STATE", s.state()}, {"OFF BECAUSE", or(s.DisabledReason, "-")},
		{"NEXT", timeOr(s.NextRunAt)}, {"LAST", timeOr(s.LastRunAt) + " " + or(s.LastStatus, "")},
		{"FAILURES IN A ROW", strconv.Itoa(s.ConsecutiveFailures)}, {"SKIPPED", strconv.Itoa(s.SkippedCount)},
	} {
		fmt.Fprintf(tw, "%s\t%s\n", r[0], r[1])
	}
	return tw.Flush()
}

func scheduleRuns(ctx context.Context, c *apiclient.Client, args []string) error {
	fs, asJSON := sandboxFlags("schedule runs")
	limit := fs.Int("limit", 20, "how many")
	id, err := oneID(fs, args)
	if err != nil {
		return err
	}
	var out struct {
		Runs []struct {
			ID         string  `json:"id"`
			Status     string  `json:"status"`
			StartedAt  string  `json:"startedAt"`
			DurationMs *int64  `json:"durationMs"`
			ExitCode   *int    `json:"exitCode"`
			Woke       bool    `json:"woke"`
			Slept      bool    `json:"slept"`
			Error      *string `json:"error"`
		} `json:"runs"`
	}
	raw, err := c.CallInto(ctx, http.MethodGet, schedulePath(id, "/runs?limit="+strconv.Itoa(*limit)), nil, &out)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(raw)
	}
	rows := make([][]string, len(out.Runs))
	for i, r := range out.Runs {
		took, code := "-", "-"
		if r.DurationMs != nil {
			took = strconv.FormatFloat(float64(*r.DurationMs)/1000, 'f', 1, 64) + "s"
		}
		if r.ExitCode != nil {
			code = strconv.Itoa(*r.ExitCode)
		}
		rows[i] = []string{r.ID, r.Status, shortTime(r.StartedAt), took, code, strconv.FormatBool(r.Woke), or(r.Error, "-")}
	}
	return printTable(os.Stdout, []string{"RUN", "STATUS", "STARTED", "TOOK", "EXIT", "WOKE", "ERROR"}, rows)
}

func scheduleRemove(ctx context.Context, c *apiclient.Client, args []string) error {
	fs, _ := sandboxFlags("schedule rm")
	ids, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(ids) == 0 {
		return fmt.Errorf("schedule rm needs schedule ids\n%s", scheduleUsage)
	}
	for _, id := range ids {
		if _, err := c.Call(ctx, http.MethodDelete, schedulePath(id), nil); err != nil {
			return fmt.Errorf("%s: %w", id, err)
		}
		fmt.Printf("%s: removed\n", id)
	}
	return nil
}
