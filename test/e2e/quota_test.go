package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// apiError is an error answer as the SDKs read it.
type apiError struct {
	Code        string   `json:"code"`
	Message     string   `json:"message"`
	Unit        string   `json:"unit"`
	Limit       *float64 `json:"limit"`
	Running     *float64 `json:"running"`
	Needed      *float64 `json:"needed"`
	RetryAfterS int      `json:"retryAfterS"`
}

// wantRefusal asserts that an answer is status with code and a message holding
// want, and returns the decoded error.
func wantRefusal(t *testing.T, what string, code int, body []byte, status int, wantCode, want string) apiError {
	t.Helper()
	var e apiError
	if err := json.Unmarshal(body, &e); err != nil || code != status || e.Code != wantCode || !strings.Contains(e.Message, want) {
		t.Fatalf("%s: %d %s; want %d %s saying %q", what, code, body, status, wantCode, want)
	}
	return e
}

// postNano creates a nano sandbox (0.5 vCPU, 1 GiB) and returns the
// answer's status and body.
func (s *server) postNano() (int, []byte) {
	return s.do("POST", "/api/sandboxes", map[string]any{"template": "base", "size": "nano", "timeoutMs": 600000}, nil)
}

func sandboxID(t *testing.T, body []byte) string {
	t.Helper()
	var sb sandboxInfo
	if err := json.Unmarshal(body, &sb); err != nil || sb.SandboxID == "" {
		t.Fatalf("create answer %s: %v", body, err)
	}
	return sb.SandboxID
}

// createAtOnce sends n creates at once and returns the ids made and the
// refusals' bodies by status.
func (s *server) createAtOnce(t *testing.T, n int) (ids []string, refused map[int][][]byte) {
	t.Helper()
	refused = map[int][][]byte{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			req, _ := http.NewRequest("POST", s.url+"/api/sandboxes", strings.NewReader(`{"template":"base","size":"nano","timeoutMs":600000}`))
			req.Header.Set("X-API-Key", s.key)
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				refused[0] = append(refused[0], []byte(err.Error()))
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode == 200 || resp.StatusCode == 201 {
				var sb sandboxInfo
				json.Unmarshal(b, &sb)
				ids = append(ids, sb.SandboxID)
				return
			}
			refused[resp.StatusCode] = append(refused[resp.StatusCode], b)
		}()
	}
	close(start)
	wg.Wait()
	return ids, refused
}

func (s *server) deleteAll(t *testing.T) {
	t.Helper()
	var list []sandboxInfo
	s.do("GET", "/api/sandboxes", nil, &list)
	for _, sb := range list {
		// On a starved host the deletes take seconds each, and a sandbox
		// listed may reach its deadline before its turn: gone is gone.
		if code, body := s.do("DELETE", "/api/sandboxes/"+sb.SandboxID, nil, nil); code >= 300 && code != http.StatusNotFound {
			t.Errorf("delete %s: %d %s", sb.SandboxID, code, body)
		}
	}
	var snaps []map[string]any
	s.do("GET", "/api/sandbox-snapshots", nil, &snaps)
	for _, sn := range snaps {
		s.do("DELETE", fmt.Sprintf("/api/sandbox-snapshots/%v", sn["id"]), nil, nil)
	}
}

// TestQuotaConcurrentCreates: with a project limit of 5 sandboxes, 50
// creates at once make exactly 5; the other 45 are 429 quota_exceeded
// naming the limit and the use. Deleting makes room again. Then a vCPU
// limit: paused sandboxes hold no CPU, and a resume takes it back only if
// it fits. `lizard projects set/ls` set and show the limits.
func TestQuotaConcurrentCreates(t *testing.T) {
	s := startServer(t, "")
	out := s.cli(t, "projects", "set", "default", "--max-sandboxes", "5")
	if !strings.Contains(out, "0/5*") {
		t.Fatalf("projects set: %s", out)
	}
	ids, refused := s.createAtOnce(t, 50)
	if len(ids) != 5 || len(refused[429]) != 45 {
		t.Fatalf("50 creates at a limit of 5: %d made, refusals %v", len(ids), refused)
	}
	for _, b := range refused[429] {
		e := wantRefusal(t, "create over quota", 429, b, 429, "quota_exceeded", "project quota: sandboxes 5 of 5 in use, this needs 1")
		if e.Unit != "sandboxes" || e.Limit == nil || *e.Limit != 5 || e.Running == nil || *e.Running != 5 || e.Needed == nil || *e.Needed != 1 {
			t.Fatalf("details of the refusal: %s", b)
		}
	}
	if out := s.cli(t, "projects", "ls"); !strings.Contains(out, "5/5*") || !strings.Contains(out, "2.5/64") || !strings.Contains(out, "5/128") {
		t.Fatalf("projects ls with 5 nano sandboxes:\n%s", out)
	}
	if code, body := s.do("DELETE", "/api/sandboxes/"+ids[0], nil, nil); code >= 300 {
		t.Fatalf("delete: %d %s", code, body)
	}
	code, body := s.postNano()
	if code != 200 && code != 201 {
		t.Fatalf("create after a delete: %d %s", code, body)
	}
	ids[0] = sandboxID(t, body)
	code, body = s.postNano()
	wantRefusal(t, "6th create", code, body, 429, "quota_exceeded", "sandboxes 5 of 5 in use")

	// Now vCPUs: 5 nano sandboxes hold 2.5.
	s.cli(t, "projects", "set", "default", "--max-sandboxes", "default", "--max-vcpus", "3")
	code, body = s.postNano()
	if code != 200 && code != 201 {
		t.Fatalf("6th nano under 3 vCPUs: %d %s", code, body)
	}
	sixth := sandboxID(t, body)
	code, body = s.postNano()
	wantRefusal(t, "7th nano", code, body, 429, "quota_exceeded", "project quota: vcpus 3 of 3 in use, this needs 0.5")
	// A paused sandbox holds no CPU.
	if code, body := s.do("POST", "/api/sandboxes/"+sixth+"/pause", nil, nil); code != 200 {
		t.Fatalf("pause: %d %s", code, body)
	}
	code, body = s.postNano()
	if code != 200 && code != 201 {
		t.Fatalf("create once one is paused: %d %s", code, body)
	}
	// Its CPU is taken: it cannot resume until some is free.
	code, body = s.do("POST", "/api/sandboxes/"+sixth+"/resume", nil, nil)
	wantRefusal(t, "resume over quota", code, body, 429, "quota_exceeded", "vcpus 3 of 3 in use, this needs 0.5")
	if st := s.status(t, sixth); st != "paused" {
		t.Fatalf("after a refused resume: %s", st)
	}
	if code, body := s.do("DELETE", "/api/sandboxes/"+ids[1], nil, nil); code >= 300 {
		t.Fatalf("delete: %d %s", code, body)
	}
	if code, body := s.do("POST", "/api/sandboxes/"+sixth+"/resume", nil, nil); code != 200 {
		t.Fatalf("resume once room is made: %d %s", code, body)
	}
	out = s.cli(t, "projects", "ls")
	if !strings.Contains(out, "6/50 ") || !strings.Contains(out, "3/3*") {
		t.Fatalf("projects ls:\n%s", out)
	}
	s.deleteAll(t)
	s.waitNoLeaks(t)
}

// TestQuotaWarmPool: warm pool copies count against their snapshot's
// project, for creates and for pool size changes; snapshots have a limit of
// their own.
func TestQuotaWarmPool(t *testing.T) {
	s := startServer(t, "", "--default-max-sandboxes", "3", "--default-max-snapshots", "1")
	code, body := s.postNano()
	if code >= 300 {
		t.Fatalf("create: %d %s", code, body)
	}
	id := sandboxID(t, body)
	// 1 sandbox + a pool of 3 is over 3.
	code, body = s.do("POST", "/api/sandboxes/"+id+"/snapshot", map[string]any{"name": "p", "poolSize": 3}, nil)
	wantRefusal(t, "snapshot with a pool over quota", code, body, 429, "quota_exceeded", "sandboxes 1 of 3 in use, this needs 3")
	var snap struct {
		ID         string `json:"id"`
		ReadyCount int    `json:"readyCount"`
	}
	if code, body := s.do("POST", "/api/sandboxes/"+id+"/snapshot", map[string]any{"name": "p", "poolSize": 2}, &snap); code != 201 {
		t.Fatalf("snapshot with a pool of 2: %d %s", code, body)
	}
	for deadline := time.Now().Add(budget(time.Minute)); snap.ReadyCount < 2; {
		if time.Now().After(deadline) {
			t.Fatalf("pool not filled after %v: %+v", budget(time.Minute), snap)
		}
		time.Sleep(100 * time.Millisecond)
		s.do("GET", "/api/sandbox-snapshots/"+snap.ID, nil, &snap)
	}
	// The two warm copies and the sandbox make 3: a create is refused.
	code, body = s.postNano()
	wantRefusal(t, "create beside a full pool", code, body, 429, "quota_exceeded", "sandboxes 3 of 3 in use, this needs 1")
	code, body = s.do("PATCH", "/api/sandbox-snapshots/"+snap.ID, map[string]any{"poolSize": 3}, nil)
	wantRefusal(t, "growing the pool", code, body, 429, "quota_exceeded", "sandboxes 3 of 3 in use, this needs 1")
	// A restore claims a warm copy: no new sandbox, so it is admitted.
	code, body = s.do("POST", "/api/sandboxes", map[string]any{"snapshotId": snap.ID, "timeoutMs": 600000}, nil)
	if code >= 300 {
		t.Fatalf("restore from the pool: %d %s", code, body)
	}
	// The snapshot limit is 1.
	code, body = s.do("POST", "/api/sandboxes/"+id+"/snapshot", map[string]any{"name": "q"}, nil)
	wantRefusal(t, "second snapshot", code, body, 429, "quota_exceeded", "project quota: snapshots 1 of 1 in use, this needs 1")
	// A fork's copies must all fit.
	code, body = s.do("POST", "/api/sandboxes/"+id+"/fork", map[string]any{"count": 1}, nil)
	wantRefusal(t, "fork over quota", code, body, 429, "quota_exceeded", "sandboxes 3 of 3 in use, this needs 1")
	s.deleteAll(t)
	s.waitNoLeaks(t)
}

// TestNodeCapacity: a node of 1 vCPU with no overcommit admits two nano
// sandboxes; the third is 503 capacity with Retry-After, and one more fits
// once one goes. --max-sandboxes stays a node cap.
func TestNodeCapacity(t *testing.T) {
	s := startServer(t, "", "--node-vcpus", "1", "--cpu-overcommit", "1", "--max-sandboxes", "3")
	var ids []string
	for range 2 {
		code, body := s.postNano()
		if code >= 300 {
			t.Fatalf("create: %d %s", code, body)
		}
		ids = append(ids, sandboxID(t, body))
	}
	req, _ := http.NewRequest("POST", s.url+"/api/sandboxes", strings.NewReader(`{"template":"base","size":"nano"}`))
	req.Header.Set("X-API-Key", s.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var e apiError
	json.NewDecoder(resp.Body).Decode(&e)
	resp.Body.Close()
	if resp.StatusCode != 503 || e.Code != "capacity" || resp.Header.Get("Retry-After") == "" ||
		!strings.Contains(e.Message, "node capacity: vcpu 1 of 1 reserved, this needs 0.5") || e.RetryAfterS == 0 {
		t.Fatalf("full node: %d %+v Retry-After %q", resp.StatusCode, e, resp.Header.Get("Retry-After"))
	}
	// Paused sandboxes free the node's CPU but still count as sandboxes.
	if code, body := s.do("POST", "/api/sandboxes/"+ids[0]+"/pause", nil, nil); code != 200 {
		t.Fatalf("pause: %d %s", code, body)
	}
	code, body := s.postNano()
	if code >= 300 {
		t.Fatalf("create once one is paused: %d %s", code, body)
	}
	code, body = s.do("POST", "/api/sandboxes/"+ids[0]+"/resume", nil, nil)
	wantRefusal(t, "resume on a full node", code, body, 503, "capacity", "vcpu 1 of 1 reserved")
	if code, body := s.do("DELETE", "/api/sandboxes/"+ids[1], nil, nil); code >= 300 {
		t.Fatalf("delete: %d %s", code, body)
	}
	if code, body := s.do("POST", "/api/sandboxes/"+ids[0]+"/resume", nil, nil); code != 200 {
		t.Fatalf("resume once room is made: %d %s", code, body)
	}
	// 2 live sandboxes; pause one so CPU is free, then --max-sandboxes 3
	// allows one more and refuses the 4th.
	if code, body := s.do("POST", "/api/sandboxes/"+ids[0]+"/pause", nil, nil); code != 200 {
		t.Fatalf("pause: %d %s", code, body)
	}
	if code, body := s.postNano(); code >= 300 {
		t.Fatalf("third sandbox: %d %s", code, body)
	}
	code, body = s.postNano()
	wantRefusal(t, "4th sandbox on a node of 3", code, body, 503, "capacity", "node capacity: sandboxes 3 of 3 reserved")
	s.deleteAll(t)
	s.waitNoLeaks(t)
}
