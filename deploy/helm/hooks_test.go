package helm_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// hookRun is deploy/node-hook run with a `lizard` on PATH that records its
// arguments and fails its first `fails` calls (every call with fails < 0).
type hookRun struct {
	calls  []string // the arguments of each call
	stderr string
	err    error
}

func runHook(t *testing.T, dataDir string, fails int, args ...string) hookRun {
	t.Helper()
	bin := t.TempDir()
	callLog := filepath.Join(bin, "calls")
	fake := `#!/bin/sh
echo "$@" >> ` + callLog + `
n=$(wc -l < ` + callLog + `)
if [ ` + strconv.Itoa(fails) + ` -lt 0 ] || [ "$n" -le ` + strconv.Itoa(fails) + ` ]; then exit 3; fi
exit 0
`
	if err := os.WriteFile(filepath.Join(bin, "lizard"), []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("../node-hook", args...)
	cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "LIZARD_NODE_NAME=node-a", "LIZARD_DATA_DIR="+dataDir)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	r := hookRun{err: cmd.Run(), stderr: stderr.String()}
	if b, err := os.ReadFile(callLog); err == nil {
		r.calls = strings.Split(strings.TrimSpace(string(b)), "\n")
	}
	return r
}

// stop drains the node with --move and marks the drain as its own; start
// undoes only such a drain, retrying until the node is registered, and
// never fails (a failed postStart kills the container).
func TestNodeHook(t *testing.T) {
	if _, err := exec.LookPath("timeout"); err != nil {
		t.Fatalf("node-hook needs coreutils' timeout, which the image and Debian have: %v", err)
	}
	marked := func(dir string) bool { _, err := os.Stat(filepath.Join(dir, ".drained-on-stop")); return err == nil }

	t.Run("stop drains with --move", func(t *testing.T) {
		dir := t.TempDir()
		r := runHook(t, dir, 0, "stop")
		if r.err != nil || len(r.calls) != 1 || r.calls[0] != "nodes drain node-a --move" {
			t.Fatalf("calls %q, err %v, stderr %q", r.calls, r.err, r.stderr)
		}
		if !marked(dir) {
			t.Error("no mark of the drain")
		}
	})
	t.Run("stop drains even where it cannot mark", func(t *testing.T) {
		r := runHook(t, filepath.Join(t.TempDir(), "missing"), 0, "stop")
		if r.err != nil || len(r.calls) != 1 || !strings.Contains(r.stderr, "lizard nodes drain node-a --undo") {
			t.Fatalf("calls %q, err %v, stderr %q: want the drain and a word on undoing it by hand", r.calls, r.err, r.stderr)
		}
	})
	t.Run("stop reports a failed drain", func(t *testing.T) {
		r := runHook(t, t.TempDir(), -1, "stop")
		if ee, ok := r.err.(*exec.ExitError); !ok || ee.ExitCode() != 3 {
			t.Fatalf("err %v: want lizard's exit status 3", r.err)
		}
	})
	t.Run("start leaves an operator's drain", func(t *testing.T) {
		r := runHook(t, t.TempDir(), 0, "start")
		if r.err != nil || r.calls != nil {
			t.Fatalf("calls %q, err %v: want none", r.calls, r.err)
		}
	})
	t.Run("start undoes the stop's drain once the node is registered", func(t *testing.T) {
		dir := t.TempDir()
		runHook(t, dir, 0, "stop")
		r := runHook(t, dir, 1, "start")
		if r.err != nil || len(r.calls) != 2 || r.calls[1] != "nodes drain node-a --undo" {
			t.Fatalf("calls %q, err %v: want a failure (node not registered yet), then the undo", r.calls, r.err)
		}
		if marked(dir) {
			t.Error("the mark stays after the undo")
		}
	})
	t.Run("start gives up without failing", func(t *testing.T) {
		dir := t.TempDir()
		runHook(t, dir, 0, "stop")
		r := runHook(t, dir, -1, "start", "3")
		if r.err != nil || len(r.calls) == 0 {
			t.Fatalf("calls %q, err %v: want tries and exit 0", r.calls, r.err)
		}
		if !marked(dir) || !strings.Contains(r.stderr, "lizard nodes drain node-a --undo") {
			t.Errorf("mark kept %v, stderr %q: want the mark kept and the command to run on stderr", marked(dir), r.stderr)
		}
	})
	t.Run("usage", func(t *testing.T) {
		r := runHook(t, t.TempDir(), 0, "restart")
		if ee, ok := r.err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || r.calls != nil {
			t.Fatalf("err %v, calls %q: want exit status 2 and no call", r.err, r.calls)
		}
	})
}
