package sandbox

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/runtime"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/template"
)

// Ready states. A template with a start command (a Dockerfile's CMD or
// ENTRYPOINT) has it started once, in a sandbox of the template's own, and
// that sandbox is checkpointed once the command is ready: its ready state.
// A create restores a copy of it, so the new sandbox's command is already
// running (and listening) when the create returns, however long it takes to
// start. The states live in ReadyDir, one per template version and size (a
// restored kernel keeps the memory and CPUs it booted with):
//
//	<ReadyDir>/<template>/<version>/<size>/   the checkpoint and ready.json
//
// The server makes the default size's state right after it builds a
// template (POST /api/templates), at start for templates built without it
// (lizard template build), and any other size after the first create of
// that size, which starts the command itself.
const (
	readyFile = "ready.json"
	// readyListenWait is how long a start command without a ready command
	// has to open a port; one that opens none (a worker) is saved as it is
	// then.
	readyListenWait = 10 * time.Second
	// ReadyTimeout bounds the wait for a ready command to pass.
	ReadyTimeout = 2 * time.Minute
	readyPoll    = 100 * time.Millisecond
	// readyRetryAfter is how long a failed preparation is not retried in
	// the background.
	readyRetryAfter = 10 * time.Minute
	// startLog and startExit are where a start command's output and exit
	// status go, in the sandbox's temporary directory (shell words: /tmp
	// unless the template sets TMPDIR).
	startLog  = `"${TMPDIR:-/tmp}/lizard-start.log"`
	startExit = `"${TMPDIR:-/tmp}/.lizard-start.exit"`
)

// ReadyState is a template's saved ready state (ready.json).
type ReadyState struct {
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

// readyKey names a ready state: template, its version (with a digest of
// the version's rootfs path, which two builds in one second share the
// version string but not) and size.
type readyKey struct{ template, version, size string }

func keyOf(tpl template.Template, size string) readyKey {
	sum := sha256.Sum256([]byte(tpl.Rootfs))
	return readyKey{tpl.Key(), tpl.Version + "-" + hex.EncodeToString(sum[:4]), size}
}

// readyJob is a preparation in progress; waiters read st and err once done
// is closed.
type readyJob struct {
	done chan struct{}
	st   ReadyState
	err  error
}

func (s *Service) readyDir(k readyKey) string {
	return filepath.Join(s.cfg.ReadyDir, k.template, k.version, k.size)
}

// readyState returns the saved ready state of k, if there is a complete one.
func (s *Service) readyState(k readyKey) (ReadyState, string, bool) {
	if s.cfg.ReadyDir == "" || s.cp == nil {
		return ReadyState{}, "", false
	}
	dir := s.readyDir(k)
	var st ReadyState
	b, err := os.ReadFile(filepath.Join(dir, readyFile))
	if err != nil || json.Unmarshal(b, &st) != nil || st.AgentToken == "" {
		return ReadyState{}, "", false
	}
	if _, err := os.Stat(filepath.Join(dir, runtime.ImageFile)); err != nil {
		return ReadyState{}, "", false
	}
	return st, dir, true
}

// PrepareReady makes the ready state of template tpl (a version, which
// need not be the current one yet) at size ("" for the default), unless it
// exists; progress (may be nil) gets a line per stage. A start command that
// exits, or does not pass its ready command in time, is an error naming its
// exit status and last output.
func (s *Service) PrepareReady(ctx context.Context, tpl template.Template, size string, progress io.Writer) (ReadyState, error) {
	if s.cp == nil || s.cfg.ReadyDir == "" {
		return ReadyState{}, errdefs.WithCode("feature_unavailable", fmt.Errorf("ready states: this server's runtime cannot checkpoint: %w", errdefs.ErrUnavailable))
	}
	if len(tpl.StartCommand) == 0 {
		return ReadyState{}, fmt.Errorf("template %q has no start command: %w", tpl.Name, errdefs.ErrInvalid)
	}
	sz, err := LookupSize(size)
	if err != nil {
		return ReadyState{}, err
	}
	k := keyOf(tpl, sz.Name)
	if st, _, ok := s.readyState(k); ok {
		return st, nil
	}
	s.mu.Lock()
	job, running := s.readyJobs[k]
	if !running {
		job = &readyJob{done: make(chan struct{})}
		s.readyJobs[k] = job
	}
	s.mu.Unlock()
	if running {
		fmt.Fprintf(orDiscard(progress), "[%s] ready state: another preparation of it (%s) is under way; waiting for it\n", tpl.Name, sz.Name)
		select {
		case <-job.done:
			return job.st, job.err
		case <-ctx.Done():
			return ReadyState{}, ctx.Err()
		}
	}
	// A preparation that ended between the first look and now made it.
	if st, _, ok := s.readyState(k); ok {
		job.st = st
	} else {
		job.st, job.err = s.prepareReady(ctx, tpl, sz, orDiscard(progress))
	}
	s.mu.Lock()
	delete(s.readyJobs, k)
	if job.err != nil && ctx.Err() == nil {
		s.readyFailed[k] = time.Now()
	} else {
		delete(s.readyFailed, k)
	}
	s.mu.Unlock()
	close(job.done)
	if job.err != nil {
		s.log.Warn("ready state not made", "template", tpl.Name, "version", tpl.Version, "size", sz.Name, "err", job.err)
		return ReadyState{}, fmt.Errorf("ready state of template %q (%s): %w", tpl.Name, sz.Name, job.err)
	}
	s.log.Info("ready state made", "template", tpl.Name, "version", tpl.Version, "size", sz.Name, "how", job.st.How, "readyIn", job.st.ReadyIn)
	s.pruneReady(k)
	return job.st, nil
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

// prepareReady boots a sandbox of tpl, starts its command, waits for it to
// be ready and checkpoints the sandbox into its ready directory. The
// sandbox is never recorded in the store: a crash leaves a runtime sandbox
// without a record, which Recover destroys.
func (s *Service) prepareReady(ctx context.Context, tpl template.Template, sz Size, out io.Writer) (ReadyState, error) {
	k := keyOf(tpl, sz.Name)
	id := store.NewID("", 20)
	token := randomToken()
	start := time.Now()
	defer s.booting(id, tpl.Rootfs)()
	fmt.Fprintf(out, "[%s] ready state: booting a %s sandbox of %s to start %s\n", tpl.Name, sz.Name, tpl.Name, quoteArgv(tpl.StartCommand))
	defer func() {
		if err := s.cfg.Runtime.Destroy(context.WithoutCancel(ctx), id); err != nil {
			s.log.Error("destroy the ready-state sandbox", "sandbox", id, "err", err)
		}
	}()
	booting := time.Now()
	rsb, err := s.cfg.Runtime.Create(ctx, runtime.Spec{ID: id, Rootfs: tpl.Rootfs, AgentToken: token, Resources: sz.resources(),
		Mounts: s.mounts(tpl.Name, nil)})
	if err != nil {
		return ReadyState{}, fmt.Errorf("create sandbox: %w", err)
	}
	if err := s.cfg.Runtime.Start(ctx, id); err != nil {
		return ReadyState{}, fmt.Errorf("start sandbox: %w", err)
	}
	ag, _ := newAgent(rsb.Agent.String(), token)
	if err := waitReady(ctx, ag, s.agentWait(time.Since(booting))); err != nil {
		return ReadyState{}, fmt.Errorf("sandbox agent did not come up: %w", err)
	}
	sc := startCtx{ag: ag, user: tpl.User, workdir: tpl.Workdir, env: mergeEnv(tpl.Env, nil)}
	before, err := sc.listening(ctx)
	if err != nil {
		return ReadyState{}, err
	}
	pid, err := sc.start(ctx, tpl.StartCommand)
	if err != nil {
		return ReadyState{}, err
	}
	began := time.Now()
	fmt.Fprintf(out, "[%s] ready state: started (pid %d); waiting until it is ready (%s)\n", tpl.Name, pid, readyRule(tpl))
	how, err := sc.waitReady(ctx, tpl.ReadyCommand, before)
	if err != nil {
		return ReadyState{}, err
	}
	readyIn := time.Since(began)
	fmt.Fprintf(out, "[%s] ready state: ready after %s: %s\n", tpl.Name, readyIn.Round(time.Millisecond), how)

	dir := s.readyDir(k)
	tmp := dir + ".tmp-" + id
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return ReadyState{}, err
	}
	saved := time.Now()
	if err := s.cp.Snapshot(ctx, id, tmp); err != nil {
		return ReadyState{}, fmt.Errorf("checkpoint: %w", err)
	}
	st := ReadyState{Template: tpl.Name, Version: tpl.Version, Size: sz.Name, AgentToken: token,
		StartPid: pid, How: how, ReadyIn: readyIn, CreatedAt: time.Now().UTC()}
	if err := writeReadyState(tmp, st); err != nil {
		os.RemoveAll(tmp)
		return ReadyState{}, err
	}
	if err := os.Rename(tmp, dir); err != nil {
		os.RemoveAll(tmp)
		if _, _, ok := s.readyState(k); ok {
			return st, nil // made meanwhile by another server process
		}
		return ReadyState{}, err
	}
	fmt.Fprintf(out, "[%s] ready state: saved in %s (%s in all); %s sandboxes of %s start with it running\n",
		tpl.Name, time.Since(saved).Round(time.Millisecond), time.Since(start).Round(time.Millisecond), sz.Name, tpl.Name)
	return st, nil
}

func writeReadyState(dir string, st ReadyState) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, readyFile), append(b, '\n'), 0o600)
}

func readyRule(tpl template.Template) string {
	if len(tpl.ReadyCommand) > 0 {
		return "until " + quoteArgv(tpl.ReadyCommand) + " passes"
	}
	return fmt.Sprintf("until it listens on a TCP port, at most %s", readyListenWait)
}

func quoteArgv(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		if a == "" || strings.ContainsAny(a, " \t\n\"'\\$`") {
			a = strconv.Quote(a)
		}
		q[i] = a
	}
	return strings.Join(q, " ")
}

// startCtx runs a template's start command, and what decides it is ready,
// through a sandbox's agent, as the template's user in its workdir.
type startCtx struct {
	ag      *agent.Client
	user    string
	workdir string
	env     map[string]string
}

// run runs argv to its end and returns its exit code and output.
func (c startCtx) run(ctx context.Context, argv []string, user string, timeoutMs int64) (int, string, error) {
	var b strings.Builder
	code := -1
	err := c.ag.Exec(ctx, agent.ExecRequest{Cmd: argv, Env: c.env, User: user, Workdir: c.workdir, TimeoutMs: timeoutMs},
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

// start starts argv (see startArgv) and returns its pid.
func (c startCtx) start(ctx context.Context, argv []string) (int, error) {
	code, out, err := c.run(ctx, startArgv(argv), c.user, 30_000)
	if err != nil {
		return 0, fmt.Errorf("start command: %w", err)
	}
	pid, perr := strconv.Atoi(strings.TrimSpace(out))
	if code != 0 || perr != nil {
		return 0, fmt.Errorf("start command %s did not start (exit %d): %s: %w", quoteArgv(argv), code, strings.TrimSpace(out), errdefs.ErrInvalid)
	}
	return pid, nil
}

// startArgv is the command that starts argv in the background, in a
// session of its own, with its output in startLog and its exit status, when
// it ends, in startExit, and prints its pid.
func startArgv(argv []string) []string {
	script := `rm -f ` + startExit + `; setsid sh -c '"$@"; echo $? > ` + startExit + `' lizard-start "$@" > ` + startLog + ` 2>&1 < /dev/null & echo $!`
	return append([]string{"/bin/sh", "-c", script, "lizard-start"}, argv...)
}

// exited reports the start command's exit status once it has ended.
func (c startCtx) exited(ctx context.Context) (string, bool) {
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
func (c startCtx) lastLines(ctx context.Context, n int) string {
	_, out, _ := c.run(ctx, []string{"/bin/sh", "-c", "tail -n " + strconv.Itoa(n) + " " + startLog}, "", 10_000)
	return strings.TrimRight(out, "\n")
}

// listening returns the TCP ports listened on in the sandbox, but the
// agent's.
func (c startCtx) listening(ctx context.Context) (map[int]bool, error) {
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

// waitReady polls until the start command is ready: its ready command
// passes or, without one, it listens on a port that was not before (or
// readyListenWait passes); one that exits 0 first (it daemonized) is
// waited for the same way. A command that fails first is an error with its
// status and last output.
func (c startCtx) waitReady(ctx context.Context, readyCmd []string, before map[int]bool) (string, error) {
	began := time.Now()
	limit := ReadyTimeout
	if len(readyCmd) == 0 {
		limit = readyListenWait
	}
	for {
		// A command that finishes well (a daemon that forked away) is
		// waited for like one that runs on; one that fails is an error.
		if status, ok := c.exited(ctx); ok && status != "0" {
			return "", fmt.Errorf("the start command exited (status %s) before it was ready; its last output:\n%s: %w",
				status, c.lastLines(ctx, 20), errdefs.ErrInvalid)
		}
		if len(readyCmd) > 0 {
			code, _, err := c.run(ctx, readyCmd, c.user, 10_000)
			if err != nil {
				return "", fmt.Errorf("ready command: %w", err)
			}
			if code == 0 {
				return "the ready command passed", nil
			}
		} else {
			now, err := c.listening(ctx)
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
				return fmt.Sprintf("no port opened in %s; saved as it runs", readyListenWait), nil
			}
			return "", fmt.Errorf("the ready command %s did not pass in %s; the start command's last output:\n%s: %w",
				quoteArgv(readyCmd), ReadyTimeout, c.lastLines(ctx, 20), errdefs.ErrInvalid)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(readyPoll):
		}
	}
}

// prepareLater makes the ready state of tpl at size in the background, if
// no preparation of it is under way and none failed in the last
// readyRetryAfter (a start command that fails would otherwise be retried
// at every create).
func (s *Service) prepareLater(tpl template.Template, size string) {
	k := keyOf(tpl, size)
	s.mu.Lock()
	_, running := s.readyJobs[k]
	failed, ok := s.readyFailed[k]
	if !running && (!ok || time.Since(failed) >= readyRetryAfter) {
		s.goLocked(func(ctx context.Context) { s.PrepareReady(ctx, tpl, size, nil) })
	}
	s.mu.Unlock()
}

// PrepareTemplates makes, in the background, the default size's ready
// state of every template with a start command that has none (built by the
// CLI, or before a crash), and removes the states of versions and
// templates that are gone. The server calls it at start and then every few
// seconds, so that a CLI build gets its state soon; a call while the last
// one runs does nothing, and a template whose preparation failed is tried
// again only after readyRetryAfter.
func (s *Service) PrepareTemplates(list func() ([]template.Template, error)) {
	if s.cp == nil || s.cfg.ReadyDir == "" {
		return
	}
	s.mu.Lock()
	if !s.scanning {
		s.scanning = true
		s.goLocked(func(ctx context.Context) {
			s.prepareTemplates(ctx, list)
			s.mu.Lock()
			s.scanning = false
			s.mu.Unlock()
		})
	}
	s.mu.Unlock()
}

// preparing reports whether a preparation of template name (of version,
// or of any version when version is "") is under way.
func (s *Service) preparing(name, version string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.readyJobs {
		if k.template == name && (version == "" || k.version == version) {
			return true
		}
	}
	return false
}

// failedLately reports whether the preparation of k failed less than
// readyRetryAfter ago.
func (s *Service) failedLately(k readyKey) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	failed, ok := s.readyFailed[k]
	return ok && time.Since(failed) < readyRetryAfter
}

func (s *Service) prepareTemplates(ctx context.Context, list func() ([]template.Template, error)) {
	tpls, err := list()
	if err != nil {
		s.log.Warn("ready states: list templates", "err", err)
		return
	}
	current := map[string]string{}
	for _, t := range tpls {
		current[t.Key()] = keyOf(t, "").version
	}
	ents, _ := os.ReadDir(s.cfg.ReadyDir)
	for _, e := range ents {
		// A template's first build makes its state before it is listed.
		if _, ok := current[e.Name()]; !ok && !s.preparing(e.Name(), "") && !recent(e) {
			os.RemoveAll(filepath.Join(s.cfg.ReadyDir, e.Name()))
		}
	}
	for _, t := range tpls {
		k := keyOf(t, DefaultSize)
		s.pruneReady(k)
		if _, _, ok := s.readyState(k); ok || len(t.StartCommand) == 0 || t.OnDemand || s.failedLately(k) {
			continue
		}
		// One at a time: a server with many templates does not boot them
		// all at once.
		if _, err := s.PrepareReady(ctx, t, DefaultSize, nil); err != nil && ctx.Err() != nil {
			return
		}
	}
}

// pruneReady removes the ready states of k's template's other versions,
// and unfinished ones of k's version that no preparation is writing.
func (s *Service) pruneReady(k readyKey) {
	tdir := filepath.Join(s.cfg.ReadyDir, k.template)
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
		_, running := s.readyJobs[readyKey{k.template, k.version, size}]
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

// createFromReady starts rec as a copy of tpl's ready state at size, if it
// has one; ok is false when it has none or the restore failed (the state
// is then dropped, and made again in the background).
func (s *Service) createFromReady(ctx context.Context, rec Record, tpl template.Template, sz Size) (Record, bool, error) {
	k := keyOf(tpl, sz.Name)
	st, dir, ok := s.readyState(k)
	if !ok {
		s.prepareLater(tpl, sz.Name)
		return Record{}, false, nil
	}
	// A refusal is the create's answer, not a reason to drop the state.
	if err := s.admit(ctx, rec.ProjectID, holds(StatusRunning, rec.CPUs, rec.MemoryMB)); err != nil {
		return Record{}, true, err
	}
	rec.Rootfs = tpl.Rootfs
	out, err := s.launch(ctx, rec, func(ctx context.Context, rec *Record) (runtime.Sandbox, error) {
		return s.cp.Restore(ctx, runtime.Spec{ID: rec.ID, Rootfs: tpl.Rootfs, AgentToken: rec.AgentToken,
			Resources: sz.resources(), Egress: rec.Egress, Mounts: s.mounts(tpl.Name, nil)}, dir)
	}, st.AgentToken)
	if err == nil {
		s.logs.event(out.ID, "started from the ready state of template %s: its start command (pid %d) has run since %s",
			tpl.Name, st.StartPid, st.CreatedAt.Format(time.RFC3339))
		return out, true, nil
	}
	if ctx.Err() != nil || refused(err) {
		return Record{}, true, err
	}
	if errdefs.Code(err) == "incompatible_checkpoint" {
		// Made by another runsc build or on another CPU: kept (nothing of
		// a checkpoint is deleted for that), and the create boots instead.
		s.log.Warn("ready state made by another runsc build or CPU; starting the command in a new sandbox", "template", tpl.Name, "size", sz.Name, "err", err)
		return Record{}, false, nil
	}
	s.log.Warn("restore of a ready state failed; dropping it and starting the command in a new sandbox", "template", tpl.Name, "size", sz.Name, "err", err)
	os.RemoveAll(dir)
	return Record{}, false, nil
}
