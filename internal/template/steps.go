package template

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"regexp"
	"strings"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// A build can also be given as a list of steps instead of a Dockerfile:
// E2B's Template builder sends one (internal/e2b). The steps are planned
// into the Dockerfile builder's own representation (dfPlan), so they run
// the same way — the same layer cache and key chain, RUN in a sandbox of
// the node's runtime, COPY from a context directory —, with the rules of
// E2B's builder where they differ from Docker's:
//
//   - a build from an image takes only its environment (E2B ignores the
//     image's WORKDIR, USER and CMD); one from a template takes its
//     environment, workdir, user and start command;
//   - DefaultUser, when set, is made (with passwordless sudo) if the base
//     lacks it and is the user the steps start as;
//   - USER makes the account when the rootfs lacks it;
//   - with no WORKDIR yet, commands run in the user's home, and a COPY's
//     relative destination is relative to it;
//   - COPY without an owner gives the files to the current user, and the
//     directories WORKDIR makes are the current user's (Docker: root's);
//   - ENV values expand $VAR with the environment before the step;
//   - a step with Force, and every step after it, is built afresh.

// StepOp is what a step does.
type StepOp string

// The operations of a step.
const (
	StepRun     StepOp = "RUN"
	StepCopy    StepOp = "COPY"
	StepEnv     StepOp = "ENV"
	StepWorkdir StepOp = "WORKDIR"
	StepUser    StepOp = "USER"
)

// Step is one step of a Steps build. Which fields count depends on Op.
type Step struct {
	Op StepOp
	// RUN: Command is run by /bin/sh -c, as User when set (for that step
	// only), else as the current user.
	Command string
	User    string
	// COPY: Src is a path in the build context (a directory's contents are
	// copied), Dest the destination (ending with / for a directory; a
	// relative one is relative to the workdir), Chown user[:group] (""
	// the current user), Chmod the mode of what is copied (0 keeps it).
	Src, Dest string
	Chown     string
	Chmod     fs.FileMode
	// ENV: the variables set, in order.
	Env []EnvVar
	// WORKDIR: Path (relative: to the current workdir, or /).
	Path string
	// USER: Name, the account the next steps and the template run as;
	// Sudo gives it passwordless sudo when the step makes it.
	Name string
	Sudo bool
	// Force builds this step and the ones after it afresh.
	Force bool
}

// EnvVar is one variable of an ENV step.
type EnvVar struct{ Name, Value string }

// Steps is a build given as steps (see BuildSteps).
type Steps struct {
	// From is the base: a template of the registry (a built-in one or
	// the project's), or with FromImage an image reference, pulled through
	// DockerfileOptions.Pull.
	From      string
	FromImage bool
	Steps     []Step
	// StartCommand is the template's start command (nil: the base
	// template's), ReadyCommand what tells it is ready (nil with a start
	// command: it listens on a new port; see Template.ReadyCommand).
	StartCommand []string
	ReadyCommand []string
	// DefaultUser, when set, is the account the steps start as, made with
	// passwordless sudo when the base lacks it.
	DefaultUser string
	// Force builds every step afresh (no layer of the cache is reused;
	// the image is not pulled again).
	Force bool
	// Version names the new version (default: as a Dockerfile build's):
	// 1 to 64 letters, digits, '.', '_' and '-'.
	Version string
}

// StepError is the error of a Steps build that failed at a step: Step is
// its index in Steps.Steps plus one, 0 for what the build does before the
// steps (the base, DefaultUser), len(Steps.Steps)+1 for what it does after
// them (the start and ready commands: DockerfileOptions.BeforeSwitch).
type StepError struct {
	Step int
	Err  error
}

func (e *StepError) Error() string { return e.Err.Error() }
func (e *StepError) Unwrap() error { return e.Err }

// FailedStep returns the step a Steps build's error names (see
// StepError), and whether it names one.
func FailedStep(err error) (int, bool) {
	var se *StepError
	if errors.As(err, &se) {
		return se.Step, true
	}
	return 0, false
}

// stepError wraps err as a failure of step n.
func stepError(n int, err error) error {
	if _, ok := FailedStep(err); ok {
		return err
	}
	return &StepError{Step: n, Err: err}
}

var (
	// accountRE is what USER and DefaultUser may name: a user name as
	// useradd takes it.
	accountRE = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)
	versionRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)
)

// ValidAccount reports whether name may be made by USER: lower case
// letters, digits, '_' and '-', starting with a letter or '_', at most 32
// characters.
func ValidAccount(name string) bool { return accountRE.MatchString(name) }

// stepsError is an invalid step: ErrInvalid naming it.
func stepsError(n int, op StepOp, format string, args ...any) error {
	return stepError(n, fmt.Errorf("step %d (%s): %s: %w", n, op, fmt.Sprintf(format, args...), errdefs.ErrInvalid))
}

// ensureUserScript makes account $1 when the rootfs lacks it (useradd, or
// busybox's adduser), with passwordless sudo when $2 is "sudo".
const ensureUserScript = `id -u "$1" >/dev/null 2>&1 && exit 0
if command -v useradd >/dev/null 2>&1; then useradd --create-home --shell /bin/bash "$1" || exit 1
elif command -v adduser >/dev/null 2>&1; then adduser -D "$1" || exit 1
else echo "cannot make user $1: the image has neither useradd nor adduser" >&2; exit 1; fi
if [ "$2" = sudo ]; then mkdir -p /etc/sudoers.d && echo "$1 ALL=(ALL:ALL) NOPASSWD: ALL" > "/etc/sudoers.d/$1" && chmod 0440 "/etc/sudoers.d/$1"; fi`

// ensureUserArgv is the command of a step that makes account name.
func ensureUserArgv(name string, sudo bool) []string {
	s := ""
	if sudo {
		s = "sudo"
	}
	return []string{"/bin/sh", "-c", ensureUserScript, "lizard-user", name, s}
}

// salt is a random key part: a forced step's key is one no layer has.
func salt() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// planSteps plans a Steps build from base (what From resolved to; for an
// image only its Env and Key count) into the Dockerfile builder's
// representation. Steps are numbered from 1 in dfStep.Line; what the build
// adds before them (DefaultUser) is line 0.
func planSteps(s Steps, base baseInfo) (*dfPlan, error) {
	if s.Version != "" && !versionRE.MatchString(s.Version) {
		return nil, fmt.Errorf("version %q: want 1 to 64 letters, digits, '.', '_' and '-': %w", s.Version, errdefs.ErrInvalid)
	}
	p := &dfPlan{From: s.From, FromKey: base.Key, steps: true}
	if s.Force {
		p.FromKey = stepKey(base.Key, "FORCE "+salt(), "")
	}
	var (
		env          = append([]string(nil), base.Env...)
		workdir      = ""
		workdirOwner = ""
		user         = ""
		sh           = defaultShell
	)
	if !s.FromImage {
		workdir, user = base.Workdir, base.User
	}
	// A forced step's key is one no layer has; the keys of the steps
	// after it follow from it, so they are built afresh too.
	keyText := func(force bool, v any) string {
		b, _ := json.Marshal(v)
		if force {
			return string(b) + " FORCE " + salt()
		}
		return string(b)
	}
	if s.DefaultUser != "" {
		if !ValidAccount(s.DefaultUser) {
			return nil, stepError(0, fmt.Errorf("default user %q: not a valid user name: %w", s.DefaultUser, errdefs.ErrInvalid))
		}
		user = s.DefaultUser
		p.Steps = append(p.Steps, dfStep{Line: 0, Op: "USER", Text: "USER " + user + " (made if missing, with sudo)", Kind: stepUser,
			User: user, Argv: ensureUserArgv(user, true), KeyText: "USER " + keyText(false, []any{user, "sudo"})})
	}
	for i, st := range s.Steps {
		n := i + 1
		d := dfStep{Line: n, Op: string(st.Op), Env: env, Workdir: workdir, User: user, WorkdirOwner: workdirOwner}
		switch st.Op {
		case StepRun:
			if strings.TrimSpace(st.Command) == "" {
				return nil, stepsError(n, st.Op, "needs a command")
			}
			if st.User != "" {
				if !ValidAccount(st.User) {
					return nil, stepsError(n, st.Op, "user %q: not a valid user name", st.User)
				}
				d.User = st.User
			}
			d.Kind, d.Argv = stepRun, append(append([]string(nil), sh...), st.Command)
			d.Text = "RUN " + oneLine(st.Command)
			if st.User != "" {
				d.Text += " (as " + st.User + ")"
			}
			d.KeyText = "RUN " + keyText(st.Force, struct {
				Argv    []string
				Env     []string
				Workdir string
				User    string
			}{d.Argv, d.Env, workdir, d.User})
		case StepCopy:
			if st.Src == "" || st.Dest == "" {
				return nil, stepsError(n, st.Op, "needs a source and a destination")
			}
			src, err := contextPath(st.Src)
			if err != nil {
				return nil, stepsError(n, st.Op, "%s: %v", st.Src, err)
			}
			if st.Chmod > 0o7777 {
				return nil, stepsError(n, st.Op, "mode %o: want at most 7777", uint32(st.Chmod))
			}
			chown := st.Chown
			if chown == "" {
				chown = user
			}
			if chown != "" && strings.ContainsAny(chown, " \t\n") {
				return nil, stepsError(n, st.Op, "owner %q: want user[:group]", chown)
			}
			dest := st.Dest
			if path.IsAbs(dest) {
				trailing := strings.HasSuffix(dest, "/")
				if dest = path.Clean(dest); trailing && dest != "/" {
					dest += "/"
				}
			}
			d.Kind, d.Srcs, d.Dest, d.Chown, d.Chmod = stepCopy, []string{src}, dest, chown, st.Chmod
			d.Text = "COPY " + st.Src + " " + st.Dest
			d.KeyText = "COPY " + keyText(st.Force, struct {
				Srcs    []string
				Dest    string
				Chown   string
				Chmod   uint32
				Workdir string
			}{d.Srcs, dest, chown, uint32(st.Chmod), workdir})
		case StepEnv:
			if len(st.Env) == 0 {
				return nil, stepsError(n, st.Op, "needs at least one variable")
			}
			var kv []string
			for _, e := range st.Env {
				if !validEnvName(e.Name) {
					return nil, stepsError(n, st.Op, "%q: not a valid variable name", e.Name)
				}
				kv = append(kv, e.Name+"="+expandEnv(e.Value, env))
			}
			// All values of one step expand with the environment before it.
			for _, e := range kv {
				k, v, _ := strings.Cut(e, "=")
				env = setEnv(env, k, v)
			}
			d.Text = "ENV " + strings.Join(kv, " ")
			d.KeyText = "ENV " + keyText(st.Force, kv)
		case StepWorkdir:
			if st.Path == "" {
				return nil, stepsError(n, st.Op, "needs a path")
			}
			w := st.Path
			if !path.IsAbs(w) {
				from := workdir
				if from == "" {
					from = "/"
				}
				w = path.Join(from, w)
			}
			workdir, workdirOwner = path.Clean(w), user
			d.Text = "WORKDIR " + workdir
			d.KeyText = "WORKDIR " + keyText(st.Force, []string{workdir, workdirOwner})
		case StepUser:
			if !ValidAccount(st.Name) {
				return nil, stepsError(n, st.Op, "%q: not a valid user name (lower case letters, digits, '_', '-')", st.Name)
			}
			user = st.Name
			d.Kind, d.User, d.Argv = stepUser, user, ensureUserArgv(user, st.Sudo)
			d.Text = "USER " + user
			d.KeyText = "USER " + keyText(st.Force, []any{user, st.Sudo})
		default:
			return nil, stepsError(n, st.Op, "unknown step type (want RUN, COPY, ENV, WORKDIR or USER)")
		}
		p.Steps = append(p.Steps, d)
	}
	p.Env, p.Workdir, p.User, p.WorkdirOwner = env, workdir, user, workdirOwner
	p.StartCommand, p.ReadyCommand = s.StartCommand, s.ReadyCommand
	if p.StartCommand == nil && !s.FromImage {
		p.StartCommand, p.Entrypoint, p.Cmd = base.startCommand(), base.Entrypoint, base.Cmd
		if p.ReadyCommand == nil {
			p.ReadyCommand = base.Ready
		}
	}
	if len(p.ReadyCommand) > 0 && len(p.StartCommand) == 0 {
		return nil, stepError(len(s.Steps)+1, fmt.Errorf("a ready command needs a start command to test: %w", errdefs.ErrInvalid))
	}
	return p, nil
}

// startCommand is the start command a template built from the base
// inherits: its ENTRYPOINT and CMD.
func (b baseInfo) startCommand() []string {
	if len(b.Entrypoint)+len(b.Cmd) == 0 {
		return nil
	}
	return append(append([]string(nil), b.Entrypoint...), b.Cmd...)
}

// expandEnv replaces $NAME and ${NAME} in v with their values in env
// ("" when unset), as E2B's builder expands ENV values; nothing else of v
// is interpreted.
func expandEnv(v string, env []string) string {
	return os.Expand(v, func(name string) string {
		if !validEnvName(name) {
			return "$" + name
		}
		val, _ := lookupEnv(env, name)
		return val
	})
}
