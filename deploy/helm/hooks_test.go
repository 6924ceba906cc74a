package helm_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// hookRun is a hook script of the ConfigMap run with a `lizard` on PATH that
// records its arguments and fails its first `fails` calls (all of them with
// fails < 0).
type hookRun struct {
	calls []string // one line of arguments per call
	log   string   // what the script wrote for the container's log
	err   error
}

func runHook(t *testing.T, script, dataDir string, fails int) hookRun {
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
	path := filepath.Join(bin, "hook")
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	hookLog := filepath.Join(bin, "hook.log")
	cmd := exec.Command(path)
	cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "LIZARD_NODE_NAME=node-a",
		"LIZARD_DATA_DIR="+dataDir, "HOOK_LOG="+hookLog)
	out, err := cmd.CombinedOutput()
	t.Logf("%s: %s", filepath.Base(path), out)
	var r hookRun
	r.err = err
	if b, err := os.ReadFile(callLog); err == nil {
		r.calls = strings.Split(strings.TrimSpace(string(b)), "\n")
	}
	if b, err := os.ReadFile(hookLog); err == nil {
		r.log = string(b)
	}
	return r
}

func hooks(t *testing.T, vals map[string]any) (preStop, postStart string) {
	t.Helper()
	cm := get[*corev1.ConfigMap](t, mustRender(t, vals), "ConfigMap/lizard")
	return cm.Data["pre-stop"], cm.Data["post-start"]
}

// The preStop drains the node with --move and marks the drain as its own;
// the next pod's postStart undoes only such a drain, retrying until the
// node is registered, and never fails (that would kill the container).
func TestHooks(t *testing.T) {
	if _, err := exec.LookPath("timeout"); err != nil {
		t.Fatalf("the hooks need coreutils' timeout, as the image has it: %v", err)
	}
	preStop, postStart := hooks(t, with(minimal(), "node.undrainTimeoutSeconds", 3))
	mark := func(dir string) bool { _, err := os.Stat(filepath.Join(dir, ".drained-on-stop")); return err == nil }

	t.Run("preStop drains with --move", func(t *testing.T) {
		dir := t.TempDir()
		r := runHook(t, preStop, dir, 0)
		if r.err != nil || len(r.calls) != 1 || r.calls[0] != "nodes drain node-a --move" {
			t.Fatalf("calls %q, err %v", r.calls, r.err)
		}
		if !mark(dir) {
			t.Error("no mark of the drain")
		}
	})
	t.Run("preStop reports a failed drain", func(t *testing.T) {
		r := runHook(t, preStop, t.TempDir(), -1)
		if ee, ok := r.err.(*exec.ExitError); !ok || ee.ExitCode() != 3 {
			t.Fatalf("err %v: want lizard's exit status 3", r.err)
		}
	})
	t.Run("postStart leaves an operator's drain", func(t *testing.T) {
		r := runHook(t, postStart, t.TempDir(), 0)
		if r.err != nil || r.calls != nil {
			t.Fatalf("calls %q, err %v: want none", r.calls, r.err)
		}
	})
	t.Run("postStart undoes the preStop's drain once the node is registered", func(t *testing.T) {
		dir := t.TempDir()
		runHook(t, preStop, dir, 0)
		r := runHook(t, postStart, dir, 1)
		if r.err != nil || len(r.calls) != 2 || r.calls[1] != "nodes drain node-a --undo" {
			t.Fatalf("calls %q, err %v: want a failure (node not registered yet), then the undo", r.calls, r.err)
		}
		if mark(dir) {
			t.Error("the mark stays after the undo")
		}
	})
	t.Run("postStart gives up without failing", func(t *testing.T) {
		dir := t.TempDir()
		runHook(t, preStop, dir, 0)
		r := runHook(t, postStart, dir, -1)
		if r.err != nil || len(r.calls) == 0 {
			t.Fatalf("calls %q, err %v: want tries and exit 0", r.calls, r.err)
		}
		if !mark(dir) || !strings.Contains(r.log, "lizard nodes drain node-a --undo") {
			t.Errorf("mark kept %v, log %q: want the mark kept and the command to run in the log", mark(dir), r.log)
		}
	})
	t.Run("undrainOnStart false keeps the node drained", func(t *testing.T) {
		preStop, postStart := hooks(t, with(minimal(), "node.undrainOnStart", false))
		dir := t.TempDir()
		runHook(t, preStop, dir, 0)
		r := runHook(t, postStart, dir, 0)
		if r.err != nil || r.calls != nil || mark(dir) || !strings.Contains(r.log, "stays drained") {
			t.Fatalf("calls %q, err %v, mark %v, log %q", r.calls, r.err, mark(dir), r.log)
		}
	})
}
