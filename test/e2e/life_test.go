package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/runtime/gvisor"
)

// runscBin is the runsc the tests' servers run.
func runscBin() string {
	if r := os.Getenv("LIZARD_RUNSC"); r != "" {
		return r
	}
	return "runsc"
}

// runscContainers lists the containers runsc holds for this server, sorted.
func (s *server) runscContainers(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command(runscBin(), "--root", gvisor.RunscRootFor(s.dataDir), "list", "--format", "json").Output()
	if err != nil {
		t.Fatalf("runsc list: %v", err)
	}
	var list []struct {
		ID string `json:"id"`
	}
	if b := strings.TrimSpace(string(out)); b != "" && b != "null" {
		if err := json.Unmarshal([]byte(b), &list); err != nil {
			t.Fatalf("runsc list: %v: %s", err, out)
		}
	}
	return sortedIDs(list, func(c struct {
		ID string `json:"id"`
	}) string {
		return c.ID
	})
}

// sortedIDs is the id of each item, sorted.
func sortedIDs[T any](items []T, id func(T) string) []string {
	ids := []string{}
	for _, it := range items {
		ids = append(ids, id(it))
	}
	slices.Sort(ids)
	return ids
}

// sandboxDirs lists the server's sandbox directories, sorted.
func (s *server) sandboxDirs() []string {
	ents, _ := os.ReadDir(filepath.Join(s.dataDir, "sandboxes"))
	return sortedIDs(ents, os.DirEntry.Name)
}

// listed lists the ids of the sandboxes the API shows, sorted.
func (s *server) listed(t *testing.T) []string {
	t.Helper()
	var list []sandboxInfo
	if code, body := s.do("GET", "/api/sandboxes", nil, &list); code != http.StatusOK {
		t.Fatalf("list: %d %s", code, body)
	}
	return sortedIDs(list, func(sb sandboxInfo) string { return sb.SandboxID })
}

// createNano makes a nano sandbox; safe in goroutines.
func (s *server) createNano(ctx context.Context) (string, error) {
	var sb sandboxInfo
	code, body, err := s.request(ctx, s.key, "POST", "/api/sandboxes", map[string]any{"template": "base", "size": "nano", "timeoutMs": 600000}, &sb)
	if err != nil {
		return "", err
	}
	if code != http.StatusCreated && code != http.StatusOK {
		return "", fmt.Errorf("create: %d %s", code, body)
	}
	return sb.SandboxID, nil
}

// createMany makes n nano sandboxes, k at a time.
func (s *server) createMany(t *testing.T, n, k int) []string {
	t.Helper()
	ids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, k)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			ids[i], errs[i] = s.createNano(context.Background())
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

// execOK runs cmd in sandbox id; safe in goroutines. It returns the status
// and, on 200, stdout.
func (s *server) execOK(id, cmd string) (int, string, error) {
	var out execReply
	code, body, err := s.request(context.Background(), s.key, "POST", "/api/sandboxes/"+id+"/exec", map[string]any{"cmd": cmd}, &out)
	if err != nil {
		return 0, "", err
	}
	if code != http.StatusOK {
		return code, string(body), nil
	}
	return code, out.Stdout, nil
}

// TestDeleteAborted: a DELETE whose client hangs up at a random moment
// still finishes on the server: afterwards every sandbox is either listed
// and running in runsc, or gone from both, and once the rest are deleted no
// runsc container is left.
func TestDeleteAborted(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewSource(seed))
	s := startServer(t, "")
	ids := s.createMany(t, 20, 4)
	for _, id := range ids {
		after := time.Duration(rng.Intn(61)) * time.Millisecond
		ctx, cancel := context.WithTimeout(context.Background(), after)
		code, _, err := s.request(ctx, s.key, "DELETE", "/api/sandboxes/"+id, nil, nil)
		cancel()
		t.Logf("DELETE %s cut after %v: %d %v", id, after, code, err)
	}
	// Deletes the server got go on after their clients left: wait until
	// what the API lists is what runsc runs and what is on disk.
	var listed, running, dirs []string
	for deadline := time.Now().Add(budget(60 * time.Second)); ; {
		listed, running, dirs = s.listed(t), s.runscContainers(t), s.sandboxDirs()
		if slices.Equal(listed, running) && slices.Equal(listed, dirs) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("inconsistent after aborted deletes: listed %v, runsc %v, dirs %v", listed, running, dirs)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("%d of %d sandboxes survived their aborted DELETE", len(listed), len(ids))
	for _, id := range listed {
		if code, out, err := s.execOK(id, "echo alive"); err != nil || code != http.StatusOK || out != "alive\n" {
			t.Fatalf("listed sandbox %s: %d %q %v", id, code, out, err)
		}
		if code, body := s.do("DELETE", "/api/sandboxes/"+id, nil, nil); code != http.StatusNoContent && code != http.StatusOK {
			t.Fatalf("delete %s: %d %s", id, code, body)
		}
	}
	if c := s.runscContainers(t); len(c) != 0 {
		t.Fatalf("runsc containers left: %v", c)
	}
	s.waitNoLeaks(t)
}

// TestCreateWaves: 150 nano sandboxes made in waves of 30, each deleted after
// its first command, while the death watcher looks every 100 ms: none is
// lost, every first command runs, and no sandbox is declared dead.
func TestCreateWaves(t *testing.T) {
	s := startServer(t, "", "--watch-interval", "100ms")
	const waves, perWave = 5, 30
	for w := range waves {
		errs := make([]error, perWave)
		var wg sync.WaitGroup
		for i := range perWave {
			wg.Add(1)
			go func() {
				defer wg.Done()
				id, err := s.createNano(context.Background())
				if err != nil {
					errs[i] = err
					return
				}
				code, out, err := s.execOK(id, "echo first")
				if err != nil || code != http.StatusOK || out != "first\n" {
					errs[i] = fmt.Errorf("first exec in %s: %d %q %v", id, code, out, err)
				}
				if code, body, err := s.request(context.Background(), s.key, "DELETE", "/api/sandboxes/"+id, nil, nil); err != nil || code >= 300 {
					errs[i] = fmt.Errorf("delete %s: %d %s %v (after: %v)", id, code, body, err, errs[i])
				}
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatalf("wave %d: %v", w, err)
			}
		}
	}
	if strings.Contains(s.logs(), "sandbox died") {
		t.Fatalf("a healthy sandbox was declared dead:\n%s", grepLines(s.logs(), "sandbox died"))
	}
	s.waitNoLeaks(t)
}

func grepLines(text, sub string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestRestartBusy: after a kill -9 with 30 sandboxes burning CPU, the next
// server reattaches all 30; while it probes, a sandbox whose agent does not
// answer yet answers 503 recovering (with Retry-After), not 404, and is
// reattached once its agent answers.
func TestRestartBusy(t *testing.T) {
	s := startServer(t, "")
	ids := s.createMany(t, 31, 6)
	busy, slow := ids[:30], ids[30]
	for _, id := range busy {
		if code, out, err := s.execOK(id, "nohup sh -c 'while :; do :; done' > /dev/null 2>&1 & echo started"); err != nil || code != 200 || out != "started\n" {
			t.Fatalf("start burner in %s: %d %q %v", id, code, out, err)
		}
	}
	code, addr, err := s.execOK(slow, "hostname -I")
	if err != nil || code != 200 {
		t.Fatalf("address of %s: %d %v", slow, code, err)
	}
	addr = strings.TrimSpace(addr)

	s.crash()
	// The slow sandbox's agent cannot be reached until unblocked.
	const table = "lztest_block"
	nft := func(args ...string) {
		if out, err := exec.Command("nft", args...).CombinedOutput(); err != nil {
			t.Fatalf("nft %v: %v %s", args, err, out)
		}
	}
	nft("add", "table", "inet", table)
	t.Cleanup(func() { exec.Command("nft", "delete", "table", "inet", table).Run() })
	nft("add", "chain", "inet", table, "out", "{ type filter hook output priority 0 ; }")
	nft("add", "rule", "inet", table, "out", "ip", "daddr", addr, "tcp", "dport", "49983", "drop")
	s.startAnswering()
	// Where the start's time went (debug lines of serve).
	t.Logf("restart under load:\n%s", grepLines(s.logs(), "startup"))
	defer func() { t.Logf("reconcile:\n%s", grepLines(s.logs(), "reconcile")) }()

	req, _ := http.NewRequest("GET", s.url+"/api/sandboxes/"+slow, nil)
	req.Header.Set("X-API-Key", s.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var body errorReply
	json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || body.Code != "recovering" || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("sandbox not yet reattached: %d %+v Retry-After %q, want 503 recovering", resp.StatusCode, body, resp.Header.Get("Retry-After"))
	}
	if code, out, _ := s.execOK(slow, "true"); code != http.StatusServiceUnavailable {
		t.Fatalf("exec in a sandbox not yet reattached: %d %s, want 503", code, out)
	}
	// The rest of the API works meanwhile.
	if code, body := s.do("GET", "/api/sandboxes", nil, nil); code != http.StatusOK {
		t.Fatalf("list during recovery: %d %s", code, body)
	}

	waitExec := func(id string) {
		t.Helper()
		for deadline := time.Now().Add(budget(90 * time.Second)); ; {
			code, out, err := s.execOK(id, "echo back")
			switch {
			case err == nil && code == http.StatusOK && out == "back\n":
				return
			case err != nil || code != http.StatusServiceUnavailable:
				t.Fatalf("exec in %s after restart: %d %q %v", id, code, out, err)
			case time.Now().After(deadline):
				t.Fatalf("%s still recovering after %v", id, budget(90*time.Second))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	for _, id := range busy {
		waitExec(id)
	}
	exec.Command("nft", "delete", "table", "inet", table).Run()
	waitExec(slow)
	s.endSurvived(t)
}

// endSurvived fails the test if recovery destroyed a sandbox it found, then
// deletes every sandbox and checks nothing is left.
func (s *server) endSurvived(t *testing.T) {
	t.Helper()
	if l := grepLines(s.logs(), "did not survive"); l != "" {
		t.Fatalf("recovery destroyed live sandboxes:\n%s", l)
	}
	s.deleteAll(t)
	s.waitNoLeaks(t)
}

type errorReply struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// TestDNSAcrossRestart: lookups a sandbox makes while the server restarts
// (gracefully, then with kill -9) all succeed within 2 s, and a restricted
// sandbox's allow list still works after: the name it may reach resolves
// and is reachable, another is not.
func TestDNSAcrossRestart(t *testing.T) {
	startFakeInternet(t)
	s := startServer(t, "", "--dns-upstream", "10.99.0.1:5353")
	open := s.createWith(t, map[string]any{})
	byName := s.createWith(t, map[string]any{"internetAccess": false, "allowedHosts": []string{"allowed.test"}})
	ids := []string{open.SandboxID, byName.SandboxID}
	const loop = `rm -f /tmp/dns.log /tmp/stop; ( while [ ! -e /tmp/stop ]; do s=$(date +%s%N); if getent hosts allowed.test > /dev/null; then r=ok; else r=fail; fi; e=$(date +%s%N); echo "$r $(( (e - s) / 1000000 ))" >> /tmp/dns.log; sleep 0.05; done; touch /tmp/stopped ) > /dev/null 2>&1 & echo started`
	for _, id := range ids {
		if code, out, err := s.execOK(id, loop); err != nil || code != 200 || out != "started\n" {
			t.Fatalf("start lookups in %s: %d %q %v", id, code, out, err)
		}
	}
	time.Sleep(time.Second)
	s.stop()
	s.start()
	time.Sleep(time.Second)
	s.crash()
	s.start()
	time.Sleep(time.Second)
	for _, id := range ids {
		if code, out, err := s.execOK(id, "touch /tmp/stop; while [ ! -e /tmp/stopped ]; do sleep 0.1; done; cat /tmp/dns.log"); err != nil || code != 200 {
			t.Fatalf("lookups of %s: %d %q %v", id, code, out, err)
		} else {
			lines := strings.Split(strings.TrimSpace(out), "\n")
			worst := 0
			for _, l := range lines {
				r, ms, _ := strings.Cut(l, " ")
				n, err := strconv.Atoi(ms)
				if r != "ok" || err != nil || n > int(budget(2*time.Second).Milliseconds()) {
					t.Fatalf("sandbox %s: a lookup during the restarts failed or took over %v: %q (all: %q)", id, budget(2*time.Second), l, out)
				}
				worst = max(worst, n)
			}
			t.Logf("sandbox %s: %d lookups across two restarts, slowest %d ms", id, len(lines), worst)
		}
	}
	if got := s.reach(t, byName.SandboxID, "http://allowed.test:8080/"); got != "internet 10.99.0.2" {
		t.Fatalf("restricted sandbox after restart, allowed name: %q", got)
	}
	if got := s.reach(t, byName.SandboxID, "http://denied.test:8080/"); got != "" {
		t.Fatalf("restricted sandbox after restart, other name: %q", got)
	}
	for _, id := range ids {
		s.do("DELETE", "/api/sandboxes/"+id, nil, nil)
	}
	s.waitNoLeaks(t)
}

// setManifest rewrites field of the checkpoint manifest in image and
// returns the old content.
func setManifest(t *testing.T, image string, edit func(m map[string]any)) []byte {
	t.Helper()
	p := filepath.Join(image, "lizard-checkpoint.json")
	old, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("checkpoint manifest: %v", err)
	}
	var m map[string]any
	if err := json.Unmarshal(old, &m); err != nil {
		t.Fatal(err)
	}
	if v, _ := m["runscDigest"].(string); !strings.HasPrefix(v, "sha256:") {
		t.Fatalf("manifest without the runsc digest: %s", old)
	}
	edit(m)
	b, _ := json.Marshal(m)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return old
}

// TestIncompatibleCheckpoint: a snapshot or pause image recorded as made by
// another runsc build, or on a CPU with a feature this one lacks, is
// refused with 409 incompatible_checkpoint naming the mismatch, and kept:
// put back as it was, it restores.
func TestIncompatibleCheckpoint(t *testing.T) {
	s := startServer(t, "")
	src := s.createMany(t, 1, 1)[0]
	var snap struct {
		ID string `json:"id"`
	}
	if code, body := s.do("POST", "/api/sandboxes/"+src+"/snapshot", map[string]any{"poolSize": 0}, &snap); code != http.StatusCreated {
		t.Fatalf("snapshot: %d %s", code, body)
	}
	image := filepath.Join(s.dataDir, "snapshots", snap.ID)
	old := setManifest(t, image, func(m map[string]any) { m["runscVersion"] = "runsc version release-19990101.0" })
	code, body := s.do("POST", "/api/sandboxes", map[string]any{"snapshotId": snap.ID}, nil)
	if code != http.StatusConflict || !strings.Contains(string(body), `"incompatible_checkpoint"`) || !strings.Contains(string(body), "release-19990101.0") {
		t.Fatalf("restore of another build's snapshot: %d %s, want 409 incompatible_checkpoint naming the build", code, body)
	}
	if _, err := os.Stat(filepath.Join(image, "checkpoint.img")); err != nil {
		t.Fatalf("the refused snapshot's image: %v", err)
	}
	if code, _ := s.do("GET", "/api/sandbox-snapshots/"+snap.ID, nil, nil); code != http.StatusOK {
		t.Fatalf("the refused snapshot: %d", code)
	}
	os.WriteFile(filepath.Join(image, "lizard-checkpoint.json"), old, 0o600)
	var copySb sandboxInfo
	if code, body := s.do("POST", "/api/sandboxes", map[string]any{"snapshotId": snap.ID}, &copySb); code >= 300 {
		t.Fatalf("restore with the manifest put back: %d %s", code, body)
	}

	if code, body := s.do("POST", "/api/sandboxes/"+src+"/pause", nil, nil); code >= 300 {
		t.Fatalf("pause: %d %s", code, body)
	}
	pauseImage := filepath.Join(s.dataDir, "sandboxes", src, "checkpoint")
	old = setManifest(t, pauseImage, func(m map[string]any) {
		m["cpuFeatures"] = append(m["cpuFeatures"].([]any), "lizard_no_such_cpu_flag")
	})
	code, body = s.do("POST", "/api/sandboxes/"+src+"/resume", nil, nil)
	if code != http.StatusConflict || !strings.Contains(string(body), `"incompatible_checkpoint"`) || !strings.Contains(string(body), "lizard_no_such_cpu_flag") {
		t.Fatalf("resume on a CPU without a feature: %d %s, want 409 incompatible_checkpoint naming it", code, body)
	}
	var info sandboxInfo
	if code, _ := s.do("GET", "/api/sandboxes/"+src, nil, &info); code != http.StatusOK || info.Status != "paused" {
		t.Fatalf("sandbox after a refused resume: %d %+v, want paused", code, info)
	}
	if _, err := os.Stat(filepath.Join(pauseImage, "checkpoint.img")); err != nil {
		t.Fatalf("the refused pause image: %v", err)
	}
	os.WriteFile(filepath.Join(pauseImage, "lizard-checkpoint.json"), old, 0o600)
	if code, body := s.do("POST", "/api/sandboxes/"+src+"/resume", nil, nil); code >= 300 {
		t.Fatalf("resume with the manifest put back: %d %s", code, body)
	}
	if code, out, err := s.execOK(src, "echo resumed"); err != nil || code != 200 || out != "resumed\n" {
		t.Fatalf("exec after resume: %d %q %v", code, out, err)
	}
	s.do("DELETE", "/api/sandbox-snapshots/"+snap.ID, nil, nil)
	for _, id := range []string{src, copySb.SandboxID} {
		s.do("DELETE", "/api/sandboxes/"+id, nil, nil)
	}
	s.waitNoLeaks(t)
}

// TestPoolOutlivesSnapshot: snapshots deleted while their warm pools fill
// leave no warm copy running, and a restart whose snapshot image is gone
// destroys the copies of its pool.
func TestPoolOutlivesSnapshot(t *testing.T) {
	s := startServer(t, "")
	src := s.createMany(t, 1, 1)[0]
	var snaps []string
	for range 5 {
		var snap struct {
			ID string `json:"id"`
		}
		if code, body := s.do("POST", "/api/sandboxes/"+src+"/snapshot", map[string]any{"poolSize": 5}, &snap); code != http.StatusCreated {
			t.Fatalf("snapshot: %d %s", code, body)
		}
		snaps = append(snaps, snap.ID)
		var cp sandboxInfo
		if code, body := s.do("POST", "/api/sandboxes", map[string]any{"snapshotId": snap.ID}, &cp); code >= 300 {
			t.Fatalf("restore: %d %s", code, body)
		}
		if code, body := s.do("DELETE", "/api/sandbox-snapshots/"+snap.ID, nil, nil); code >= 300 {
			t.Fatalf("delete snapshot: %d %s", code, body)
		}
		if code, body := s.do("DELETE", "/api/sandboxes/"+cp.SandboxID, nil, nil); code >= 300 {
			t.Fatalf("delete copy: %d %s", code, body)
		}
	}
	// Wait until no pool is filling any more, then count.
	for deadline := time.Now().Add(budget(60 * time.Second)); ; {
		logs, busy := s.logs(), false
		for _, id := range snaps {
			if strings.Count(logs, `msg="warm pool: filling" component=snapshot snapshot=`+id) != strings.Count(logs, `msg="warm pool: filled" component=snapshot snapshot=`+id) {
				busy = true
			}
		}
		if !busy {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("warm pools still filling after %v", budget(60*time.Second))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if c, d := s.runscContainers(t), s.sandboxDirs(); !slices.Equal(c, []string{src}) || !slices.Equal(d, []string{src}) {
		t.Fatalf("after deleting snapshots whose pools were filling: runsc %v, dirs %v, want only %s", c, d, src)
	}

	// A pool whose snapshot is gone at the next start goes with it.
	var snap struct {
		ID         string `json:"id"`
		ReadyCount int    `json:"readyCount"`
	}
	if code, body := s.do("POST", "/api/sandboxes/"+src+"/snapshot", map[string]any{"poolSize": 3}, &snap); code != http.StatusCreated {
		t.Fatalf("snapshot: %d %s", code, body)
	}
	for deadline := time.Now().Add(budget(60 * time.Second)); snap.ReadyCount < 3; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("pool did not fill: %+v", snap)
		}
		s.do("GET", "/api/sandbox-snapshots/"+snap.ID, nil, &snap)
	}
	if c := s.runscContainers(t); len(c) != 4 {
		t.Fatalf("source and 3 warm copies: runsc %v", c)
	}
	s.crash()
	if err := os.RemoveAll(filepath.Join(s.dataDir, "snapshots", snap.ID)); err != nil {
		t.Fatal(err)
	}
	s.start()
	if c, d := s.runscContainers(t), s.sandboxDirs(); !slices.Equal(c, []string{src}) || !slices.Equal(d, []string{src}) {
		t.Fatalf("after a restart without the snapshot: runsc %v, dirs %v, want only %s", c, d, src)
	}
	if code, _ := s.do("GET", "/api/sandbox-snapshots/"+snap.ID, nil, nil); code != http.StatusNotFound {
		t.Fatalf("snapshot without its image after restart: %d, want 404", code)
	}
	s.do("DELETE", "/api/sandboxes/"+src, nil, nil)
	s.waitNoLeaks(t)
}

// TestRestartFrozen: sandboxes frozen from the host (their runsc sandbox
// process stopped with SIGSTOP) across a restart, and thawed only after
// recovery's probe deadline, are never destroyed: while frozen they are
// listed as unresponsive and calls answer 503 unresponsive with
// Retry-After; once thawed they are reattached with their files and
// processes.
func TestRestartFrozen(t *testing.T) {
	metricsAddr := freeAddr(t)
	s := startServer(t, "", "--recover-probe-timeout", "2s", "--metrics-listen", metricsAddr)
	ids := s.createMany(t, 3, 3)
	for _, id := range ids {
		if code, out, err := s.execOK(id, "sleep 1000 > /dev/null 2>&1 & echo $! > /tmp/pid; echo kept > /tmp/file; echo ok"); err != nil || code != 200 || out != "ok\n" {
			t.Fatalf("set up %s: %d %q %v", id, code, out, err)
		}
	}
	s.crash()
	root := gvisor.RunscRootFor(s.dataDir)
	var pids []int
	for _, id := range ids {
		out, err := exec.Command(runscBin(), "--root", root, "state", id).Output()
		if err != nil {
			t.Fatalf("runsc state %s: %v", id, err)
		}
		var st struct {
			Pid int `json:"pid"`
		}
		if err := json.Unmarshal(out, &st); err != nil || st.Pid <= 1 {
			t.Fatalf("runsc state %s: %q %v", id, out, err)
		}
		pids = append(pids, st.Pid)
	}
	thaw := func() {
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	t.Cleanup(thaw)
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatalf("SIGSTOP %d: %v", pid, err)
		}
	}
	// runsc state and list wait on a frozen sandbox: each gives up after
	// its own timeout, so recovery takes longer than usual here.
	done := strings.Count(s.logs(), recoveryDone)
	s.startAnswering()
	for deadline := time.Now().Add(budget(4 * time.Minute)); strings.Count(s.logs(), recoveryDone) <= done; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("recovery did not finish within 4 minutes:\n%s", grepLines(s.logs(), "recover"))
		}
	}
	for _, id := range ids {
		var info sandboxInfo
		if code, body := s.do("GET", "/api/sandboxes/"+id, nil, &info); code != http.StatusOK || info.Status != "unresponsive" {
			t.Fatalf("frozen %s after recovery: %d %s, want status unresponsive", id, code, body)
		}
		req, _ := http.NewRequest("POST", s.url+"/api/sandboxes/"+id+"/exec", strings.NewReader(`{"cmd":"true"}`))
		req.Header.Set("X-API-Key", s.key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body errorReply
		json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || body.Code != "unresponsive" || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("exec in frozen %s: %d %+v Retry-After %q, want 503 unresponsive", id, resp.StatusCode, body, resp.Header.Get("Retry-After"))
		}
	}
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(m), `state="unresponsive"`) {
		t.Fatalf("metrics show no unresponsive sandbox:\n%s", grepLines(string(m), "lizard_sandboxes"))
	}
	// Well past the probe's deadline, still frozen: still kept.
	time.Sleep(3 * time.Second)
	thaw()
	for _, id := range ids {
		for deadline := time.Now().Add(budget(90 * time.Second)); ; {
			code, out, err := s.execOK(id, "cat /tmp/file; kill -0 $(cat /tmp/pid) && echo alive")
			if err == nil && code == http.StatusOK {
				if out != "kept\nalive\n" {
					t.Fatalf("%s after its thaw: %q, want its file and process", id, out)
				}
				break
			}
			if err != nil || code != http.StatusServiceUnavailable || time.Now().After(deadline) {
				t.Fatalf("exec in %s after its thaw: %d %q %v", id, code, out, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	s.endSurvived(t)
}
