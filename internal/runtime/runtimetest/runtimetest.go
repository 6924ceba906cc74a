// Package runtimetest is the conformance suite every runtime.Runtime backend
// must pass (after containerd's snapshots/testsuite): lifecycle, the agent
// answering at the reported address, idempotent destroy, errors for unknown
// ids, and no leaked host resources. Backends call Run from their tests.
package runtimetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/runtime"
	"github.com/lizard-build/lizard/internal/slowness"
)

// Env is what the suite needs besides the runtime.
type Env struct {
	// Rootfs is a template root filesystem holding /bin/sh.
	Rootfs string
	// Leaks lists the host resources that sandbox id still holds (mounts,
	// cgroups, namespaces, veths, processes, files); empty when none.
	Leaks func(id string) []string
	// Lacks names what the backend does not do, whose checks the suite
	// leaves out; the zero value is a backend that does all of it.
	Lacks Capabilities
}

// Capabilities are what a backend may not do (see Env.Lacks).
type Capabilities struct {
	// ProcessCheckpoints: Pause, Resume, Snapshot and Restore keep a
	// sandbox's files but not its processes and memory.
	ProcessCheckpoints bool
	// Hostname: a sandbox's hostname is not its id.
	Hostname bool
	// Mounts: Spec.Mounts are recorded, not applied.
	Mounts bool
}

// Run runs the suite against the runtime made by newRuntime.
func Run(t *testing.T, rt runtime.Runtime, env Env) {
	t.Run("Lifecycle", func(t *testing.T) { testLifecycle(t, rt, env) })
	t.Run("CreateConflict", func(t *testing.T) { testConflict(t, rt, env) })
	t.Run("UnknownID", func(t *testing.T) { testUnknown(t, rt) })
	t.Run("FailedCreateLeavesNothing", func(t *testing.T) { testFailedCreate(t, rt, env) })
	t.Run("ParallelCreates", func(t *testing.T) { testParallel(t, rt, env) })
	t.Run("CreateStarted", func(t *testing.T) { testCreateStarted(t, rt, env) })
}

// NewID returns a fresh sandbox id for tests.
func NewID() string {
	b := make([]byte, 6)
	rand.Read(b)
	return "t" + hex.EncodeToString(b)
}

func spec(id, rootfs, token string) runtime.Spec {
	return runtime.Spec{ID: id, Rootfs: rootfs, AgentToken: token,
		Resources: runtime.Resources{CPUs: 1, MemoryMB: 1024, Pids: 1024, DiskMB: 1024}}
}

// WaitAgent polls the agent's /health at addr until it answers 200.
func WaitAgent(ctx context.Context, addr netip.AddrPort, token string) error {
	url := "http://" + addr.String() + "/health"
	var last error
	for ctx.Err() == nil {
		req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
		req.Header.Set(agent.TokenHeader, token)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("health: %s", resp.Status)
		}
		last = err
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("agent at %s: %v", addr, last)
}

// state is sandbox id's state by List ("" when not listed); a backend that
// implements runtime.Stater must say the same of it (ErrNotFound when not
// listed).
func state(t *testing.T, rt runtime.Runtime, id string) runtime.State {
	t.Helper()
	list, err := rt.List(context.Background())
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	var listed runtime.State
	for _, sb := range list {
		if sb.ID == id {
			listed = sb.State
		}
	}
	if st, ok := rt.(runtime.Stater); ok {
		now, err := st.State(context.Background(), id)
		switch {
		case listed == "" && !errors.Is(err, errdefs.ErrNotFound):
			t.Fatalf("State of a sandbox List does not have: %q, %v; want ErrNotFound", now, err)
		case listed != "" && (err != nil || now != listed):
			t.Fatalf("State %q, %v; List says %q", now, err, listed)
		}
	}
	return listed
}

func testLifecycle(t *testing.T, rt runtime.Runtime, env Env) {
	ctx := context.Background()
	id := NewID()
	t.Cleanup(func() { rt.Destroy(ctx, id) })
	sb, err := rt.Create(ctx, spec(id, env.Rootfs, "secret-token"))
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if !sb.Addr.IsValid() || !sb.Agent.IsValid() {
		t.Fatalf("Create returned no address (%v) or no agent address (%v)", sb.Addr, sb.Agent)
	}
	if got := sandboxAgent(t, rt, id); got != sb.Agent {
		t.Fatalf("List has the agent at %v, Create said %v", got, sb.Agent)
	}
	if got := state(t, rt, id); got != runtime.StateCreated {
		t.Fatalf("after Create: state %q, want created", got)
	}
	if err := rt.Start(ctx, id); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if err := rt.Start(ctx, id); err != nil {
		t.Fatalf("second Start must be a no-op: %v", err)
	}
	if got := state(t, rt, id); got != runtime.StateRunning {
		t.Fatalf("after Start: state %q, want running", got)
	}
	wctx, cancel := context.WithTimeout(ctx, slowness.Scale(15*time.Second))
	defer cancel()
	if err := WaitAgent(wctx, sb.Agent, "secret-token"); err != nil {
		t.Fatalf("agent: %v", err)
	}
	// A wrong token is refused.
	req, _ := http.NewRequest("GET", "http://"+sb.Agent.String()+"/health", nil)
	req.Header.Set(agent.TokenHeader, "wrong")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("wrong token: resp %v err %v, want 401", resp, err)
	}
	if err := rt.Stop(ctx, id); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if err := rt.Stop(ctx, id); err != nil {
		t.Fatalf("second Stop must be a no-op: %v", err)
	}
	if got := state(t, rt, id); got != runtime.StateStopped {
		t.Fatalf("after Stop: state %q, want stopped", got)
	}
	if err := rt.Destroy(ctx, id); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if got := state(t, rt, id); got != "" {
		t.Fatalf("after Destroy: still listed as %q", got)
	}
	if err := rt.Destroy(ctx, id); err != nil {
		t.Fatalf("second Destroy must be a no-op: %v", err)
	}
	if leaks := env.Leaks(id); len(leaks) > 0 {
		t.Fatalf("Destroy leaked: %v", leaks)
	}
}

// testCreateStarted: a Create with Spec.Start returns a running sandbox
// whose agent answers to its token, as Create then Start would; Start after
// it is a no-op; a second Create of the id conflicts (one that fails
// leaves nothing: testFailedCreate).
func testCreateStarted(t *testing.T, rt runtime.Runtime, env Env) {
	ctx := context.Background()
	id := NewID()
	t.Cleanup(func() { rt.Destroy(ctx, id) })
	sp := spec(id, env.Rootfs, "started-token")
	sp.Start = true
	sb, err := rt.Create(ctx, sp)
	if err != nil {
		t.Fatalf("Create with Start: %v", err)
	}
	if sb.State != runtime.StateRunning {
		t.Fatalf("Create with Start returned state %q, want running", sb.State)
	}
	if got := state(t, rt, id); got != runtime.StateRunning {
		t.Fatalf("after Create with Start: listed as %q, want running", got)
	}
	wctx, cancel := context.WithTimeout(ctx, slowness.Scale(15*time.Second))
	defer cancel()
	if err := WaitAgent(wctx, sb.Agent, "started-token"); err != nil {
		t.Fatalf("agent: %v", err)
	}
	if err := rt.Start(ctx, id); err != nil {
		t.Fatalf("Start of a sandbox Create started must be a no-op: %v", err)
	}
	if _, err := rt.Create(ctx, sp); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("second Create with Start: %v, want ErrConflict", err)
	}
	if err := rt.Destroy(ctx, id); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if leaks := env.Leaks(id); len(leaks) > 0 {
		t.Fatalf("Destroy of a sandbox Create started leaked: %v", leaks)
	}
}

func testConflict(t *testing.T, rt runtime.Runtime, env Env) {
	ctx := context.Background()
	id := NewID()
	t.Cleanup(func() { rt.Destroy(ctx, id) })
	if _, err := rt.Create(ctx, spec(id, env.Rootfs, "tok")); err != nil {
		t.Fatalf("Create: %v", err)
	}
	if _, err := rt.Create(ctx, spec(id, env.Rootfs, "tok")); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("second Create: %v, want ErrConflict", err)
	}
	if err := rt.Destroy(ctx, id); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if leaks := env.Leaks(id); len(leaks) > 0 {
		t.Fatalf("Destroy of a created (never started) sandbox leaked: %v", leaks)
	}
}

func testUnknown(t *testing.T, rt runtime.Runtime) {
	ctx := context.Background()
	id := NewID()
	if err := rt.Start(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Start unknown: %v, want ErrNotFound", err)
	}
	if err := rt.Stop(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Stop unknown: %v, want ErrNotFound", err)
	}
	if err := rt.Destroy(ctx, id); err != nil {
		t.Errorf("Destroy unknown: %v, want nil", err)
	}
}

func testFailedCreate(t *testing.T, rt runtime.Runtime, env Env) {
	ctx := context.Background()
	for _, start := range []bool{false, true} {
		id := NewID()
		sp := spec(id, filepath.Join(os.TempDir(), "no-such-rootfs-"+id), "tok")
		sp.Start = start
		if _, err := rt.Create(ctx, sp); err == nil {
			rt.Destroy(ctx, id)
			t.Fatalf("Create (Start %v) with a missing rootfs succeeded", start)
		}
		if got := state(t, rt, id); got != "" {
			t.Fatalf("failed Create (Start %v) still listed as %q", start, got)
		}
		if leaks := env.Leaks(id); len(leaks) > 0 {
			t.Fatalf("failed Create (Start %v) leaked: %v", start, leaks)
		}
	}
	if _, err := rt.Create(ctx, runtime.Spec{ID: "Bad/Id", Rootfs: env.Rootfs}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("Create with a bad id: %v, want ErrInvalid", err)
	}
}

func testParallel(t *testing.T, rt runtime.Runtime, env Env) {
	ctx := context.Background()
	const n = 4
	ids := make([]string, n)
	errc := make(chan error, n)
	for i := range ids {
		ids[i] = NewID()
		go func(id string) {
			sb, err := rt.Create(ctx, spec(id, env.Rootfs, "tok"))
			if err == nil {
				err = rt.Start(ctx, id)
			}
			if err == nil {
				wctx, cancel := context.WithTimeout(ctx, slowness.Scale(20*time.Second))
				err = WaitAgent(wctx, sb.Agent, "tok")
				cancel()
			}
			errc <- err
		}(ids[i])
	}
	var errs []string
	for range ids {
		if err := <-errc; err != nil {
			errs = append(errs, err.Error())
		}
	}
	for _, id := range ids {
		if err := rt.Destroy(ctx, id); err != nil {
			errs = append(errs, err.Error())
		}
		if leaks := env.Leaks(id); len(leaks) > 0 {
			errs = append(errs, fmt.Sprintf("%s leaked %v", id, leaks))
		}
	}
	if len(errs) > 0 {
		t.Fatalf("parallel creates: %s", strings.Join(errs, "; "))
	}
}

// RunCheckpointer runs the checkpoint tests against a backend that
// implements runtime.Checkpointer.
func RunCheckpointer(t *testing.T, rt runtime.Runtime, env Env) {
	cp, ok := rt.(runtime.Checkpointer)
	if !ok {
		t.Skip("backend does not implement runtime.Checkpointer")
	}
	t.Run("PauseResumeKeepsProcesses", func(t *testing.T) { testPauseResume(t, rt, cp, env) })
	t.Run("SnapshotRestoreCopies", func(t *testing.T) { testSnapshotRestore(t, rt, cp, env) })
	t.Run("CheckpointOfStopped", func(t *testing.T) { testCheckpointStopped(t, rt, cp, env) })
	if !env.Lacks.Mounts && !env.Lacks.ProcessCheckpoints {
		t.Run("PauseWhileMountWritten", func(t *testing.T) { testPauseMountWritten(t, rt, cp, env) })
	}
	if fp, ok := rt.(runtime.FilesPauser); ok {
		t.Run("PauseFilesKeepsFilesOnly", func(t *testing.T) { testPauseFiles(t, rt, cp, fp, env) })
	}
}

// testPauseFiles: a files-only pause keeps what the sandbox wrote and
// ends its processes; its resume boots the agent with the token the
// sandbox was created with, at the same address; a copy of the image
// restores as a booted sandbox answering to its own token.
func testPauseFiles(t *testing.T, rt runtime.Runtime, cp runtime.Checkpointer, fp runtime.FilesPauser, env Env) {
	ctx := context.Background()
	id := NewID()
	ag := started(t, rt, env, id, "tok")
	addr := sandboxAgent(t, rt, id)
	sh(t, ag, counter+"; echo bye > $HOME/gone; rm $HOME/gone")
	if err := ag.SetToken(ctx, "a-later-token-of-16"); err != nil {
		t.Fatal(err)
	}
	ag = agentAt(t, runtime.Sandbox{Agent: addr}, "a-later-token-of-16")
	pid := sh(t, ag, "cat $HOME/counter.pid")
	// The counter's pid may belong to another process after a boot (pids
	// start over), so "ended" is a count that no longer moves.
	// (count.tmp is the counter's next count, if the pause came
	// between its write and its rename.)
	const gone = `a=$(cat $HOME/count); sleep 0.3; [ "$a" = "$(cat $HOME/count)" ] && echo ended || echo alive; cat $HOME/file; ls $HOME | grep -vx count.tmp`
	for i := range 2 {
		if err := fp.PauseFiles(ctx, id); err != nil {
			t.Fatalf("PauseFiles %d: %v", i, err)
		}
		if err := fp.PauseFiles(ctx, id); err != nil {
			t.Fatalf("second PauseFiles must be a no-op: %v", err)
		}
		if got := state(t, rt, id); got != runtime.StatePaused {
			t.Fatalf("after PauseFiles: state %q", got)
		}
		if pi, ok := rt.(runtime.PauseImager); ok && !fp.IsFilesImage(pi.PauseImage(id)) {
			t.Fatalf("the pause image is not a files image")
		}
		if err := cp.Resume(ctx, id); err != nil {
			t.Fatalf("Resume %d: %v", i, err)
		}
		if got := state(t, rt, id); got != runtime.StateRunning {
			t.Fatalf("after Resume: state %q", got)
		}
		// Booted: the agent answers to the token it was created with.
		ag = agentAt(t, runtime.Sandbox{Agent: addr}, "tok")
		want := "ended\nhello\ncount\ncounter.pid\nfile\n"
		if got := sh(t, ag, gone); got != want {
			t.Fatalf("after files-only resume %d: %q, want the counter (pid %s) ended, its files kept and the deleted file still gone", i, got, strings.TrimSpace(pid))
		}
	}
	pi, ok := rt.(runtime.PauseImager)
	if !ok {
		return
	}
	if err := fp.PauseFiles(ctx, id); err != nil {
		t.Fatal(err)
	}
	image := filepath.Join(t.TempDir(), "image")
	// Copied in this process: a backend's reaper (the fake's agents) may
	// reap a cp child before os/exec waits for it.
	if err := os.CopyFS(image, os.DirFS(pi.PauseImage(id))); err != nil {
		t.Fatal(err)
	}
	if !fp.IsFilesImage(image) {
		t.Fatalf("a copy of the files image is not one")
	}
	cid := NewID()
	t.Cleanup(func() { rt.Destroy(ctx, cid) })
	sb, err := cp.Restore(ctx, spec(cid, env.Rootfs, "copy-token"), image)
	if err != nil {
		t.Fatalf("Restore of a files image: %v", err)
	}
	c := agentAt(t, sb, "copy-token")
	if got := sh(t, c, "cat $HOME/file; hostname"); got != "hello\n"+cid+"\n" && !(env.Lacks.Hostname && strings.HasPrefix(got, "hello\n")) {
		t.Fatalf("copy of a files image: %q, want the file and hostname %s", got, cid)
	}
	for _, id := range []string{id, cid} {
		if err := rt.Destroy(ctx, id); err != nil {
			t.Fatal(err)
		}
		if leaks := env.Leaks(id); len(leaks) > 0 {
			t.Fatalf("leaked: %v", leaks)
		}
	}
}

// testPauseMountWritten: a pause is one cut of the sandbox's memory and
// of its mounts' files. A loop that appends its count to a file on a
// mounted host directory, and writes a file there that it renames over
// another, never runs between the image and the container's end: after
// each resume the count goes on from the image's with no number written
// twice (the mount held nothing newer than the image), and the restore
// finds every file the image knew (one renamed away fails it).
func testPauseMountWritten(t *testing.T, rt runtime.Runtime, cp runtime.Checkpointer, env Env) {
	ctx := context.Background()
	id := NewID()
	vol := t.TempDir()
	if err := os.Chmod(vol, 0o777); err != nil {
		t.Fatal(err)
	}
	sp := spec(id, env.Rootfs, "tok")
	sp.Mounts = []runtime.Mount{{Source: vol, Destination: "/mnt/vol"}}
	t.Cleanup(func() { rt.Destroy(ctx, id) })
	sb, err := rt.Create(ctx, sp)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if err := rt.Start(ctx, id); err != nil {
		t.Fatalf("Start: %v", err)
	}
	ag := agentAt(t, sb, "tok")
	sh(t, ag, `(i=0; while true; do i=$((i+1)); echo $i >> /mnt/vol/log; echo $i > /mnt/vol/n.tmp; mv /mnt/vol/n.tmp /mnt/vol/n; done) >/dev/null 2>&1 &`)
	count := func() int {
		b, _ := os.ReadFile(filepath.Join(vol, "n"))
		return atoi(string(b))
	}
	wait := func(i, above int) {
		deadline := time.Now().Add(slowness.Scale(10 * time.Second))
		for count() <= above {
			if time.Now().After(deadline) {
				t.Fatalf("resume %d: the loop does not go on (%d)", i, count())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	wait(-1, 0)
	for i := range 4 {
		time.Sleep(100 * time.Millisecond)
		if err := cp.Pause(ctx, id); err != nil {
			t.Fatalf("Pause %d: %v", i, err)
		}
		paused := count()
		if err := cp.Resume(ctx, id); err != nil {
			t.Fatalf("Resume %d (the loop was at %d): %v", i, paused, err)
		}
		wait(i, paused+10)
	}
	if err := rt.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(vol, "log"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Fields(string(b))
	for n, l := range lines[:len(lines)-1] { // the last may be cut short
		if atoi(l) != n+1 {
			t.Fatalf("line %d of the loop's log is %s: the mount went on after the image was taken, and the resumed loop wrote its numbers again", n+1, l)
		}
	}
	if leaks := env.Leaks(id); len(leaks) > 0 {
		t.Fatalf("leaked: %v", leaks)
	}
}

// testCheckpointStopped: a stopped sandbox cannot be paused or
// snapshotted (a conflict), and nothing is written.
func testCheckpointStopped(t *testing.T, rt runtime.Runtime, cp runtime.Checkpointer, env Env) {
	ctx := context.Background()
	id := NewID()
	started(t, rt, env, id, "tok")
	if err := rt.Stop(ctx, id); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if err := cp.Pause(ctx, id); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("Pause of a stopped sandbox: %v, want ErrConflict", err)
	}
	image := filepath.Join(t.TempDir(), "image")
	if err := cp.Snapshot(ctx, id, image); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("Snapshot of a stopped sandbox: %v, want ErrConflict", err)
	}
	if _, err := os.Stat(image); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a failed Snapshot left %s: %v", image, err)
	}
	if got := state(t, rt, id); got != runtime.StateStopped {
		t.Fatalf("after the failed checkpoints: state %q, want stopped", got)
	}
}

// started creates and starts a sandbox and returns a client for its agent.
func started(t *testing.T, rt runtime.Runtime, env Env, id, token string) *agent.Client {
	t.Helper()
	ctx := context.Background()
	t.Cleanup(func() { rt.Destroy(ctx, id) })
	sb, err := rt.Create(ctx, spec(id, env.Rootfs, token))
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if err := rt.Start(ctx, id); err != nil {
		t.Fatalf("Start: %v", err)
	}
	return agentAt(t, sb, token)
}

// sandboxAgent is the agent's address of sandbox id by List.
func sandboxAgent(t *testing.T, rt runtime.Runtime, id string) netip.AddrPort {
	t.Helper()
	list, err := rt.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range list {
		if sb.ID == id {
			return sb.Agent
		}
	}
	t.Fatalf("%s not listed", id)
	return netip.AddrPort{}
}

func agentAt(t *testing.T, sb runtime.Sandbox, token string) *agent.Client {
	t.Helper()
	wctx, cancel := context.WithTimeout(context.Background(), slowness.Scale(15*time.Second))
	defer cancel()
	if err := WaitAgent(wctx, sb.Agent, token); err != nil {
		t.Fatalf("agent: %v", err)
	}
	hc := &http.Client{Transport: &http.Transport{}}
	return agent.NewClient("http://"+sb.Agent.String(), token, hc)
}

// sh runs a shell command through the agent and returns its stdout.
func sh(t *testing.T, ag *agent.Client, script string) string {
	t.Helper()
	var out strings.Builder
	code := -1
	err := ag.Exec(context.Background(), agent.ExecRequest{Cmd: []string{script}, Shell: true, TimeoutMs: 10000}, func(ev agent.Event) error {
		if ev.Line != nil && ev.Stream == "stdout" {
			out.WriteString(*ev.Line + "\n")
		}
		if ev.ExitCode != nil {
			code = *ev.ExitCode
		}
		return nil
	})
	if err != nil || code != 0 {
		t.Fatalf("%q: exit %d, err %v, out %q", script, code, err, out.String())
	}
	return out.String()
}

// counter starts a background counter, writes its pid and a file in the
// home directory (root's: /root in a sandbox of its own). Each count
// replaces the file whole (a rename): a reader never finds it truncated
// half-way through a write.
const counter = `(i=0; while true; do i=$((i+1)); echo $i > $HOME/count.tmp; mv $HOME/count.tmp $HOME/count; sleep 0.05; done) >/dev/null 2>&1 & echo $! > $HOME/counter.pid; echo hello > $HOME/file`

// alive prints the counter's pid if it runs, then the file.
const alive = "cat $HOME/counter.pid; kill -0 $(cat $HOME/counter.pid) && cat $HOME/file"

func testPauseResume(t *testing.T, rt runtime.Runtime, cp runtime.Checkpointer, env Env) {
	ctx := context.Background()
	id := NewID()
	ag := started(t, rt, env, id, "tok")
	addr := sandboxAgent(t, rt, id)
	sh(t, ag, counter)
	time.Sleep(200 * time.Millisecond)
	pid := sh(t, ag, "cat $HOME/counter.pid")
	for i := range 3 {
		before := sh(t, ag, "cat $HOME/count")
		if err := cp.Pause(ctx, id); err != nil {
			t.Fatalf("Pause %d: %v", i, err)
		}
		if err := cp.Pause(ctx, id); err != nil {
			t.Fatalf("second Pause must be a no-op: %v", err)
		}
		if got := state(t, rt, id); got != runtime.StatePaused {
			t.Fatalf("after Pause: state %q", got)
		}
		if err := cp.Resume(ctx, id); err != nil {
			t.Fatalf("Resume %d: %v", i, err)
		}
		if err := cp.Resume(ctx, id); err != nil {
			t.Fatalf("second Resume must be a no-op: %v", err)
		}
		if got := state(t, rt, id); got != runtime.StateRunning {
			t.Fatalf("after Resume: state %q", got)
		}
		// Connections from before the pause are gone with it.
		ag = agentAt(t, runtime.Sandbox{Agent: addr}, "tok")
		if env.Lacks.ProcessCheckpoints {
			if got := sh(t, ag, "cat $HOME/counter.pid $HOME/file"); got != pid+"hello\n" {
				t.Fatalf("after resume %d: %q, want the files kept", i, got)
			}
			continue
		}
		time.Sleep(200 * time.Millisecond)
		if got := sh(t, ag, alive); got != pid+"hello\n" {
			t.Fatalf("after resume %d: %q, want the same counter pid %q alive and the file", i, got, pid)
		}
		if after := sh(t, ag, "cat $HOME/count"); atoi(after) <= atoi(before) {
			t.Fatalf("counter did not go on after resume %d: %s then %s", i, before, after)
		}
	}
	if err := rt.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	if leaks := env.Leaks(id); len(leaks) > 0 {
		t.Fatalf("leaked: %v", leaks)
	}
}

func testSnapshotRestore(t *testing.T, rt runtime.Runtime, cp runtime.Checkpointer, env Env) {
	ctx := context.Background()
	src := NewID()
	ag := started(t, rt, env, src, "tok")
	sh(t, ag, counter)
	image := filepath.Join(t.TempDir(), "image")
	if err := cp.Snapshot(ctx, src, image); err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	if got := state(t, rt, src); got != runtime.StateRunning {
		t.Fatalf("source after Snapshot: %q, want running", got)
	}
	// The sandbox service tells a finished image by this file.
	if _, err := os.Stat(filepath.Join(image, runtime.ImageFile)); err != nil {
		t.Fatalf("the image has no %s: %v", runtime.ImageFile, err)
	}
	if err := cp.Snapshot(ctx, src, image); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("Snapshot into an existing dir: %v, want ErrConflict", err)
	}
	pid := sh(t, ag, "cat $HOME/counter.pid")
	want, wantWhat := alive, "counter %s alive and the file"
	if env.Lacks.ProcessCheckpoints {
		want, wantWhat = "cat $HOME/counter.pid $HOME/file", "the files of counter %s"
	}
	var copies []*agent.Client
	for range 2 {
		id := NewID()
		t.Cleanup(func() { rt.Destroy(ctx, id) })
		sb, err := cp.Restore(ctx, spec(id, env.Rootfs, "new-token"), image)
		if err != nil {
			t.Fatalf("Restore: %v", err)
		}
		// The image's agent still holds the source's token.
		c := agentAt(t, sb, "tok")
		if got := sh(t, c, "hostname"); got != id+"\n" && !env.Lacks.Hostname {
			t.Fatalf("copy's hostname %q, want %s", got, id)
		}
		if got := sh(t, c, want); got != pid+"hello\n" {
			t.Fatalf("copy: %q, want "+wantWhat, got, pid)
		}
		copies = append(copies, c)
	}
	sh(t, copies[0], "echo one > $HOME/only-in-first")
	for _, c := range []*agent.Client{ag, copies[1]} {
		if got := sh(t, c, "ls $HOME"); strings.Contains(got, "only-in-first") {
			t.Fatalf("a copy's write is seen elsewhere: %q", got)
		}
	}
	bad := NewID()
	if _, err := cp.Restore(ctx, spec(bad, env.Rootfs, "x"), filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatalf("Restore from a missing image succeeded")
	}
	if leaks := env.Leaks(bad); len(leaks) > 0 {
		t.Fatalf("failed Restore leaked: %v", leaks)
	}
}

func atoi(s string) int {
	n, _ := strconv.Atoi(strings.TrimSpace(s))
	return n
}
