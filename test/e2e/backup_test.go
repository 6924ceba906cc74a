package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
)

// TestBackupRestore: `lizard backup` taken while 20 sandboxes are being
// created, restored with `lizard restore` into a new data directory, brings
// back the projects, the API keys, the snapshots (restorable) and the
// volumes (data intact); none of the old sandboxes runs there.
func TestBackupRestore(t *testing.T) {
	s := startServer(t, "")
	lizard := filepath.Join(s.bin, "lizard")
	cli := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(lizard, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("lizard %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}

	// A second project and its key, made by the CLI beside the server.
	cli("projects", "create", "second", "--data-dir", s.dataDir)
	out := cli("keys", "create", "--project", "second", "--data-dir", s.dataDir)
	secondKey := regexp.MustCompile(`(?m)^\S{20,}$`).FindString(out)
	if secondKey == "" {
		t.Fatalf("no key in %q", out)
	}

	// A volume attached to a running sandbox, with data.
	if code, body := s.do("POST", "/api/projects/default/volumes", map[string]any{"name": "keep", "sizeGb": 1}, nil); code != http.StatusCreated {
		t.Fatalf("create volume: %d %s", code, body)
	}
	var withVol sandboxInfo
	if code, body := s.do("POST", "/api/sandboxes", map[string]any{"template": "base", "volumeName": "keep", "timeoutMs": 0}, &withVol); code >= 300 {
		t.Fatalf("create with volume: %d %s", code, body)
	}
	s.sh(t, withVol.SandboxID, "echo precious > /workspace/data && sync")

	// A snapshot of a sandbox with a file.
	src := s.create(t)
	s.sh(t, src, "echo snapped > /root/file")
	var snap struct {
		ID string `json:"id"`
	}
	if code, body := s.do("POST", "/api/sandboxes/"+src+"/snapshot", map[string]any{"name": "before-backup"}, &snap); code != 200 && code != 201 {
		t.Fatalf("snapshot: %d %s", code, body)
	}

	// The backup, while 20 sandboxes are being created.
	const n = 20
	var wg sync.WaitGroup
	created := make([]string, n)
	errs := make([]string, n)
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			var sb sandboxInfo
			code, body, err := s.request(context.Background(), s.key, "POST", "/api/sandboxes", map[string]any{"template": "base", "size": "nano", "timeoutMs": 0}, nil)
			if err != nil || code >= 300 {
				errs[i] = fmt.Sprintf("create %d: %d %s %v", i, code, body, err)
				return
			}
			if err := json.Unmarshal(body, &sb); err != nil {
				errs[i] = fmt.Sprintf("create %d: decode %q: %v", i, body, err)
				return
			}
			created[i] = sb.SandboxID
		}()
	}
	archive := filepath.Join(t.TempDir(), "lizard.tar.zst")
	close(start)
	backupOut := cli("backup", archive, "--data-dir", s.dataDir)
	wg.Wait()
	for _, e := range errs {
		if e != "" {
			t.Error(e)
		}
	}
	t.Logf("lizard backup: %s", backupOut)
	if !strings.Contains(backupOut, "attached to sandbox "+withVol.SandboxID) {
		t.Errorf("no warning about the attached volume in %q", backupOut)
	}

	// The old server goes away with its sandboxes: two servers must not
	// share the bridge.
	var list []sandboxInfo
	s.do("GET", "/api/sandboxes", nil, &list)
	if len(list) != n+2 {
		t.Errorf("%d sandboxes before the restore, want %d", len(list), n+2)
	}
	var oldIDs []string
	for _, sb := range list {
		oldIDs = append(oldIDs, sb.SandboxID)
		s.do("DELETE", "/api/sandboxes/"+sb.SandboxID, nil, nil)
	}
	s.stop()
	s.waitNoLeaks(t)

	newDir := filepath.Join(t.TempDir(), "restored")
	t.Log(cli("restore", archive, "--data-dir", newDir))
	// Not again into a directory that holds something.
	if out, err := exec.Command(lizard, "restore", archive, "--data-dir", newDir).CombinedOutput(); err == nil || !strings.Contains(string(out), "not empty") {
		t.Errorf("restore into a non-empty data dir: %v %s", err, out)
	}

	r := startServer(t, newDir)
	// The old keys work; projects are back.
	var projects []struct {
		Slug string `json:"slug"`
	}
	if code, body := r.do("GET", "/api/projects", nil, &projects); code != 200 || len(projects) != 1 || projects[0].Slug != "default" {
		t.Fatalf("projects with the old default key: %d %s", code, body)
	}
	if code, body := r.doKey(secondKey, "GET", "/api/projects", nil, &projects); code != 200 || len(projects) != 1 || projects[0].Slug != "second" {
		t.Fatalf("projects with the old second key: %d %s", code, body)
	}
	// No old sandbox runs here.
	r.do("GET", "/api/sandboxes", nil, &list)
	for _, sb := range list {
		if slices.Contains(oldIDs, sb.SandboxID) {
			t.Errorf("sandbox %s of the backup is listed after the restore (%s)", sb.SandboxID, sb.Status)
		}
	}
	// The snapshot restores, with its file.
	var restored sandboxInfo
	if code, body := r.do("POST", "/api/sandboxes", map[string]any{"snapshotId": snap.ID}, &restored); code >= 300 {
		t.Fatalf("restore the snapshot after the restore: %d %s", code, body)
	}
	if got := r.sh(t, restored.SandboxID, "cat /root/file"); got != "snapped\n" {
		t.Errorf("file in the restored snapshot: %q", got)
	}
	// The volume is there, detached, with its data.
	var vol struct {
		Name       string `json:"name"`
		AttachedTo string `json:"attachedTo"`
	}
	if code, body := r.do("GET", "/api/projects/default/volumes/keep", nil, &vol); code != 200 || vol.AttachedTo != "" {
		t.Fatalf("volume after the restore: %d %s", code, body)
	}
	var user sandboxInfo
	if code, body := r.do("POST", "/api/sandboxes", map[string]any{"template": "base", "volumeName": "keep"}, &user); code >= 300 {
		t.Fatalf("sandbox with the restored volume: %d %s", code, body)
	}
	if got := r.sh(t, user.SandboxID, "cat /workspace/data"); got != "precious\n" {
		t.Errorf("volume data after the restore: %q", got)
	}
	for _, id := range []string{restored.SandboxID, user.SandboxID} {
		r.do("DELETE", "/api/sandboxes/"+id, nil, nil)
	}
	r.do("DELETE", "/api/sandbox-snapshots/"+snap.ID, nil, nil)
	r.do("DELETE", "/api/projects/default/volumes/keep", nil, nil)
	r.waitNoLeaks(t)
}
