package e2e

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lizard-build/lizard/internal/codeinterp"
	"github.com/lizard-build/lizard/internal/network"
	"github.com/lizard-build/lizard/internal/runtime/gvisor"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/slowness"
)

// counterScript starts a process whose count lives only in its memory and
// shows in /tmp/counter as "pid n", and waits (a minute at most: a starved
// host may take seconds to start python) until it has counted once.
// counterAlive is a command that prints "counter alive" while the counter
// of pid runs: its pid running counter.py, not any process of that pid (a
// boot gives pids out again, the shell running this command among them:
// the pattern is written so that its own text does not match it).
func counterAlive(pid int) string {
	return fmt.Sprintf("grep -qs 'counter[.]py' /proc/%d/cmdline && echo counter alive", pid)
}

const counterScript = `cat > /tmp/counter.py <<'PY'
import os, time
n = 0
while True:
    n += 1
    with open('/tmp/counter.tmp', 'w') as f:
        f.write(f"{os.getpid()} {n}")
    os.replace('/tmp/counter.tmp', '/tmp/counter')
    time.sleep(0.02)
PY
nohup python3 /tmp/counter.py > /dev/null 2>&1 &
i=0; until [ -s /tmp/counter ] || [ $i -ge 1200 ]; do sleep 0.05; i=$((i+1)); done
echo data > /root/file; cat /tmp/counter`

func (s *server) create(t *testing.T) string {
	t.Helper()
	var sb sandboxInfo
	if code, body := s.do("POST", "/api/sandboxes", map[string]any{"template": "base", "timeoutMs": 600000}, &sb); code >= 300 {
		t.Fatalf("create: %d %s", code, body)
	}
	return sb.SandboxID
}

func (s *server) sh(t *testing.T, id, script string) string {
	t.Helper()
	var out execReply
	code, body := s.do("POST", "/api/sandboxes/"+id+"/exec", map[string]any{"cmd": script}, &out)
	if code != 200 || out.ExitCode != 0 {
		t.Fatalf("exec %q in %s: %d %s", script, id, code, body)
	}
	return out.Stdout
}

func (s *server) counter(t *testing.T, id string) (pid, n int) {
	t.Helper()
	fmt.Sscan(s.sh(t, id, "cat /tmp/counter"), &pid, &n)
	return pid, n
}

func (s *server) status(t *testing.T, id string) string {
	t.Helper()
	var info sandboxInfo
	if code, body := s.do("GET", "/api/sandboxes/"+id, nil, &info); code != 200 {
		t.Fatalf("get %s: %d %s", id, code, body)
	}
	return info.Status
}

// TestAutoResume: a sandbox made with autoResume through the Lizard API,
// paused, is resumed by the next exec and file read (its counter process
// going on, same pid); one made without answers 409 sandbox_not_running
// and stays paused.
func TestAutoResume(t *testing.T) {
	s := startServer(t, "")
	var sb sandboxInfo
	if code, body := s.do("POST", "/api/sandboxes", map[string]any{"template": "base", "timeoutMs": 600000, "autoResume": true}, &sb); code >= 300 {
		t.Fatalf("create with autoResume: %d %s", code, body)
	}
	wakes, sleeps := sb.SandboxID, s.create(t)
	s.sh(t, wakes, counterScript)
	pid, n := s.counter(t, wakes)
	for _, id := range []string{wakes, sleeps} {
		if code, body := s.do("POST", "/api/sandboxes/"+id+"/pause", nil, nil); code != 200 {
			t.Fatalf("pause %s: %d %s", id, code, body)
		}
	}
	if pid2, n2 := s.counter(t, wakes); pid2 != pid || n2 < n {
		t.Fatalf("after a wake by exec: counter pid %d at %d, want pid %d from %d", pid2, n2, pid, n)
	}
	if st := s.status(t, wakes); st != "running" {
		t.Fatalf("the autoResume sandbox after an exec is %s", st)
	}
	if code, body := s.do("POST", "/api/sandboxes/"+wakes+"/pause", nil, nil); code != 200 {
		t.Fatalf("pause again: %d %s", code, body)
	}
	if code, body := s.do("GET", "/api/sandboxes/"+wakes+"/files?path=/root/file", nil, nil); code != 200 || string(body) != "data\n" {
		t.Fatalf("a file read of the paused autoResume sandbox: %d %q", code, body)
	}
	code, body := s.do("POST", "/api/sandboxes/"+sleeps+"/exec", map[string]any{"cmd": "true"}, nil)
	if code != 409 || !strings.Contains(string(body), "sandbox_not_running") {
		t.Fatalf("exec in a paused sandbox without autoResume: %d %s, want 409 sandbox_not_running", code, body)
	}
	if st := s.status(t, sleeps); st != "paused" {
		t.Fatalf("the sandbox without autoResume is %s, want paused", st)
	}
	for _, id := range []string{wakes, sleeps} {
		if code, body := s.do("DELETE", "/api/sandboxes/"+id, nil, nil); code >= 300 {
			t.Fatalf("kill %s: %d %s", id, code, body)
		}
	}
	s.waitNoLeaks(t)
}

// TestPauseResumeCycles: 20 pauses and resumes in a row of a sandbox with a
// running process and files: same pid, counting on, files kept, every time.
func TestPauseResumeCycles(t *testing.T) {
	s := startServer(t, "")
	id := s.create(t)
	s.sh(t, id, counterScript)
	pid, last := s.counter(t, id)
	for i := range 20 {
		if code, body := s.do("POST", "/api/sandboxes/"+id+"/pause", nil, nil); code != 200 {
			t.Fatalf("pause %d: %d %s", i, code, body)
		}
		if st := s.status(t, id); st != "paused" {
			t.Fatalf("after pause %d: status %s", i, st)
		}
		if code, body := s.do("POST", "/api/sandboxes/"+id+"/resume", nil, nil); code != 200 {
			t.Fatalf("resume %d: %d %s", i, code, body)
		}
		s.sh(t, id, fmt.Sprintf("echo %d > /root/cycle-%d", i, i))
		time.Sleep(60 * time.Millisecond)
		p, n := s.counter(t, id)
		if p != pid || n <= last {
			t.Fatalf("cycle %d: counter %d %d, was %d %d", i, p, n, pid, last)
		}
		last = n
	}
	if got := s.sh(t, id, "cat /root/file; ls /root | grep -c cycle-"); got != "data\n20\n" {
		t.Fatalf("files after 20 cycles: %q", got)
	}
	// A paused sandbox survives a restart of the server.
	s.do("POST", "/api/sandboxes/"+id+"/pause", nil, nil)
	s.crash()
	s.start()
	if st := s.status(t, id); st != "paused" {
		t.Fatalf("paused sandbox after kill -9 and restart: %s", st)
	}
	if code, body := s.do("POST", "/api/sandboxes/"+id+"/resume", nil, nil); code != 200 {
		t.Fatalf("resume after restart: %d %s", code, body)
	}
	if p, _ := s.counter(t, id); p != pid {
		t.Fatalf("counter pid after restart %d, want %d", p, pid)
	}
	s.do("DELETE", "/api/sandboxes/"+id, nil, nil)
	s.waitNoLeaks(t)
}

// TestCrashDuringCheckpoints kills the server with SIGKILL at random points
// of pause, resume, snapshot and fork. After each restart every sandbox is in
// its old state or its new one — running or paused, never lost — and its
// counter process and files are intact; nothing leaks at the end.
func TestCrashDuringCheckpoints(t *testing.T) {
	s := startServer(t, "")
	rnd := testRand(t)
	id := s.create(t)
	s.sh(t, id, counterScript)
	pid, _ := s.counter(t, id)
	ops := []string{"pause", "resume", "snapshot", "fork"}
	for i := range 12 {
		op := ops[i%len(ops)]
		st := s.status(t, id)
		switch {
		case op == "resume" && st != "paused":
			s.do("POST", "/api/sandboxes/"+id+"/pause", nil, nil)
		case op != "resume" && st != "running":
			s.do("POST", "/api/sandboxes/"+id+"/resume", nil, nil)
		}
		path := map[string]string{"pause": "/pause", "resume": "/resume", "snapshot": "/snapshot", "fork": "/fork"}[op]
		done := make(chan struct{})
		go func() {
			defer close(done)
			req, _ := http.NewRequest("POST", s.url+"/api/sandboxes/"+id+path, strings.NewReader(`{"poolSize":0,"count":2}`))
			req.Header.Set("X-API-Key", s.key)
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
		time.Sleep(time.Duration(rnd.IntN(150)) * time.Millisecond)
		s.crash()
		<-done
		s.start()
		st = s.status(t, id)
		if st != "running" && st != "paused" {
			t.Fatalf("crash %d during %s: status %q", i, op, st)
		}
		if st == "paused" {
			if code, body := s.do("POST", "/api/sandboxes/"+id+"/resume", nil, nil); code != 200 {
				t.Fatalf("crash %d during %s: resume: %d %s", i, op, code, body)
			}
		}
		if p, _ := s.counter(t, id); p != pid {
			t.Fatalf("crash %d during %s: counter pid %d, want %d", i, op, p, pid)
		}
		if got := s.sh(t, id, "cat /root/file"); got != "data\n" {
			t.Fatalf("crash %d during %s: file %q", i, op, got)
		}
	}
	// Clean up everything the forks and snapshots left: sandboxes, snapshots.
	var list []sandboxInfo
	s.do("GET", "/api/sandboxes", nil, &list)
	for _, sb := range list {
		s.do("DELETE", "/api/sandboxes/"+sb.SandboxID, nil, nil)
	}
	var snaps []map[string]any
	s.do("GET", "/api/sandbox-snapshots", nil, &snaps)
	for _, sn := range snaps {
		s.do("DELETE", fmt.Sprintf("/api/sandbox-snapshots/%v", sn["id"]), nil, nil)
	}
	s.waitNoLeaks(t)
}

// TestSnapshotDiskFull: a snapshot that does not fit on disk fails with a
// clear error, the sandbox keeps running, and no partial image is left.
func TestSnapshotDiskFull(t *testing.T) {
	dataDir := t.TempDir()
	snaps := dataDir + "/snapshots"
	if err := os.MkdirAll(snaps, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", snaps, "tmpfs", 0, "size=256k"); err != nil {
		t.Skipf("cannot mount a small tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(snaps, unix.MNT_DETACH) })
	s := startServer(t, dataDir)
	id := s.create(t)
	s.sh(t, id, counterScript)
	pid, _ := s.counter(t, id)
	code, body := s.do("POST", "/api/sandboxes/"+id+"/snapshot", map[string]any{"name": "big", "poolSize": 0}, nil)
	if code < 400 || !strings.Contains(string(body), "no space left on device") {
		t.Fatalf("snapshot on a full disk: %d %s, want an error naming the full disk", code, body)
	}
	if p, _ := s.counter(t, id); p != pid {
		t.Fatalf("sandbox after a failed snapshot: counter pid %d, want %d", p, pid)
	}
	if ents, _ := os.ReadDir(snaps); len(ents) != 0 {
		t.Fatalf("partial image left: %v", ents)
	}
	// A fork needs an image too: every copy fails the same clear way.
	code, body = s.do("POST", "/api/sandboxes/"+id+"/fork", map[string]any{"count": 2}, nil)
	if code < 400 || !strings.Contains(string(body), "no space left on device") {
		t.Fatalf("fork on a full disk: %d %s", code, body)
	}
	s.do("DELETE", "/api/sandboxes/"+id, nil, nil)
	unix.Unmount(snaps, unix.MNT_DETACH)
	s.waitNoLeaks(t)
}

// TestPausedSurvivesReboot: what lives on /run (network namespaces, runsc's
// state) is gone after a reboot of the machine; a paused sandbox still
// resumes, with its processes and its address.
func TestPausedSurvivesReboot(t *testing.T) {
	s := startServer(t, "")
	id := s.create(t)
	s.sh(t, id, counterScript)
	pid, _ := s.counter(t, id)
	addr := s.sh(t, id, "hostname -I")
	if code, body := s.do("POST", "/api/sandboxes/"+id+"/pause", nil, nil); code != 200 {
		t.Fatalf("pause: %d %s", code, body)
	}
	s.stop()
	// The reboot: /run is a tmpfs.
	ep := network.EndpointFor(s.cgroupParent(), id)
	exec.Command("ip", "link", "del", ep.HostVeth).Run()
	if out, err := exec.Command("ip", "netns", "del", filepath.Base(ep.Netns)).CombinedOutput(); err != nil {
		t.Fatalf("remove netns: %v %s", err, out)
	}
	root := gvisor.RunscRootFor(s.dataDir)
	for unix.Unmount(filepath.Join(root, "null-netns"), unix.MNT_DETACH) == nil {
	}
	os.RemoveAll(root)
	s.start()
	if st := s.status(t, id); st != "paused" {
		t.Fatalf("after reboot: %s, want paused", st)
	}
	if code, body := s.do("POST", "/api/sandboxes/"+id+"/resume", nil, nil); code != 200 {
		t.Fatalf("resume after reboot: %d %s", code, body)
	}
	if p, _ := s.counter(t, id); p != pid {
		t.Fatalf("counter pid %d, want %d", p, pid)
	}
	if got := s.sh(t, id, "hostname -I"); got != addr {
		t.Fatalf("address %q, want %q", got, addr)
	}
	s.do("DELETE", "/api/sandboxes/"+id, nil, nil)
	s.waitNoLeaks(t)
}

// TestPauseFiles: a pause with {"memory": false} keeps the sandbox's files
// (a template file it deleted stays deleted) and nothing else: while it is
// paused no process and no cgroup of it is on the host, and its image holds
// what it wrote, not the 96 MiB a process of it held in memory; the resume
// boots it (its processes gone, its files there, the same address); a
// template's start command (the interpreter's server) runs again.
func TestPauseFiles(t *testing.T) {
	s := startServer(t, "")
	id := s.create(t)
	s.sh(t, id, counterScript+`; rm /etc/motd; head -c 4194304 /dev/urandom > /root/blob; md5sum /root/blob > /root/blob.md5
nohup python3 -c 'import time; b = bytearray(96 << 20); b[::4096] = b"x" * len(b[::4096]); time.sleep(3600)' >/dev/null 2>&1 &
sleep 1`)
	pid, _ := s.counter(t, id)
	var before sandboxInfo
	s.do("GET", "/api/sandboxes/"+id, nil, &before)
	var info struct {
		sandboxInfo
		PauseMemory *bool `json:"pauseMemory"`
	}
	if code, body := s.do("POST", "/api/sandboxes/"+id+"/pause", map[string]any{"memory": false}, &info); code != 200 || info.Status != "paused" || info.PauseMemory == nil || *info.PauseMemory {
		t.Fatalf("pause without memory: %d %s", code, body)
	}
	// Nothing of it runs on the host, nothing holds its memory.
	if out, err := exec.Command("pgrep", "-af", id).Output(); err == nil {
		t.Fatalf("processes of the files-only paused sandbox on the host:\n%s", out)
	}
	for _, ctl := range []string{"", "memory", "cpu", "pids"} {
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", ctl, s.names.cgroupParent, id)); err == nil {
			t.Fatalf("the files-only paused sandbox keeps its cgroup %s", filepath.Join(ctl, s.names.cgroupParent, id))
		}
	}
	image := filepath.Join(s.dataDir, "sandboxes", id, "checkpoint")
	if size := duBytes(t, image); size > 32<<20 || size < 4<<20 {
		t.Fatalf("the files-only image is %d bytes: want the 4 MiB written and little more (not the 96 MiB held in memory)", size)
	}
	code, body := s.do("POST", "/api/sandboxes/"+id+"/exec", map[string]any{"cmd": "true"}, nil)
	if code != 409 || !strings.Contains(string(body), "sandbox_not_running") {
		t.Fatalf("exec in the paused sandbox: %d %s", code, body)
	}
	var resumed sandboxInfo
	if code, body := s.do("POST", "/api/sandboxes/"+id+"/resume", nil, &resumed); code != 200 || resumed.Status != "running" {
		t.Fatalf("resume: %d %s", code, body)
	}
	out := s.sh(t, id, fmt.Sprintf(`md5sum -c /root/blob.md5 >/dev/null && echo blob ok; cat /root/file; test -e /etc/motd && echo motd back; %s; hostname -I`, counterAlive(pid)))
	if want := "blob ok\ndata\n"; !strings.HasPrefix(out, want) || strings.Contains(out, "alive") || strings.Contains(out, "motd") {
		t.Fatalf("after the files-only resume: %q, want the blob and file kept, /etc/motd still deleted and the counter ended", out)
	}

	// The interpreter's server, the template's start command, runs again.
	ci, _ := s.createdAt(t, "code-interpreter-v1", "")
	ready := strings.Join(codeinterp.ReadyCommand(), " ")
	s.sh(t, ci, ready) // a create answers once it serves
	if code, body := s.do("POST", "/api/sandboxes/"+ci+"/pause", map[string]any{"memory": false}, nil); code != 200 {
		t.Fatalf("pause the interpreter without memory: %d %s", code, body)
	}
	if code, body := s.do("POST", "/api/sandboxes/"+ci+"/resume", nil, nil); code != 200 {
		t.Fatalf("resume the interpreter: %d %s", code, body)
	}
	var waited execReply
	// Scaled for a slow machine, up to an exec's longest (10 min).
	wait := min(slowness.Scale(2*time.Minute).Milliseconds(), sandbox.MaxExecTimeoutMs)
	code, body = s.do("POST", "/api/sandboxes/"+ci+"/exec", map[string]any{"cmd": "while ! " + ready + "; do sleep 0.1; done", "timeoutMs": wait}, &waited)
	if code != 200 || waited.ExitCode != 0 {
		t.Fatalf("the code interpreter's server after a files-only resume: %d %s", code, body)
	}
	for _, id := range []string{id, ci} {
		if code, body := s.do("DELETE", "/api/sandboxes/"+id, nil, nil); code >= 300 {
			t.Fatalf("kill %s: %d %s", id, code, body)
		}
	}
	s.waitNoLeaks(t)
}

// duBytes is the disk space the files under dir take.
func duBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err != nil {
			return err
		}
		n += st.Blocks * 512
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}
