package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// diskUse is what the files under dir take on disk (allocated blocks, so
// sparse files count for what they hold).
func diskUse(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if fi, err := d.Info(); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			}
		}
		return nil
	})
	return n
}

// logLines reads the first n lines of GET …/logs?tail=n, parsed.
func (s *server) logLines(t *testing.T, id string, n int) []map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), budget(30*time.Second))
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", s.url+"/api/sandboxes/"+id+"/logs?tail="+strconv.Itoa(n), nil)
	req.Header.Set("X-API-Key", s.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("logs of %s: %v %v", id, resp, err)
	}
	defer resp.Body.Close()
	var out []map[string]any
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 8<<20)
	for len(out) < n && sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var line map[string]any
		if err := json.Unmarshal([]byte(data), &line); err != nil {
			t.Fatalf("log line %q: %v", data, err)
		}
		out = append(out, line)
	}
	if len(out) < n {
		t.Fatalf("logs?tail=%d gave %d lines: %v", n, len(out), sc.Err())
	}
	return out
}

// TestLogCapUnderFlood: a command that writes 200 MB of output grows the
// data directory by at most the log cap (default 8 MiB per sandbox, plus a
// little), and the log's tail still shows the newest lines.
func TestLogCapUnderFlood(t *testing.T) {
	s := startServer(t, "")
	id := s.create(t)
	before := diskUse(t, s.dataDir)
	// 2,200,000 lines of 91 bytes: ~200 MB.
	var out execReply
	code, body := s.do("POST", "/api/sandboxes/"+id+"/exec", map[string]any{"cmd": `seq -f '%090.0f' 1 2200000`, "timeoutMs": 600000}, &out)
	if code != 200 || out.ExitCode != 0 || !out.Truncated {
		t.Fatalf("flood: %d %.300s", code, body)
	}
	grown := diskUse(t, s.dataDir) - before
	t.Logf("data directory grew by %d KiB under a 200 MB flood", grown>>10)
	if grown > 8<<20+2<<20 {
		t.Fatalf("data directory grew by %d MiB; the log cap is 8 MiB", grown>>20)
	}
	lines := s.logLines(t, id, 3)
	msgs := []string{lines[0]["message"].(string), lines[1]["message"].(string), lines[2]["message"].(string)}
	if !strings.HasSuffix(msgs[0], "2199999") || !strings.HasSuffix(msgs[1], "2200000") || !strings.HasPrefix(msgs[2], "exit 0") {
		t.Fatalf("the log's tail: %q", msgs)
	}
	s.do("DELETE", "/api/sandboxes/"+id, nil, nil)
	s.waitNoLeaks(t)
	if ents, _ := os.ReadDir(filepath.Join(s.dataDir, "logs")); len(ents) != 0 {
		t.Fatalf("logs left after delete: %v", ents)
	}
}

// fill writes a file at path until the file system holding it has only
// leave bytes free.
func fill(t *testing.T, path string, leave int64) {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(filepath.Dir(path), &st); err != nil {
		t.Fatal(err)
	}
	size := int64(st.Bavail)*st.Bsize - leave
	if size <= 0 {
		return
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
		// tmpfs allocates on write too.
		buf := make([]byte, 1<<20)
		for size > 0 {
			n := min(size, int64(len(buf)))
			if _, err := f.Write(buf[:n]); err != nil {
				t.Fatalf("fill: %v", err)
			}
			size -= n
		}
	}
}

// TestDiskWatermark: on a data directory (a small tmpfs) filled below the
// watermark, creates, snapshots, pauses, volume creates and uploads answer
// 507 insufficient_storage and leave nothing; a snapshot that fills the
// disk half-way answers the same and leaves no partial image; once space
// is freed, they work again.
func TestDiskWatermark(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "data")
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dataDir, "tmpfs", 0, "size=400m"); err != nil {
		t.Skipf("cannot mount a tmpfs: %v", err)
	}
	// Runs after the server's cleanup (cleanups run last-in first-out).
	t.Cleanup(func() { unix.Unmount(dataDir, unix.MNT_DETACH) })
	s := startServer(t, dataDir, "--disk-watermark", "10")
	id := s.create(t)
	s.sh(t, id, counterScript)
	pid, _ := s.counter(t, id)
	filler := filepath.Join(dataDir, "filler")
	fill(t, filler, 20<<20) // 20 MiB of 400 free: 5%, below 10%

	entries := func(dir string) []string {
		ents, _ := os.ReadDir(filepath.Join(dataDir, dir))
		var out []string
		for _, e := range ents {
			out = append(out, e.Name())
		}
		return out
	}
	sandboxesBefore, volumesBefore := entries("sandboxes"), entries("volumes")
	const msg = "below the 10.0% watermark"
	code, body := s.do("POST", "/api/sandboxes", map[string]any{"template": "base", "size": "nano"}, nil)
	wantRefusal(t, "create on a full disk", code, body, 507, "insufficient_storage", msg)
	code, body = s.do("POST", "/api/sandboxes/"+id+"/snapshot", map[string]any{"name": "x"}, nil)
	wantRefusal(t, "snapshot on a full disk", code, body, 507, "insufficient_storage", msg)
	code, body = s.do("POST", "/api/sandboxes/"+id+"/fork", map[string]any{"count": 1}, nil)
	wantRefusal(t, "fork on a full disk", code, body, 507, "insufficient_storage", msg)
	code, body = s.do("POST", "/api/sandboxes/"+id+"/pause", nil, nil)
	wantRefusal(t, "pause on a full disk", code, body, 507, "insufficient_storage", msg)
	code, body = s.do("POST", "/api/projects/default/volumes", map[string]any{"name": "v", "sizeGb": 1}, nil)
	wantRefusal(t, "volume create on a full disk", code, body, 507, "insufficient_storage", msg)
	code, body = s.do("POST", "/api/sandboxes/"+id+"/files", map[string]any{"path": "/root/upload", "content": "hello"}, nil)
	wantRefusal(t, "upload on a full disk", code, body, 507, "insufficient_storage", msg)
	if got := s.sh(t, id, "ls /root/upload 2>&1 || true"); !strings.Contains(got, "No such file") {
		t.Fatalf("a refused upload left %q", got)
	}
	if st := s.status(t, id); st != "running" {
		t.Fatalf("after a refused pause: %s", st)
	}
	if got := entries("snapshots"); len(got) > 0 && !(len(got) == 1 && got[0] == "forks" && len(entries("snapshots/forks")) == 0) {
		t.Fatalf("snapshots left: %v %v", got, entries("snapshots/forks"))
	}
	if got := entries("sandboxes"); strings.Join(got, " ") != strings.Join(sandboxesBefore, " ") {
		t.Fatalf("sandbox directories %v, were %v", got, sandboxesBefore)
	}
	if got := entries("volumes"); strings.Join(got, " ") != strings.Join(volumesBefore, " ") {
		t.Fatalf("volumes %v, were %v", got, volumesBefore)
	}

	// Above the watermark but with less room than the sandbox's memory:
	// the checkpoint fills the disk, answers 507 and leaves no image.
	os.Remove(filler)
	// 120 MB of random bytes in a process's memory, which the image holds.
	s.sh(t, id, `nohup python3 -c 'import os, time; b = os.urandom(120_000_000); open("/tmp/big.ready", "w").write(str(os.getpid())); time.sleep(3600)' >/dev/null 2>&1 &
for i in $(seq 100); do [ -e /tmp/big.ready ] && break; sleep 0.1; done; ls /tmp/big.ready`)
	fill(t, filler, 60<<20) // 60 MiB: 15% free, above 10%
	code, body = s.do("POST", "/api/sandboxes/"+id+"/snapshot", map[string]any{"name": "y"}, nil)
	wantRefusal(t, "snapshot that fills the disk", code, body, 507, "insufficient_storage", "is full")
	if got := entries("snapshots"); len(got) != 0 {
		t.Fatalf("partial image left: %v", got)
	}
	if p, _ := s.counter(t, id); p != pid {
		t.Fatalf("sandbox after a snapshot that filled the disk: counter pid %d, want %d", p, pid)
	}
	s.sh(t, id, "kill $(cat /tmp/big.ready); rm /tmp/big.ready")
	// An upload larger than the room left fills the disk half-way: 507,
	// no partial file, and the file it was to replace as it was.
	s.sh(t, id, "echo old > /root/big")
	code, body = s.do("POST", "/api/sandboxes/"+id+"/files", map[string]any{"path": "/root/big", "content": strings.Repeat("a", 63_000_000)}, nil)
	wantRefusal(t, "upload that fills the disk", code, body, 507, "insufficient_storage", "is full")
	if got := s.sh(t, id, "cat /root/big; ls -a /root | grep -c lizard || true"); got != "old\n0\n" {
		t.Fatalf("an upload that filled the disk left %q", got)
	}

	// Space freed: all of it works again.
	os.Remove(filler)
	if code, body := s.do("POST", "/api/sandboxes/"+id+"/files", map[string]any{"path": "/root/upload", "content": "hello"}, nil); code >= 300 {
		t.Fatalf("upload after freeing space: %d %s", code, body)
	}
	if got := s.sh(t, id, "cat /root/upload"); got != "hello" {
		t.Fatalf("uploaded file: %q", got)
	}
	if code, body := s.do("POST", "/api/sandboxes/"+id+"/snapshot", map[string]any{"name": "z"}, nil); code != 201 {
		t.Fatalf("snapshot after freeing space: %d %s", code, body)
	}
	code, body = s.do("POST", "/api/sandboxes", map[string]any{"template": "base", "size": "nano"}, nil)
	if code >= 300 {
		t.Fatalf("create after freeing space: %d %s", code, body)
	}
	if code, body := s.do("POST", "/api/sandboxes/"+id+"/pause", nil, nil); code != 200 {
		t.Fatalf("pause after freeing space: %d %s", code, body)
	}
	s.deleteAll(t)
	s.stop()
	unix.Unmount(dataDir, unix.MNT_DETACH)
	s.waitNoLeaks(t)
}
