package e2b

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"strconv"
	"strings"

	"github.com/lizard-build/lizard/internal/template"
)

// E2B's Template builder (e2b SDK: Template().fromImage(...).runCmd(...)
// ... then Template.build) sends its template as a list of steps, which
// lizard's builder runs (template.BuildSteps): the translation is here.

// buildStart is E2B's TemplateBuildStartV2, the body of POST
// /v2/templates/{templateID}/builds/{buildID}.
type buildStart struct {
	FromImage         string          `json:"fromImage"`
	FromTemplate      string          `json:"fromTemplate"`
	FromImageRegistry json.RawMessage `json:"fromImageRegistry"`
	StartCmd          string          `json:"startCmd"`
	ReadyCmd          string          `json:"readyCmd"`
	Steps             []buildStep     `json:"steps"`
	Force             bool            `json:"force"`
}

// buildStep is E2B's TemplateStep. The SDK sends more fields of its own
// (forceUpload, resolveSymlinks, gzip), which say how it uploads.
type buildStep struct {
	Type      string   `json:"type"`
	Args      []string `json:"args"`
	FilesHash string   `json:"filesHash"`
	Force     bool     `json:"force"`
}

// defaultUser is the account E2B's builds start their steps as, made
// (with passwordless sudo) when the base lacks it, and its sandboxes' user.
const defaultUser = "user"

// copySource is the files a COPY step copies: the archive uploaded under
// Hash, unpacked into the build context's directory Dir.
type copySource struct {
	Dir  string
	Hash string
}

// filesHashRE is what the SDK computes for a COPY step: a hex SHA-256.
var filesHashRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// planBuild translates a build's body into lizard's steps: the COPY steps'
// sources are paths under directories of the build context named by
// copies, which the build unpacks their uploaded archives into. version
// names the template version the build makes. Bad input is ErrInvalid
// naming the field.
func planBuild(req buildStart, version string) (template.Steps, []copySource, error) {
	s := template.Steps{DefaultUser: defaultUser, Force: req.Force, Version: version}
	switch {
	case req.FromImage != "" && req.FromTemplate != "":
		return s, nil, invalid("fromImage and fromTemplate: give one of them, not both")
	case isBaseImage(req.FromImage):
		// Template().fromBaseImage(): E2B's base image is what its base
		// template runs; here that is lizard's base template.
		s.From = "base"
	case req.FromImage != "":
		s.From, s.FromImage = req.FromImage, true
	case req.FromTemplate != "":
		s.From = req.FromTemplate
		if lz, ok := templateAliases[s.From]; ok {
			s.From = lz
		}
	default:
		return s, nil, invalid("fromImage or fromTemplate: required (the image or template to build from)")
	}
	if len(req.FromImageRegistry) > 0 && string(req.FromImageRegistry) != "null" {
		return s, nil, invalid("fromImageRegistry: registry credentials in a build are not supported by lizard: the operator gives the server registry credentials (--registry-auth)")
	}
	var copies []copySource
	for i, st := range req.Steps {
		field := fmt.Sprintf("steps[%d]", i)
		step, err := stepOf(field, st)
		if err != nil {
			return s, nil, err
		}
		if step.Op == template.StepCopy {
			if !filesHashRE.MatchString(st.FilesHash) {
				return s, nil, invalid("%s.filesHash: want the hex SHA-256 of the files the SDK computes, got %q", field, st.FilesHash)
			}
			dir := strconv.Itoa(i)
			copies = append(copies, copySource{Dir: dir, Hash: st.FilesHash})
			// The archive holds the files matched by the source pattern at
			// their paths in the SDK's context: what is copied is the
			// pattern's directory part (all of it for a pattern at the top).
			step.Src = path.Join(dir, patternBase(step.Src))
		}
		s.Steps = append(s.Steps, step)
	}
	if req.StartCmd != "" {
		s.StartCommand = []string{"/bin/sh", "-c", req.StartCmd}
	}
	if req.ReadyCmd != "" {
		if req.StartCmd == "" && req.FromImage != "" {
			return s, nil, invalid("readyCmd: needs a startCmd: the ready command tells when the start command is ready")
		}
		s.ReadyCommand = readyArgv(req.ReadyCmd)
	}
	return s, copies, nil
}

// isBaseImage reports whether ref names E2B's base image (e2bdev/base, what
// the SDK's fromBaseImage() sends), at any tag, on Docker Hub.
func isBaseImage(ref string) bool {
	ref = strings.TrimPrefix(strings.TrimPrefix(ref, "docker.io/"), "index.docker.io/")
	name, _, _ := strings.Cut(ref, "@")
	name, _, _ = strings.Cut(name, ":")
	return name == "e2bdev/base"
}

// stepOf translates one of E2B's steps (args as E2B's builder reads them).
func stepOf(field string, st buildStep) (template.Step, error) {
	op := template.StepOp(strings.ToUpper(st.Type))
	args := st.Args
	arg := func(i int) string {
		if i < len(args) {
			return args[i]
		}
		return ""
	}
	out := template.Step{Op: op, Force: st.Force}
	switch op {
	case template.StepRun: // [command, user?]
		if len(args) < 1 || len(args) > 2 || strings.TrimSpace(args[0]) == "" {
			return out, invalid("%s.args: RUN takes [command] or [command, user]", field)
		}
		out.Command, out.User = args[0], arg(1)
		if out.User != "" && !template.ValidAccount(out.User) {
			return out, invalid("%s.args[1]: user %q: not a valid user name", field, out.User)
		}
	case template.StepCopy: // [src, dest, user?, mode?]
		if len(args) < 2 || len(args) > 4 || args[0] == "" || args[1] == "" {
			return out, invalid("%s.args: COPY takes [source, destination, user, mode]", field)
		}
		out.Src, out.Dest, out.Chown = args[0], args[1], arg(2)
		if path.IsAbs(out.Src) || out.Src == ".." || strings.HasPrefix(out.Src, "../") || strings.Contains(out.Src, "/../") {
			return out, invalid("%s.args[0]: %q: the source must be a path inside the template's file context", field, out.Src)
		}
		if c := out.Chown; c != "" {
			u, g, _ := strings.Cut(c, ":")
			if !template.ValidAccount(u) || (g != "" && !template.ValidAccount(g)) {
				return out, invalid("%s.args[2]: owner %q: want user or user:group", field, c)
			}
		}
		if m := arg(3); m != "" {
			mode, err := strconv.ParseUint(m, 8, 32)
			if err != nil || mode > 0o7777 {
				return out, invalid("%s.args[3]: mode %q: want an octal mode such as 0755", field, m)
			}
			out.Chmod = fs.FileMode(mode)
		}
	case template.StepEnv: // [name, value, name, value, ...]
		if len(args) == 0 || len(args)%2 != 0 {
			return out, invalid("%s.args: ENV takes names and values in pairs", field)
		}
		for i := 0; i < len(args); i += 2 {
			out.Env = append(out.Env, template.EnvVar{Name: args[i], Value: args[i+1]})
		}
	case template.StepWorkdir: // [path]
		if len(args) != 1 || args[0] == "" {
			return out, invalid("%s.args: WORKDIR takes [path]", field)
		}
		out.Path = args[0]
	case template.StepUser: // [name, sudo?]
		if len(args) < 1 || len(args) > 2 || !template.ValidAccount(args[0]) {
			return out, invalid("%s.args: USER takes [name] (lower case letters, digits, '_' and '-'), got %q", field, args)
		}
		out.Name = args[0]
		switch arg(1) {
		case "", "false":
		case "true":
			out.Sudo = true
		default:
			return out, invalid("%s.args[1]: %q: want true or false (passwordless sudo)", field, arg(1))
		}
	default:
		return out, invalid("%s.type: %q: want RUN, COPY, ENV, WORKDIR or USER", field, st.Type)
	}
	return out, nil
}

// patternBase is the directory part of a COPY source pattern, what E2B's
// builder copies from the uploaded files (doublestar's SplitPattern of the
// source with a trailing slash): "app.py" → "app.py", "src/*.py" → "src",
// "*.txt" → ".".
func patternBase(src string) string {
	p := strings.TrimSuffix(src, "/") + "/"
	split := -1
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case c == '\\':
			i++
		case c == '/':
			split = i
		case c == '*' || c == '?' || c == '[' || c == '{':
			i = len(p)
		}
	}
	switch {
	case split == 0:
		return "."
	case split > 0:
		return p[:split]
	}
	return "."
}

var (
	// waitForPortRE is what the SDK's waitForPort(port) sends.
	waitForPortRE = regexp.MustCompile(`^\[ -n "\$\(ss -Htuln sport = :([0-9]{1,5})\)" \]$`)
	// waitForTimeoutRE is what its waitForTimeout(ms) sends.
	waitForTimeoutRE = regexp.MustCompile(`^sleep ([0-9]{1,6})$`)
)

// readyArgv is the ready command of E2B's readyCmd, a shell command run
// until it passes. Two of the SDK's helpers are replaced by checks that
// need nothing of the image but a shell: waitForPort runs ss (iproute2,
// which E2B's builder installs and images often lack; gVisor's netstack
// has no sock_diag for it either), so the port's listening socket is read
// from /proc/net; waitForTimeout runs sleep N, which outlasts lizard's
// per-try limit of 10 s, so it becomes a check that passes N seconds
// after its first try. waitForURL, waitForProcess and waitForFile run as
// they are (curl, pgrep, test).
func readyArgv(cmd string) []string {
	if m := waitForPortRE.FindStringSubmatch(cmd); m != nil {
		if port, err := strconv.Atoi(m[1]); err == nil && port > 0 && port < 65536 {
			return []string{"/bin/sh", "-c", portCheck(port)}
		}
	}
	if m := waitForTimeoutRE.FindStringSubmatch(cmd); m != nil {
		return []string{"/bin/sh", "-c", fmt.Sprintf(`f="${TMPDIR:-/tmp}/.lizard-ready-since"; [ -s "$f" ] || date +%%s > "$f"; [ $(( $(date +%%s) - $(cat "$f") )) -ge %s ] && rm -f "$f"`, m[1])}
	}
	return []string{"/bin/sh", "-c", cmd}
}

// portCheck is a shell script that passes when something listens on port
// (TCP) or is bound to it (UDP), as `ss -Htuln sport = :port` lists them,
// read from /proc/net with nothing but the shell.
func portCheck(port int) string {
	hex := fmt.Sprintf("%04X", port)
	return `for f in /proc/net/tcp /proc/net/tcp6 /proc/net/udp /proc/net/udp6; do [ -r "$f" ] || continue; ` +
		`while read -r _ l _ s _; do case "$l $s" in *":` + hex + ` 0A"|*":` + hex + ` 07") exit 0;; esac; done < "$f"; done; exit 1`
}
