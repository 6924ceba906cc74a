package template

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerfile/shell"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/runtime"
)

// A Dockerfile build turns a Dockerfile into a template: FROM names a
// template of the registry, RUN steps run inside a gVisor sandbox, COPY and
// ADD take files from the build context, and ENV, WORKDIR, USER and CMD
// become the template's metadata. Every instruction is a link of a key
// chain (see stepKey); instructions that change the filesystem (RUN, COPY,
// ADD) leave a layer, a complete rootfs stored under its key, so a rebuild
// starts from the last layer whose key has not changed.

// layerSchema is part of every key: changing how layers are made changes it,
// so old layers are never reused by a builder that would make them
// differently.
const layerSchema = "lizard-layer-v1"

// DockerfileOptions are the inputs of a Dockerfile build.
type DockerfileOptions struct {
	// Dockerfile is the Dockerfile's text.
	Dockerfile []byte
	// DockerfileName is how progress and errors name it (e.g. its path).
	DockerfileName string
	// Context is the build context directory COPY and ADD read from.
	Context string
	// BuildArgs are the values of ARGs (--build-arg NAME=VALUE).
	BuildArgs map[string]string
	// Runtime runs the RUN steps: the node's runtime, each step a
	// container on the build network whose root is the layer.
	Runtime runtime.Runner
	// DNSUpstream is where the build network's resolver forwards ("" means
	// the host's first nameserver).
	DNSUpstream string
	// BuildBridge and BuildSubnet are the build network's bridge and
	// subnet (zero: DefaultBuildBridge, DefaultBuildSubnet); BuildDeny are
	// more destinations RUN steps never reach (the sandboxes' subnet).
	BuildBridge string
	BuildSubnet netip.Prefix
	BuildDeny   []netip.Prefix
	// NetnsPrefix is the prefix of the RUN steps' network namespaces'
	// names ("" means network.DefaultNetnsPrefix): servers sharing a host
	// pass their own (--cgroup-parent). Their cgroups are Runtime's.
	NetnsPrefix string
	// Pull says which registries FROM may pull images from and with what
	// credentials; nil: public addresses only, anonymously.
	Pull *PullPolicy
	// Logger gets what clients are not told: why a pull failed. nil:
	// slog.Default().
	Logger *slog.Logger
	// RunCommand runs one runsc command to its end; nil means cmd.Run. A
	// process that is a child subreaper (lizard serve) passes its reaper's
	// Run so that the runsc processes it adopts are reaped without stealing
	// the statuses of the commands it waits for.
	RunCommand RunFunc
	// ReadyCommand, when set, replaces the Dockerfile's HEALTHCHECK as the
	// test that the start command is ready (run by /bin/sh -c).
	ReadyCommand string
	// BeforeSwitch, when set, is called once the new version is complete
	// at its final place (t.Rootfs is the path it keeps; t is what Get
	// will return) but before the template's name is switched to it, with
	// the build lock still held; progress is the build's. If it fails, so
	// does the build, with its error: the new version is removed and the
	// template's current version stays as it was.
	BeforeSwitch func(ctx context.Context, t Template, progress io.Writer) error
}

// BuildNetwork is the network a build's steps run on: a bridge and subnet
// of their own with NAT to the internet, behind the sandboxes' firewall.
// Zero fields are the defaults (DefaultBuildBridge, DefaultBuildSubnet, the
// host's first nameserver, network.DefaultNetnsPrefix).
type BuildNetwork struct {
	Bridge string
	Subnet netip.Prefix
	// Deny are more destinations steps never reach (the sandboxes'
	// subnet).
	Deny []netip.Prefix
	// NetnsPrefix prefixes the steps' network namespaces' names.
	NetnsPrefix string
	// DNSUpstream is where the network's resolver forwards.
	DNSUpstream string
}

// Network returns the build network o says.
func (o DockerfileOptions) Network() BuildNetwork {
	return BuildNetwork{Bridge: o.BuildBridge, Subnet: o.BuildSubnet, Deny: o.BuildDeny, NetnsPrefix: o.NetnsPrefix, DNSUpstream: o.DNSUpstream}
}

// RunFunc runs a command to its end, like (*exec.Cmd).Run.
type RunFunc func(*exec.Cmd) error

// combinedOutput runs cmd with run (nil: cmd.Run), like cmd.CombinedOutput:
// in a server that is a child subreaper, a command not run through its
// reaper could have its exit status reaped from under it ("waitid: no child
// processes").
func combinedOutput(run RunFunc, cmd *exec.Cmd) ([]byte, error) {
	if run == nil {
		return cmd.CombinedOutput()
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := run(cmd)
	return out.Bytes(), err
}

// stepKind says what an instruction does to the build.
type stepKind int

const (
	stepMeta stepKind = iota // only the key chain and the image config
	stepRun
	stepCopy
	// stepUser (Steps builds) makes its user when the rootfs lacks it:
	// Argv, run as root, makes it; a user already there is only the key
	// chain's.
	stepUser
)

// dfStep is one instruction after FROM, with the build state in effect for
// it.
type dfStep struct {
	Line int
	Op   string // upper case: RUN, COPY, ADD, ENV, ...
	Text string // the instruction as written, on one line
	Kind stepKind
	// KeyText is what the step contributes to its key, besides the parent's
	// key (and for COPY/ADD the content of the sources).
	KeyText string

	// RUN: the argv (shell form is the SHELL plus the command).
	Argv []string
	// COPY and ADD: sources relative to the context, the destination
	// (absolute, in the rootfs), --chown and --chmod.
	Srcs  []string
	Dest  string
	Chown string
	Chmod fs.FileMode
	Add   bool

	// The state the step runs in: the environment (ENV, and for RUN the
	// ARGs too), the working directory ("" in Steps builds before any
	// WORKDIR: the user's home) and the user ("" is root).
	Env     []string
	Workdir string
	User    string
	// WorkdirOwner (Steps builds) is who owns the directories made for
	// Workdir ("" root).
	WorkdirOwner string
}

// dfPlan is a parsed Dockerfile: its base, its steps and the template's
// configuration at the end.
type dfPlan struct {
	From     string
	FromLine int
	FromKey  string // the base's key: the first link of the chain
	Steps    []dfStep

	// Final configuration.
	Env          []string // the template's environment (ENV over the base's)
	Workdir      string   // "" if no WORKDIR
	User         string   // "" if no USER
	StartCommand []string // ENTRYPOINT + CMD; nil if neither
	// Entrypoint and Cmd are its two parts, which a Dockerfile FROM this
	// template changes apart.
	Entrypoint, Cmd []string
	// ReadyCommand is HEALTHCHECK's CMD: the start command is ready once it
	// exits 0. nil if none (or HEALTHCHECK NONE).
	ReadyCommand []string
	// WorkdirOwner owns the directories made for Workdir ("" root).
	WorkdirOwner string

	Warnings []string

	// steps: the plan is of a Steps build, whose Line numbers steps
	// rather than Dockerfile lines.
	steps bool
}

// looksLikeImage tells an image reference from a template name: it has a
// registry, a tag or a digest. A bare name is a template's.
func looksLikeImage(from string) bool { return strings.ContainsAny(from, "/:@") }

// baseInfo is what a build starts from: the configuration of the template
// (or image) FROM names, which the Dockerfile's instructions change, and a
// key identifying its exact build (or image digest).
type baseInfo struct {
	Key        string
	Env        []string
	Workdir    string // "" if none
	User       string
	Entrypoint []string
	Cmd        []string
	Ready      []string // its ready command (HEALTHCHECK CMD)
}

// baseResolver finds what FROM names.
type baseResolver func(name string, line int) (baseInfo, error)

// dfError is a Dockerfile error at a line.
func dfError(file string, line int, format string, args ...any) error {
	return fmt.Errorf("%s:%d: %s: %w", file, line, fmt.Sprintf(format, args...), errdefs.ErrInvalid)
}

// defaultShell is what shell-form RUN, CMD and ENTRYPOINT run with unless
// SHELL says otherwise.
var defaultShell = []string{"/bin/sh", "-c"}

// parseDockerfile parses a Dockerfile with buildkit's parser and plans the
// build: ARGs are given their values (buildArgs, else their defaults) and
// every word the Dockerfile's rules expand is expanded.
func parseDockerfile(file string, data []byte, buildArgs map[string]string, resolve baseResolver) (*dfPlan, error) {
	res, err := parser.Parse(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("%s: %v: %w", file, err, errdefs.ErrInvalid)
	}
	p := &dfPlan{}
	for _, w := range res.Warnings {
		p.Warnings = append(p.Warnings, w.Short)
	}
	lex := shell.NewLex(res.EscapeToken)
	usedArgs := map[string]bool{}

	// Build state.
	var (
		globalArgs []string // ARGs before FROM: only FROM sees them
		args       []string // ARGs of the stage, "NAME=value"
		env        []string // ENV, over the base's
		workdir    = "/"
		user       string
		sh         = defaultShell
		cmd, entry []string
		ready      []string
		seenFrom   bool
		setWorkdir bool
	)
	argValue := func(name string, def *string, scope []string) (string, bool) {
		if v, ok := buildArgs[name]; ok {
			usedArgs[name] = true
			return v, true
		}
		if def != nil {
			return *def, true
		}
		// A global ARG redeclared in the stage without a default takes the
		// global value.
		if v, ok := lookupEnv(scope, name); ok {
			return v, true
		}
		return "", false
	}
	for _, n := range res.AST.Children {
		op := strings.ToUpper(n.Value)
		line := n.StartLine
		text := oneLine(n.Original)
		// What words expand with: ARGs, then ENV over them.
		expEnv := mergeEnv(args, env)
		if !seenFrom {
			expEnv = globalArgs
		}
		expand := func(word string) (string, error) {
			s, _, err := lex.ProcessWord(word, shell.EnvsFromSlice(expEnv))
			if err != nil {
				return "", dfError(file, line, "%s: %v", op, err)
			}
			return s, nil
		}
		if len(n.Heredocs) > 0 && op != "RUN" {
			return nil, dfError(file, line, "%s with a heredoc is not supported (only RUN takes heredocs)", op)
		}
		if !seenFrom && op != "ARG" && op != "FROM" {
			return nil, dfError(file, line, "%s before FROM: a Dockerfile starts with FROM (only ARG may come before it)", op)
		}
		if err := checkFlags(file, line, op, n.Flags); err != nil {
			return nil, err
		}
		st := dfStep{Line: line, Op: op, Text: text}
		switch op {
		case "ARG":
			if n.Next == nil {
				return nil, dfError(file, line, "ARG needs a name")
			}
			var keys []string
			for a := n.Next; a != nil; a = a.Next {
				name, def, hasDef := strings.Cut(a.Value, "=")
				var defp *string
				if hasDef {
					d, err := expand(def)
					if err != nil {
						return nil, err
					}
					defp = &d
				}
				if !validEnvName(name) {
					return nil, dfError(file, line, "ARG %q: not a valid name", name)
				}
				v, ok := argValue(name, defp, globalArgs)
				if !seenFrom {
					if ok {
						globalArgs = setEnv(globalArgs, name, v)
					}
					continue
				}
				if ok {
					args = setEnv(args, name, v)
					keys = append(keys, name+"="+v)
				} else {
					keys = append(keys, name)
				}
			}
			if !seenFrom {
				continue
			}
			st.KeyText = "ARG " + strings.Join(keys, " ")
		case "FROM":
			if seenFrom {
				return nil, dfError(file, line, "a second FROM: multi-stage builds are not supported")
			}
			var words []string
			for a := n.Next; a != nil; a = a.Next {
				words = append(words, a.Value)
			}
			if len(words) != 1 && !(len(words) == 3 && strings.EqualFold(words[1], "AS")) {
				return nil, dfError(file, line, "FROM takes one template name (optionally AS NAME)")
			}
			from, err := expand(words[0])
			if err != nil {
				return nil, err
			}
			base, err := resolve(from, line)
			if err != nil {
				return nil, err
			}
			seenFrom = true
			p.From, p.FromLine, p.FromKey = from, line, base.Key
			// The base's configuration carries over, as in Docker.
			env = append([]string(nil), base.Env...)
			if base.Workdir != "" {
				workdir, setWorkdir = base.Workdir, true
			}
			user, entry, cmd, ready = base.User, base.Entrypoint, base.Cmd, base.Ready
			continue
		case "RUN":
			argv, err := commandArgv(file, line, n, sh)
			if err != nil {
				return nil, err
			}
			st.Kind = stepRun
			st.Argv = argv
			st.Env = mergeEnv(args, env)
			st.Workdir, st.User = workdir, user
			kb, _ := json.Marshal(struct {
				Argv    []string
				Env     []string
				Workdir string
				User    string
			}{argv, st.Env, workdir, user})
			st.KeyText = "RUN " + string(kb)
		case "COPY", "ADD":
			var words []string
			for a := n.Next; a != nil; a = a.Next {
				w, err := expand(a.Value)
				if err != nil {
					return nil, err
				}
				words = append(words, w)
			}
			if len(words) < 2 {
				return nil, dfError(file, line, "%s needs at least one source and a destination", op)
			}
			srcs, dest := words[:len(words)-1], words[len(words)-1]
			for i, s := range srcs {
				if isURL(s) {
					if op == "ADD" {
						return nil, dfError(file, line, "ADD %s: adding URLs is not supported (the builder does not download from the host; use RUN curl or RUN wget inside the build)", s)
					}
					return nil, dfError(file, line, "COPY %s: sources are paths in the build context", s)
				}
				c, err := contextPath(s)
				if err != nil {
					return nil, dfError(file, line, "%s %s: %v", op, s, err)
				}
				srcs[i] = c
			}
			if !path.IsAbs(dest) {
				trailing := strings.HasSuffix(dest, "/") || dest == "." || strings.HasSuffix(dest, "/.")
				dest = path.Join(workdir, dest)
				if trailing && dest != "/" {
					dest += "/"
				}
			}
			if len(srcs) > 1 && !strings.HasSuffix(dest, "/") {
				return nil, dfError(file, line, "%s with more than one source needs a destination ending with /", op)
			}
			st.Kind = stepCopy
			st.Srcs, st.Dest, st.Add = srcs, dest, op == "ADD"
			st.Env, st.Workdir, st.User = mergeEnv(args, env), workdir, user
			for _, f := range n.Flags {
				k, v, _ := strings.Cut(strings.TrimPrefix(f, "--"), "=")
				v, err := expand(v)
				if err != nil {
					return nil, err
				}
				switch k {
				case "chown":
					st.Chown = v
				case "chmod":
					m, err := strconv.ParseUint(v, 8, 32)
					if err != nil || m > 0o7777 {
						return nil, dfError(file, line, "%s --chmod=%s: need an octal mode like 0755", op, v)
					}
					st.Chmod = fs.FileMode(m)
				}
			}
			kb, _ := json.Marshal(struct {
				Srcs  []string
				Dest  string
				Chown string
				Chmod uint32
				Add   bool
			}{srcs, dest, st.Chown, uint32(st.Chmod), st.Add})
			st.KeyText = op + " " + string(kb)
		case "ENV":
			if n.Next == nil {
				return nil, dfError(file, line, "ENV needs NAME=VALUE")
			}
			var kv []string
			// All values of one ENV expand with the environment before it.
			for a := n.Next; a != nil && a.Next != nil; a = a.Next.Next.Next {
				name := a.Value
				if !validEnvName(name) {
					return nil, dfError(file, line, "ENV %q: not a valid name", name)
				}
				v, err := expand(a.Next.Value)
				if err != nil {
					return nil, err
				}
				kv = append(kv, name+"="+v)
				if a.Next.Next == nil {
					break
				}
			}
			for _, e := range kv {
				k, v, _ := strings.Cut(e, "=")
				env = setEnv(env, k, v)
			}
			st.KeyText = "ENV " + strings.Join(kv, "\x00")
		case "WORKDIR":
			if n.Next == nil {
				return nil, dfError(file, line, "WORKDIR needs a path")
			}
			w, err := expand(n.Next.Value)
			if err != nil {
				return nil, err
			}
			if !path.IsAbs(w) {
				w = path.Join(workdir, w)
			}
			workdir = path.Clean(w)
			setWorkdir = true
			st.KeyText = "WORKDIR " + workdir
		case "USER":
			if n.Next == nil {
				return nil, dfError(file, line, "USER needs a user")
			}
			u, err := expand(n.Next.Value)
			if err != nil {
				return nil, err
			}
			if u == "" || strings.ContainsAny(u, " \t") {
				return nil, dfError(file, line, "USER %q: need user[:group]", u)
			}
			user = u
			st.KeyText = "USER " + user
		case "SHELL":
			if !n.Attributes["json"] {
				return nil, dfError(file, line, "SHELL takes the JSON form, e.g. SHELL [\"/bin/bash\", \"-c\"]")
			}
			sh = nil
			for a := n.Next; a != nil; a = a.Next {
				sh = append(sh, a.Value)
			}
			if len(sh) == 0 {
				return nil, dfError(file, line, "SHELL needs a program")
			}
			st.KeyText = "SHELL " + strings.Join(sh, "\x00")
		case "CMD", "ENTRYPOINT":
			argv, err := commandArgv(file, line, n, sh)
			if err != nil {
				return nil, err
			}
			if op == "CMD" {
				cmd = argv
			} else {
				entry = argv
				// As in Docker: ENTRYPOINT resets a CMD of the base and of
				// earlier lines.
				cmd = nil
			}
			kb, _ := json.Marshal(argv)
			st.KeyText = op + " " + string(kb)
		case "LABEL", "EXPOSE", "MAINTAINER", "STOPSIGNAL":
			p.Warnings = append(p.Warnings, fmt.Sprintf("%s:%d: %s is ignored (templates have no image metadata)", file, line, op))
			continue
		case "HEALTHCHECK":
			argv, err := healthcheck(file, line, n, sh)
			if err != nil {
				return nil, err
			}
			if len(n.Flags) > 0 {
				p.Warnings = append(p.Warnings, fmt.Sprintf("%s:%d: HEALTHCHECK options %s are ignored: at build the check runs every 0.1 s until it passes", file, line, strings.Join(n.Flags, " ")))
			}
			ready = argv
			kb, _ := json.Marshal(argv)
			st.KeyText = op + " " + string(kb)
		case "VOLUME", "ONBUILD":
			return nil, dfError(file, line, "%s is not supported in template builds", op)
		default:
			return nil, dfError(file, line, "unknown instruction %s", n.Value)
		}
		p.Steps = append(p.Steps, st)
	}
	if !seenFrom {
		return nil, fmt.Errorf("%s: no FROM: %w", file, errdefs.ErrInvalid)
	}
	for name := range buildArgs {
		if !usedArgs[name] {
			p.Warnings = append(p.Warnings, fmt.Sprintf("build arg %s was not consumed by any ARG", name))
		}
	}
	p.Env = env
	if setWorkdir {
		p.Workdir = workdir
	}
	p.User = user
	if len(entry)+len(cmd) > 0 {
		p.StartCommand = append(append([]string(nil), entry...), cmd...)
		p.Entrypoint, p.Cmd = entry, cmd
	}
	if len(ready) > 0 && len(p.StartCommand) == 0 {
		return nil, fmt.Errorf("%s: HEALTHCHECK without CMD or ENTRYPOINT: the check is of the start command: %w", file, errdefs.ErrInvalid)
	}
	p.ReadyCommand = ready
	return p, nil
}

// healthcheck is the command of HEALTHCHECK CMD ...; nil for HEALTHCHECK
// NONE.
func healthcheck(file string, line int, n *parser.Node, sh []string) ([]string, error) {
	if n.Next == nil {
		return nil, dfError(file, line, "HEALTHCHECK needs CMD or NONE")
	}
	switch strings.ToUpper(n.Next.Value) {
	case "NONE":
		if n.Next.Next != nil {
			return nil, dfError(file, line, "HEALTHCHECK NONE takes no arguments")
		}
		return nil, nil
	case "CMD":
		return commandArgv(file, line, &parser.Node{Value: "HEALTHCHECK CMD", Next: n.Next.Next, Attributes: n.Attributes}, sh)
	}
	return nil, dfError(file, line, "HEALTHCHECK %s: need CMD or NONE", n.Next.Value)
}

// checkFlags rejects the instruction flags this builder does not honour,
// rather than build something other than what the Dockerfile says.
func checkFlags(file string, line int, op string, flags []string) error {
	for _, f := range flags {
		k, _, _ := strings.Cut(strings.TrimPrefix(f, "--"), "=")
		switch {
		case (op == "COPY" || op == "ADD") && (k == "chown" || k == "chmod"):
		case (op == "COPY" || op == "ADD") && k == "from":
			return dfError(file, line, "%s --from: multi-stage builds are not supported", op)
		case op == "HEALTHCHECK" && (k == "interval" || k == "timeout" || k == "start-period" || k == "start-interval" || k == "retries"):
		case op == "FROM" && k == "platform":
			return dfError(file, line, "FROM --platform is not supported (templates are built for this host)")
		default:
			return dfError(file, line, "%s %s is not supported", op, f)
		}
	}
	return nil
}

// commandArgv is the argv of a RUN, CMD or ENTRYPOINT: the exec (JSON) form
// as it is, the shell form run by the shell. A RUN heredoc (RUN <<EOF) is
// the script given to the shell; heredocs feeding a command (RUN cat <<EOF
// > f) are passed to the shell with the command, which then reads them.
func commandArgv(file string, line int, n *parser.Node, sh []string) ([]string, error) {
	op := strings.ToUpper(n.Value)
	if n.Attributes["json"] {
		var argv []string
		for a := n.Next; a != nil; a = a.Next {
			argv = append(argv, a.Value)
		}
		if len(argv) == 0 {
			return nil, dfError(file, line, "%s needs a command", op)
		}
		return argv, nil
	}
	if n.Next == nil || strings.TrimSpace(n.Next.Value) == "" {
		return nil, dfError(file, line, "%s needs a command", op)
	}
	script := n.Next.Value
	if len(n.Heredocs) > 0 {
		trimmed := strings.TrimSpace(script)
		if len(n.Heredocs) == 1 && strings.HasPrefix(trimmed, "<<") && !strings.ContainsAny(strings.TrimLeft(trimmed, "<-"), " \t") {
			script = n.Heredocs[0].Content
		} else {
			var b strings.Builder
			b.WriteString(script)
			for _, h := range n.Heredocs {
				b.WriteString("\n")
				b.WriteString(h.Content)
				if !strings.HasSuffix(h.Content, "\n") && h.Content != "" {
					b.WriteString("\n")
				}
				b.WriteString(h.Name)
			}
			script = b.String()
		}
	}
	return append(append([]string(nil), sh...), script), nil
}

// oneLine is an instruction's text for progress: continuation lines joined.
func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

func isURL(s string) bool {
	for _, p := range []string{"http://", "https://", "git://", "git@", "ssh://", "ftp://"} {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// contextPath cleans a COPY/ADD source to a path relative to the context
// root; a source may not leave the context.
func contextPath(s string) (string, error) {
	c := path.Clean("/" + s)
	if strings.Contains(s, "..") {
		// "/../x" cleans to "/x": refuse it rather than reinterpret it.
		if p := path.Clean(s); p == ".." || strings.HasPrefix(p, "../") || strings.HasPrefix(p, "/..") {
			return "", errors.New("outside the build context")
		}
	}
	c = strings.TrimPrefix(c, "/")
	if c == "" {
		c = "."
	}
	return c, nil
}

func validEnvName(s string) bool {
	if s == "" {
		return false
	}
	for i, c := range s {
		if !(c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

func lookupEnv(env []string, name string) (string, bool) {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, _ := strings.Cut(env[i], "="); k == name {
			return v, true
		}
	}
	return "", false
}

// setEnv sets name in env, keeping the position of an existing entry.
func setEnv(env []string, name, value string) []string {
	out := append([]string(nil), env...)
	for i, kv := range out {
		if k, _, _ := strings.Cut(kv, "="); k == name {
			out[i] = name + "=" + value
			return out
		}
	}
	return append(out, name+"="+value)
}

// mergeEnv is base with over's entries set over it.
func mergeEnv(base, over []string) []string {
	out := append([]string(nil), base...)
	for _, kv := range over {
		k, v, _ := strings.Cut(kv, "=")
		out = setEnv(out, k, v)
	}
	return out
}

// stepKey is the key of a step: the hash of its parent's key, its key text
// and, for COPY and ADD, the hash of the sources' content.
func stepKey(parent, keyText, content string) string {
	h := sha256.New()
	io.WriteString(h, layerSchema+"\n"+parent+"\n"+keyText+"\n"+content)
	return hex.EncodeToString(h.Sum(nil))
}

// fromKey is the first key of the chain: the base template's exact build.
func fromKey(name, version string, builtAt string) string {
	return stepKey("", "FROM "+name, version+"\n"+builtAt)
}

// contextSource is one file or directory a COPY/ADD source names.
type contextSource struct {
	Rel string // relative to the context root
	Abs string // on the host
}

// expandSources resolves COPY/ADD sources (which may hold wildcards) to
// paths under the context root. Symbolic links in the context are copied
// as links, so sources are never followed out of it.
func expandSources(root string, srcs []string) ([]contextSource, error) {
	var out []contextSource
	for _, s := range srcs {
		var rels []string
		if strings.ContainsAny(s, "*?[") {
			ms, err := filepath.Glob(filepath.Join(root, filepath.FromSlash(s)))
			if err != nil {
				return nil, fmt.Errorf("%s: %v: %w", s, err, errdefs.ErrInvalid)
			}
			if len(ms) == 0 {
				return nil, fmt.Errorf("%s: no file in the build context matches: %w", s, errdefs.ErrNotFound)
			}
			for _, m := range ms {
				rel, err := filepath.Rel(root, m)
				if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
					return nil, fmt.Errorf("%s: outside the build context: %w", s, errdefs.ErrInvalid)
				}
				rels = append(rels, filepath.ToSlash(rel))
			}
		} else {
			rels = []string{s}
		}
		for _, rel := range rels {
			abs := filepath.Join(root, filepath.FromSlash(rel))
			if err := noSymlinkParents(root, rel); err != nil {
				return nil, fmt.Errorf("%s: %w", s, err)
			}
			if _, err := os.Lstat(abs); err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil, fmt.Errorf("%s: not found in the build context %s: %w", s, root, errdefs.ErrNotFound)
				}
				return nil, err
			}
			out = append(out, contextSource{Rel: rel, Abs: abs})
		}
	}
	return out, nil
}

// noSymlinkParents refuses a source reached through a symbolic link in
// the context (which could point anywhere on the host).
func noSymlinkParents(root, rel string) error {
	parts := strings.Split(rel, "/")
	p := root
	for _, part := range parts[:len(parts)-1] {
		if part == "." || part == "" {
			continue
		}
		p = filepath.Join(p, part)
		fi, err := os.Lstat(p)
		if err != nil {
			return nil // reported by the caller's Lstat
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return fmt.Errorf("goes through the symbolic link %s: %w", p, errdefs.ErrInvalid)
		}
	}
	return nil
}

// hashSources hashes what COPY/ADD would copy: every path under the
// sources (relative), its type, mode, link target and content. It returns
// the hash and the number of bytes of regular files.
func hashSources(srcs []contextSource) (string, int64, error) {
	h := sha256.New()
	var total int64
	for _, s := range srcs {
		err := filepath.WalkDir(s.Abs, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(s.Abs, p)
			info, err := d.Info()
			if err != nil {
				return err
			}
			fmt.Fprintf(h, "%s\x00%s\x00%o\x00", s.Rel, filepath.ToSlash(rel), uint32(info.Mode()))
			switch {
			case info.Mode()&fs.ModeSymlink != 0:
				t, err := os.Readlink(p)
				if err != nil {
					return err
				}
				fmt.Fprintf(h, "link %s\x00", t)
			case info.Mode().IsRegular():
				f, err := os.Open(p)
				if err != nil {
					return err
				}
				n, err := io.Copy(h, f)
				f.Close()
				if err != nil {
					return err
				}
				total += n
				fmt.Fprintf(h, "\x00%d\x00", n)
			}
			return nil
		})
		if err != nil {
			return "", 0, err
		}
	}
	return hex.EncodeToString(h.Sum(nil)), total, nil
}
