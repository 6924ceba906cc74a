package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/lizard-build/lizard/internal/runtime/gvisor"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/sandbox/tplpool"
	"github.com/lizard-build/lizard/internal/template"
	"github.com/lizard-build/lizard/internal/tmplqueue"
	"github.com/lizard-build/lizard/internal/volume/content"
)

const usage = `usage:
  lizard serve [--listen ADDR] [--data-dir DIR | --database URL] [--template-dir DIR] [--runsc PATH]
        [--build-bridge BR] [--build-subnet CIDR] [--registry-allow HOST[:PORT]]... [--registry-auth FILE]
        [--debian-mirror URL] [--max-build-context BYTES]   (lizard serve -h: all flags)
  lizard migrate [--data-dir DIR | --database URL]
  lizard projects create NAME [--data-dir DIR | --database URL]
  lizard projects ls [--data-dir DIR | --database URL]
  lizard projects set P [--max-sandboxes N] [--max-vcpus N] [--max-memory-gb N] [--max-volume-gb N] [--max-snapshots N] [--max-schedules N] [--max-schedules-per-sandbox N] [--data-dir DIR | --database URL]
      (N: a number, 0 for no limit, or "default" for the server's default)
  lizard keys create --project P [--data-dir DIR | --database URL]
  lizard keys ls --project P [--data-dir DIR | --database URL]
  lizard keys revoke ID [--data-dir DIR | --database URL]
  lizard nodes ls|drain NODE [--undo]|remove NODE --database URL   (cluster mode)
  lizard template build NAME [--if-missing] [--seed-max-age D] [--debian-mirror URL] [--template-dir DIR] [--runsc PATH]
  lizard template build NAME -f DOCKERFILE [CONTEXT] [--project P] [--build-arg K=V]... [--runsc PATH]
        [--registry-allow HOST[:PORT]]... [--registry-auth FILE] [--build-bridge BR] [--build-subnet CIDR]
        [--template-dir DIR] [--data-dir DIR | --database URL]
  lizard template ls [--project P] [--template-dir DIR] [--data-dir DIR | --database URL]
  lizard template rm NAME [--project P] [--template-dir DIR] [--data-dir DIR | --database URL]
  lizard template pool NAME --size N [--sandbox-size S] [--project P] [--template-dir DIR] [--data-dir DIR | --database URL]
        (every node keeps N sandboxes of NAME booted for the project's creates; N: 0 to 100, 0 removes the pool)
  lizard template pools [--project P | --all] [--data-dir DIR | --database URL]
  lizard secrets gen-key
  lizard secrets rotate-key --secrets-key-file NEW --secrets-previous-key-file OLD [--data-dir DIR | --database URL]
  lizard identity keys|rotate-key [--activate-in D] [--drop-old] --oidc-issuer URL --secrets-key-file F [--data-dir DIR | --database URL]
  lizard backup FILE [--data-dir DIR]
  lizard restore FILE --data-dir NEWDIR
  lizard config docs|example
  lizard sandbox ls|create|info|exec|shell|logs|cp|pause|resume|snapshot|kill ...  (lizard sandbox help)
  lizard mcp                                   the MCP server over stdio, for agents (lizard mcp help)
every command but sandbox and mcp also takes --config FILE (default /etc/lizard/lizard.toml) and LIZARD_* variables: docs/CONFIG.md`

// Defaults shared by the subcommands.
const (
	defaultDataDir     = "/var/lib/lizard"
	defaultTemplateDir = "/var/cache/lizard/templates"
)

// Run dispatches a command line.
func Run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New(usage)
	}
	switch args[0] {
	case "serve":
		return serve(ctx, args[1:])
	case "projects":
		return projects(ctx, args[1:])
	case "keys":
		return keys(ctx, args[1:])
	case "nodes":
		return nodes(ctx, args[1:])
	case "template", "templates":
		return templates(ctx, args[1:])
	case "config":
		return config(args[1:])
	case "migrate":
		return migrateCmd(ctx, args[1:])
	case "secrets":
		return secretsCmd(ctx, args[1:])
	case "identity":
		return identityCmd(ctx, args[1:])
	case "backup":
		return backupCmd(ctx, args[1:])
	case "restore":
		return restoreCmd(ctx, args[1:])
	case "sandbox", "sandboxes":
		return sandboxCmd(ctx, args[1:])
	case "mcp":
		return mcpCmd(ctx, args[1:])
	case "volume-content":
		// Run by the server, through the agent, in the sandbox that holds
		// a volume (E2B's volume content API): not listed in usage.
		return content.Main(args[1:], os.Stdout)
	case "help", "-h", "--help":
		fmt.Println(usage)
		return nil
	}
	return fmt.Errorf("unknown command %q\n%s", args[0], usage)
}

// parse parses flags that may come before or after positional arguments.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

func keys(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("keys", flag.ContinueOnError)
	dataDir := fs.String("data-dir", defaultDataDir, "state directory")
	database := fs.String("database", "", databaseUsage)
	project := fs.String("project", "", "project id or slug")
	pos, err := configure(fs, args)
	if err != nil {
		return err
	}
	var cmd string
	if len(pos) > 0 {
		cmd = pos[0]
	}
	switch {
	case (cmd == "create" || cmd == "ls" || cmd == "list") && len(pos) == 1 && *project != "":
	case cmd == "revoke" && len(pos) == 2:
	default:
		return errors.New(usage)
	}
	st, err := openStore(ctx, *dataDir, *database)
	if err != nil {
		return err
	}
	defer st.Close()
	if cmd == "revoke" {
		// A running server refuses the key once it next polls the key
		// generation (every 250 ms).
		if err := st.RevokeKey(ctx, pos[1]); err != nil {
			return err
		}
		fmt.Printf("API key %s revoked\n", pos[1])
		return nil
	}
	p, err := st.ProjectByRef(ctx, *project)
	if err != nil {
		return err
	}
	if cmd == "create" {
		key, err := st.CreateKey(ctx, p.ID, "")
		if err != nil {
			return err
		}
		fmt.Printf("API key for project %s (shown once):\n%s\n", p.Slug, key)
		return nil
	}
	ks, err := st.Keys(ctx, p.ID)
	if err != nil {
		return err
	}
	tw := newTabWriter(os.Stdout)
	fmt.Fprintln(tw, "ID\tPREFIX\tCREATED\tLAST USED\tREVOKED")
	for _, k := range ks {
		fmt.Fprintf(tw, "%s\t%s…\t%s\t%s\t%s\n", k.ID, k.Prefix, fmtTime(&k.CreatedAt), fmtTime(k.LastUsed), fmtTime(k.RevokedAt))
	}
	return tw.Flush()
}

// fmtTime shows a time of a listing in UTC, "-" for none.
func fmtTime(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

func templates(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("template", flag.ContinueOnError)
	dir := fs.String("template-dir", defaultTemplateDir, "template cache directory")
	dataDir := fs.String("data-dir", defaultDataDir, "state directory (to find the project)")
	database := fs.String("database", "", databaseUsage)
	project := fs.String("project", "default", "project id or slug whose templates a Dockerfile build, ls, rm, pool and pools work on")
	poolSize := fs.Int("size", 0, fmt.Sprintf("with pool: how many sandboxes of the template each node keeps booted for the project, 0 (no pool) to %d", tplpool.MaxSize))
	sandboxSize := fs.String("sandbox-size", "", "with pool: the size of the pool's sandboxes (default: the server's default size, "+sandbox.DefaultSize+")")
	allProjects := fs.Bool("all", false, "with pools: every project's pools")
	sandboxSubnet := fs.String("subnet", defaultSubnet, "the sandboxes' subnet, which RUN steps may not reach")
	var bf buildFlags
	bf.register(fs)
	ifMissing := fs.Bool("if-missing", false, "build only when not built yet")
	seedAge := fs.Duration("seed-max-age", time.Hour, "start a built-in build from the debootstrapped tree an earlier build left if younger than this (0: debootstrap every time)")
	dockerfile := fs.String("f", "", "build from this Dockerfile (context: CONTEXT, default the Dockerfile's directory)")
	runsc := fs.String("runsc", "", "runsc binary for RUN steps and built-in recipes' steps (default: $LIZARD_RUNSC, else runsc in PATH)")
	readyCmd := fs.String("ready-cmd", "", "shell command that passes once the start command (CMD) is ready; replaces the Dockerfile's HEALTHCHECK")
	var buildArgs buildArgFlag
	fs.Var(&buildArgs, "build-arg", "NAME=VALUE for an ARG of the Dockerfile (repeatable)")
	pos, err := configure(fs, args)
	if err != nil {
		return err
	}
	reg := template.NewRegistry(*dir)
	reg.Mirror = bf.mirror
	reg.SeedMaxAge = *seedAge
	// projectReg is the registry of --project's own templates.
	projectReg := func() (*template.Registry, error) {
		st, err := openStore(ctx, *dataDir, *database)
		if err != nil {
			return nil, err
		}
		defer st.Close()
		p, err := st.ProjectByRef(ctx, *project)
		if err != nil {
			where := *dataDir
			if *database != "" {
				where = "--database"
			}
			return nil, fmt.Errorf("--project %s (in %s): %w", *project, where, err)
		}
		return reg.Project(p.ID)
	}
	// buildOptions are the build network's options the flags say.
	buildOptions := func() (template.DockerfileOptions, error) {
		subnet, err := netip.ParsePrefix(*sandboxSubnet)
		if err != nil {
			return template.DockerfileOptions{}, fmt.Errorf("--subnet: %w", err)
		}
		return bf.options(subnet)
	}
	// stepRuntime is the runtime a build's steps run with (runsc rs);
	// done removes its state.
	stepRuntime := func(rs string, log *slog.Logger) (rt *gvisor.Runtime, done func(), err error) {
		rt, err = buildRuntime(rs, bf.cgroupParent+"-build", log)
		if err != nil {
			return nil, nil, err
		}
		return rt, func() {
			if err := rt.RemoveState(); err != nil {
				log.Warn("remove the build's runtime state", "err", err)
			}
		}, nil
	}
	switch {
	case len(pos) == 2 && pos[0] == "pool":
		sizeSet := false
		fs.Visit(func(f *flag.Flag) { sizeSet = sizeSet || f.Name == "size" })
		if !sizeSet {
			return fmt.Errorf("lizard template pool %s: --size N is required (0 removes the pool)", pos[1])
		}
		st, err := openStore(ctx, *dataDir, *database)
		if err != nil {
			return err
		}
		defer st.Close()
		return setTemplatePool(ctx, os.Stdout, st, reg, templatePool{project: *project, template: pos[1], sandboxSize: *sandboxSize, size: *poolSize})
	case len(pos) == 1 && pos[0] == "pools":
		st, err := openStore(ctx, *dataDir, *database)
		if err != nil {
			return err
		}
		defer st.Close()
		return listTemplatePools(ctx, os.Stdout, st, *project, *allProjects)
	case *dockerfile != "" && (len(pos) == 2 || len(pos) == 3) && pos[0] == "build":
		if *ifMissing {
			return errors.New("--if-missing is for built-in templates, not Dockerfile builds")
		}
		data, err := os.ReadFile(*dockerfile)
		if err != nil {
			return err
		}
		context := filepath.Dir(*dockerfile)
		if len(pos) == 3 {
			context = pos[2]
		}
		rs, err := findRunsc(*runsc)
		if err != nil {
			return err
		}
		opts, err := buildOptions()
		if err != nil {
			return err
		}
		preg, err := projectReg()
		if err != nil {
			return err
		}
		opts.Dockerfile, opts.DockerfileName, opts.Context = data, *dockerfile, context
		opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
		rt, done, err := stepRuntime(rs, opts.Logger)
		if err != nil {
			return err
		}
		opts.BuildArgs, opts.ReadyCommand, opts.Runtime = buildArgs.m, *readyCmd, rt
		t, err := preg.BuildDockerfile(ctx, pos[1], opts, os.Stdout)
		done()
		if err == nil && len(t.StartCommand) > 0 {
			// The ready state is a checkpoint the server takes with its own
			// runtime and network; `lizard serve` looks for new templates
			// every 10 s (POST /api/templates builds take it before they
			// answer).
			fmt.Println("start command: the server makes its ready state within seconds (or when it starts), so that sandboxes start with it running;")
			fmt.Println("  until then, sandboxes start the command when they are created.")
		}
		return err
	case len(pos) == 2 && pos[0] == "build":
		// The recipe's steps (debootstrap's second stage, apt-get, useradd,
		// checks) run in gVisor on the build network, as RUN steps do. A
		// template --if-missing finds built needs no runsc.
		opts, err := buildOptions()
		if err != nil {
			return err
		}
		reg.BuildNetwork = opts.Network()
		rs, noRunsc := findRunsc(*runsc)
		if noRunsc == nil {
			rt, done, err := stepRuntime(rs, slog.New(slog.NewTextHandler(os.Stderr, nil)))
			if err != nil {
				return err
			}
			defer done()
			reg.Runtime = rt
		}
		build := reg.Build
		if *ifMissing {
			build = reg.EnsureBuilt
		}
		_, err = build(ctx, pos[1], os.Stdout)
		if err != nil && noRunsc != nil {
			return fmt.Errorf("%w (%v)", err, noRunsc)
		}
		return err
	case len(pos) == 2 && (pos[0] == "rm" || pos[0] == "remove"):
		preg, err := projectReg()
		if err != nil {
			return err
		}
		if err := preg.Remove(ctx, pos[1]); err != nil {
			return err
		}
		fmt.Printf("template %s removed; sandboxes and snapshots of it keep the version they run on until they go\n", pos[1])
		return nil
	case len(pos) == 1 && (pos[0] == "ls" || pos[0] == "list"):
		preg, err := projectReg()
		if err != nil {
			return err
		}
		ts, err := reg.ListFor(preg.ProjectID())
		if err != nil {
			return err
		}
		tw := newTabWriter(os.Stdout)
		fmt.Fprintln(tw, "NAME\tALIASES\tVERSION\tSIZE\tBUILT\tSOFTWARE")
		for _, t := range ts {
			aliases := strings.Join(t.Aliases, ",")
			if aliases == "" {
				aliases = "-"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d MiB\t%s\t%s\n", t.Name, aliases, t.Version, t.SizeBytes>>20,
				t.BuiltAt.Format("2006-01-02 15:04"), template.FormatVersions(t.Versions))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		// The server's background builds (--build-templates) say
		// where they are.
		builds, err := tmplqueue.ReadStatus(filepath.Join(*dataDir, buildStatusFile))
		if err != nil {
			return err
		}
		var missing []string
		for _, name := range reg.Builtins() {
			if _, err := reg.Get(name); err == nil {
				continue
			}
			if i := slices.IndexFunc(builds, func(b tmplqueue.Status) bool { return b.Name == name }); i >= 0 {
				b := builds[i]
				fmt.Printf("%s: %s since %s", name, b.State, b.Since.Local().Format("15:04:05"))
				if b.Progress != "" {
					fmt.Printf(": %s", b.Progress)
				}
				fmt.Println()
				continue
			}
			missing = append(missing, name)
		}
		if len(missing) > 0 {
			fmt.Printf("not built: %s (lizard template build NAME)\n", strings.Join(missing, ", "))
		}
		return nil
	}
	return errors.New(usage)
}

// buildArgFlag collects --build-arg NAME=VALUE; a bare NAME takes the value
// of the environment variable NAME, as in docker build.
type buildArgFlag struct{ m map[string]string }

func (f *buildArgFlag) String() string { return "" }

func (f *buildArgFlag) Set(s string) error {
	if f.m == nil {
		f.m = map[string]string{}
	}
	k, v, ok := strings.Cut(s, "=")
	if k == "" {
		return fmt.Errorf("--build-arg %q: need NAME=VALUE", s)
	}
	if !ok {
		v, ok = os.LookupEnv(k)
		if !ok {
			return nil
		}
	}
	f.m[k] = v
	return nil
}

// buildRuntime is the runtime a `lizard template build` runs RUN steps
// with: gVisor's, making no sandboxes, with state directories of this
// process's own (a server's runtime, and its recovery, never see them);
// RemoveState removes them. Its containers' cgroups go under cgroupParent
// (not a server's: a server's scans and cleanups never see them).
func buildRuntime(runsc, cgroupParent string, log *slog.Logger) (*gvisor.Runtime, error) {
	if err := os.MkdirAll("/run/lizard", 0o755); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("/run/lizard", "build-")
	if err != nil {
		return nil, err
	}
	rt, err := gvisor.New(gvisor.Config{Runsc: runsc, StateDir: dir, RunscRoot: filepath.Join(dir, "runsc"), CgroupParent: cgroupParent, Logger: log})
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return rt, nil
}
