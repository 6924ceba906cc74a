// Package ready keeps the ready states of templates with a start command
// (a Dockerfile's CMD or ENTRYPOINT), and runs such a command in a sandbox
// (Command). The command is started once, in a sandbox of the template's
// own, and that sandbox is checkpointed once the command is ready: its
// ready state. A create restores a copy of it, so the new sandbox's command
// is already running (and listening) when the create returns, however long
// it takes to start. The states live in Config.Dir, one per template
// version and size (a restored kernel keeps the memory and CPUs it booted
// with):
//
//	<Dir>/<template>/<version>/<size>/   the checkpoint and ready.json
//
// The server makes the default size's state right after it builds a
// template (POST /api/templates), at start for templates built without it
// (lizard template build), and any other size after the first create of
// that size, which starts the command itself.
//
// It is a feature of the sandbox service: the core (internal/sandbox)
// makes States with what it needs of the core as functions (Config), asks
// it for a state at create (Lookup) and restores from it itself; States
// holds its own lock and knows nothing of records.
package ready

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/runtime"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/template"
)

const (
	stateFile = "ready.json"
	// retryAfter is how long a failed preparation is not retried in the
	// background.
	retryAfter = 10 * time.Minute
)

// State is a template's saved ready state (ready.json).
type State struct {
	Template string `json:"template"`
	Version  string `json:"version"`
	Size     string `json:"size"`
	// AgentToken is what the saved agent answers to; copies get their own.
	AgentToken string `json:"agentToken"`
	// StartPid is the start command's pid; How says what made it ready.
	StartPid  int           `json:"startPid"`
	How       string        `json:"how"`
	ReadyIn   time.Duration `json:"readyIn"`
	CreatedAt time.Time     `json:"createdAt"`
}

// Size is the size a state is made at: its name and what a sandbox of it
// gets.
type Size struct {
	Name      string
	Resources runtime.Resources
}

// Config is what States need of the runtime and of the sandbox core.
type Config struct {
	// Dir holds the states.
	Dir          string
	Runtime      runtime.Runtime
	Checkpointer runtime.Checkpointer
	Log          *slog.Logger
	// Mounts returns the mounts of a sandbox of template name.
	Mounts func(template string) []runtime.Mount
	// Booting marks sandbox id as being made from rootfs until the
	// returned function is called: not a stray.
	Booting func(id, rootfs string) func()
	// AgentUp returns the agent at addr once it answers, given how long
	// the sandbox took to boot.
	AgentUp func(ctx context.Context, addr, token string, boot time.Duration) (*agent.Client, error)
	// Go runs fn in the background until the service closes, when its
	// context is cancelled.
	Go func(fn func(ctx context.Context))
}

// key names a state: template, its version (with a digest of the
// version's rootfs path, which two builds in one second share the version
// string but not) and size.
type key struct{ template, version, size string }

func keyOf(tpl template.Template, size string) key {
	sum := sha256.Sum256([]byte(tpl.Rootfs))
	return key{tpl.Key(), tpl.Version + "-" + hex.EncodeToString(sum[:4]), size}
}

// job is a preparation in progress; waiters read st and err once done is
// closed.
type job struct {
	done chan struct{}
	st   State
	err  error
}

// States are the ready states of one server. Safe for concurrent use.
type States struct {
	cfg Config

	mu       sync.Mutex
	jobs     map[key]*job
	failed   map[key]time.Time // when a preparation last failed
	scanning bool              // PrepareTemplates is under way
}

// New returns the states kept in cfg.Dir.
func New(cfg Config) *States {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	return &States{cfg: cfg, jobs: map[key]*job{}, failed: map[key]time.Time{}}
}

func (s *States) dir(k key) string {
	return filepath.Join(s.cfg.Dir, k.template, k.version, k.size)
}

// Lookup returns the saved ready state of tpl at size and its directory,
// if there is a complete one.
func (s *States) Lookup(tpl template.Template, size string) (State, string, bool) {
	return s.lookup(keyOf(tpl, size))
}

func (s *States) lookup(k key) (State, string, bool) {
	dir := s.dir(k)
	var st State
	b, err := os.ReadFile(filepath.Join(dir, stateFile))
	if err != nil || json.Unmarshal(b, &st) != nil || st.AgentToken == "" {
		return State{}, "", false
	}
	if _, err := os.Stat(filepath.Join(dir, runtime.ImageFile)); err != nil {
		return State{}, "", false
	}
	return st, dir, true
}

// Drop removes the state in dir (a directory Lookup gave), one that could
// not be restored; a create makes it again (PrepareLater).
func (s *States) Drop(dir string) { os.RemoveAll(dir) }

// Prepare makes the ready state of template tpl (a version, which need not
// be the current one yet) at size, unless it exists; progress (may be nil)
// gets a line per stage. A start command that exits, or does not pass its
// ready command in time, is an error naming its exit status and last
// output.
func (s *States) Prepare(ctx context.Context, tpl template.Template, sz Size, progress io.Writer) (State, error) {
	if len(tpl.StartCommand) == 0 {
		return State{}, fmt.Errorf("template %q has no start command: %w", tpl.Name, errdefs.ErrInvalid)
	}
	k := keyOf(tpl, sz.Name)
	if st, _, ok := s.lookup(k); ok {
		return st, nil
	}
	s.mu.Lock()
	j, running := s.jobs[k]
	if !running {
		j = &job{done: make(chan struct{})}
		s.jobs[k] = j
	}
	s.mu.Unlock()
	if running {
		fmt.Fprintf(orDiscard(progress), "[%s] ready state: another preparation of it (%s) is under way; waiting for it\n", tpl.Name, sz.Name)
		select {
		case <-j.done:
			return j.st, j.err
		case <-ctx.Done():
			return State{}, ctx.Err()
		}
	}
	// A preparation that ended between the first look and now made it.
	if st, _, ok := s.lookup(k); ok {
		j.st = st
	} else {
		j.st, j.err = s.prepare(ctx, tpl, sz, orDiscard(progress))
	}
	s.mu.Lock()
	delete(s.jobs, k)
	if j.err != nil && ctx.Err() == nil {
		s.failed[k] = time.Now()
	} else {
		delete(s.failed, k)
	}
	s.mu.Unlock()
	close(j.done)
	if j.err != nil {
		s.cfg.Log.Warn("ready state not made", "template", tpl.Name, "version", tpl.Version, "size", sz.Name, "err", j.err)
		return State{}, fmt.Errorf("ready state of template %q (%s): %w", tpl.Name, sz.Name, j.err)
	}
	s.cfg.Log.Info("ready state made", "template", tpl.Name, "version", tpl.Version, "size", sz.Name, "how", j.st.How, "readyIn", j.st.ReadyIn)
	s.prune(k)
	return j.st, nil
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

// prepare boots a sandbox of tpl, starts its command, waits for it to be
// ready and checkpoints the sandbox into its ready directory. The sandbox
// is never recorded in the store: a crash leaves a runtime sandbox without
// a record, which the core's recovery destroys.
func (s *States) prepare(ctx context.Context, tpl template.Template, sz Size, out io.Writer) (State, error) {
	k := keyOf(tpl, sz.Name)
	id := store.NewID("", 20)
	token := randomToken()
	start := time.Now()
	defer s.cfg.Booting(id, tpl.Rootfs)()
	fmt.Fprintf(out, "[%s] ready state: booting a %s sandbox of %s to start %s\n", tpl.Name, sz.Name, tpl.Name, QuoteArgv(tpl.StartCommand))
	defer func() {
		if err := s.cfg.Runtime.Destroy(context.WithoutCancel(ctx), id); err != nil {
			s.cfg.Log.Error("destroy the ready-state sandbox", "sandbox", id, "err", err)
		}
	}()
	booting := time.Now()
	rsb, err := s.cfg.Runtime.Create(ctx, runtime.Spec{ID: id, Rootfs: tpl.Rootfs, AgentToken: token, Resources: sz.Resources,
		Mounts: s.cfg.Mounts(tpl.Name), Start: true})
	if err != nil {
		return State{}, fmt.Errorf("create sandbox: %w", err)
	}
	ag, err := s.cfg.AgentUp(ctx, rsb.Agent.String(), token, time.Since(booting))
	if err != nil {
		return State{}, fmt.Errorf("sandbox agent did not come up: %w", err)
	}
	c := Command{Agent: ag, User: tpl.User, Workdir: tpl.Workdir, Env: template.EnvMap(tpl.Env)}
	before, err := c.Listening(ctx)
	if err != nil {
		return State{}, err
	}
	pid, err := c.Start(ctx, tpl.StartCommand)
	if err != nil {
		return State{}, err
	}
	began := time.Now()
	fmt.Fprintf(out, "[%s] ready state: started (pid %d); waiting until it is ready (%s)\n", tpl.Name, pid, Rule(tpl))
	how, err := c.WaitReady(ctx, tpl.ReadyCommand, before)
	if err != nil {
		return State{}, err
	}
	readyIn := time.Since(began)
	fmt.Fprintf(out, "[%s] ready state: ready after %s: %s\n", tpl.Name, readyIn.Round(time.Millisecond), how)

	dir := s.dir(k)
	tmp := dir + ".tmp-" + id
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return State{}, err
	}
	saved := time.Now()
	if err := s.cfg.Checkpointer.Snapshot(ctx, id, tmp); err != nil {
		return State{}, fmt.Errorf("checkpoint: %w", err)
	}
	st := State{Template: tpl.Name, Version: tpl.Version, Size: sz.Name, AgentToken: token,
		StartPid: pid, How: how, ReadyIn: readyIn, CreatedAt: time.Now().UTC()}
	if err := writeState(tmp, st); err != nil {
		os.RemoveAll(tmp)
		return State{}, err
	}
	if err := os.Rename(tmp, dir); err != nil {
		os.RemoveAll(tmp)
		if _, _, ok := s.lookup(k); ok {
			return st, nil // made meanwhile by another server process
		}
		return State{}, err
	}
	fmt.Fprintf(out, "[%s] ready state: saved in %s (%s in all); %s sandboxes of %s start with it running\n",
		tpl.Name, time.Since(saved).Round(time.Millisecond), time.Since(start).Round(time.Millisecond), sz.Name, tpl.Name)
	return st, nil
}

func randomToken() string {
	b := make([]byte, 32)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func writeState(dir string, st State) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, stateFile), append(b, '\n'), 0o600)
}

// Rule says what makes tpl's start command ready, for messages.
func Rule(tpl template.Template) string {
	if len(tpl.ReadyCommand) > 0 {
		return "until " + QuoteArgv(tpl.ReadyCommand) + " passes"
	}
	return fmt.Sprintf("until it listens on a TCP port, at most %s", ListenWait)
}

// PrepareLater makes the ready state of tpl at sz in the background, if no
// preparation of it is under way and none failed in the last retryAfter (a
// start command that fails would otherwise be retried at every create).
func (s *States) PrepareLater(tpl template.Template, sz Size) {
	k := keyOf(tpl, sz.Name)
	s.mu.Lock()
	_, running := s.jobs[k]
	failed, ok := s.failed[k]
	s.mu.Unlock()
	if !running && (!ok || time.Since(failed) >= retryAfter) {
		s.cfg.Go(func(ctx context.Context) { s.Prepare(ctx, tpl, sz, nil) })
	}
}

// PrepareTemplates makes, in the background, the ready state at sz of
// every template with a start command that has none (built by the CLI, or
// before a crash), and removes the states of versions and templates that
// are gone. The server calls it at start and then every few seconds, so
// that a CLI build gets its state soon; a call while the last one runs does
// nothing, and a template whose preparation failed is tried again only
// after retryAfter.
func (s *States) PrepareTemplates(list func() ([]template.Template, error), sz Size) {
	s.mu.Lock()
	if s.scanning {
		s.mu.Unlock()
		return
	}
	s.scanning = true
	s.mu.Unlock()
	s.cfg.Go(func(ctx context.Context) {
		s.prepareTemplates(ctx, list, sz)
		s.mu.Lock()
		s.scanning = false
		s.mu.Unlock()
	})
}

// preparing reports whether a preparation of template name (of version,
// or of any version when version is "") is under way.
func (s *States) preparing(name, version string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.jobs {
		if k.template == name && (version == "" || k.version == version) {
			return true
		}
	}
	return false
}

// failedLately reports whether the preparation of k failed less than
// retryAfter ago.
func (s *States) failedLately(k key) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	failed, ok := s.failed[k]
	return ok && time.Since(failed) < retryAfter
}

func (s *States) prepareTemplates(ctx context.Context, list func() ([]template.Template, error), sz Size) {
	tpls, err := list()
	if err != nil {
		s.cfg.Log.Warn("ready states: list templates", "err", err)
		return
	}
	current := map[string]string{}
	for _, t := range tpls {
		current[t.Key()] = keyOf(t, "").version
	}
	ents, _ := os.ReadDir(s.cfg.Dir)
	for _, e := range ents {
		// A template's first build makes its state before it is listed.
		if _, ok := current[e.Name()]; !ok && !s.preparing(e.Name(), "") && !recent(e) {
			os.RemoveAll(filepath.Join(s.cfg.Dir, e.Name()))
		}
	}
	for _, t := range tpls {
		k := keyOf(t, sz.Name)
		s.prune(k)
		if _, _, ok := s.lookup(k); ok || len(t.StartCommand) == 0 || t.OnDemand || s.failedLately(k) {
			continue
		}
		// One at a time: a server with many templates does not boot them
		// all at once.
		if _, err := s.Prepare(ctx, t, sz, nil); err != nil && ctx.Err() != nil {
			return
		}
	}
}

// prune removes the ready states of k's template's other versions, and
// unfinished ones of k's version that no preparation is writing.
func (s *States) prune(k key) {
	tdir := filepath.Join(s.cfg.Dir, k.template)
	vers, _ := os.ReadDir(tdir)
	for _, v := range vers {
		// A build makes the state of its version before it is current:
		// what is being made or was just made stays.
		if v.Name() != k.version && !s.preparing(k.template, v.Name()) && !recent(v) {
			os.RemoveAll(filepath.Join(tdir, v.Name()))
		}
	}
	sizes, _ := os.ReadDir(filepath.Join(tdir, k.version))
	for _, e := range sizes {
		size, _, tmp := strings.Cut(e.Name(), ".tmp-")
		if !tmp {
			continue
		}
		s.mu.Lock()
		_, running := s.jobs[key{k.template, k.version, size}]
		s.mu.Unlock()
		if !running {
			os.RemoveAll(filepath.Join(tdir, k.version, e.Name()))
		}
	}
}

// recent reports whether directory entry e changed in the last minute.
func recent(e fs.DirEntry) bool {
	fi, err := e.Info()
	return err == nil && time.Since(fi.ModTime()) < time.Minute
}
