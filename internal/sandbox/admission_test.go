package sandbox

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
)

func TestCheckAdmit(t *testing.T) {
	medium := usage{Sandboxes: 1, VCPUs: 4, MemoryMB: 8192}
	for _, c := range []struct {
		name      string
		lim       store.Limits
		node      Capacity
		max       int
		nodeUse   usage
		projUse   usage
		need      usage
		class     error
		msg, unit string
	}{
		{name: "fits", lim: store.Limits{Sandboxes: 2, VCPUs: 8, MemoryGB: 16}, node: Capacity{8, 16384}, max: 2,
			nodeUse: medium, projUse: medium, need: medium},
		{name: "no limits at all", need: medium.times(1000)},
		{name: "project sandboxes", lim: store.Limits{Sandboxes: 1}, projUse: usage{Sandboxes: 1}, need: medium,
			class: errdefs.ErrQuota, msg: "project quota: sandboxes 1 of 1 in use, this needs 1", unit: "sandboxes"},
		{name: "project vcpus", lim: store.Limits{VCPUs: 8}, projUse: usage{Sandboxes: 3, VCPUs: 8}, need: usage{Sandboxes: 1, VCPUs: 2},
			class: errdefs.ErrQuota, msg: "project quota: vcpus 8 of 8 in use, this needs 2", unit: "vcpu"},
		{name: "project half vcpus", lim: store.Limits{VCPUs: 1}, projUse: usage{VCPUs: 0.5}, need: usage{VCPUs: 0.5}},
		{name: "project memory", lim: store.Limits{MemoryGB: 10}, projUse: usage{MemoryMB: 8192}, need: usage{MemoryMB: 4096},
			class: errdefs.ErrQuota, msg: "project quota: memory-gb 8 of 10 in use, this needs 4", unit: "memory-gb"},
		{name: "quota before capacity", lim: store.Limits{Sandboxes: 1}, max: 1, nodeUse: usage{Sandboxes: 1}, projUse: usage{Sandboxes: 1},
			need: medium, class: errdefs.ErrQuota},
		{name: "node sandboxes", max: 2, nodeUse: usage{Sandboxes: 2}, need: medium,
			class: errdefs.ErrCapacity, msg: "node capacity: sandboxes 2 of 2 reserved, this needs 1", unit: "sandboxes"},
		{name: "node vcpus", node: Capacity{VCPUs: 6}, nodeUse: medium, need: medium,
			class: errdefs.ErrCapacity, msg: "node capacity: vcpu 4 of 6 reserved, this needs 4", unit: "vcpu"},
		{name: "node memory", node: Capacity{MemoryMB: 12 << 10}, nodeUse: medium, need: medium,
			class: errdefs.ErrCapacity, msg: "memory-gb 8 GiB of 12 GiB reserved, this needs 8 GiB", unit: "memory-gb"},
		{name: "resume needs no sandbox slot", lim: store.Limits{Sandboxes: 1}, max: 1, nodeUse: usage{Sandboxes: 1},
			projUse: usage{Sandboxes: 1}, need: usage{VCPUs: 4, MemoryMB: 8192}},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := checkAdmit(c.lim, c.node, c.max, c.nodeUse, c.projUse, c.need)
			if c.class == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if !errors.Is(err, c.class) {
				t.Fatalf("got %v, want class %v", err, c.class)
			}
			if !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("message %q does not say %q", err, c.msg)
			}
			var ex *errdefs.Exceeded
			if c.unit != "" && (!errors.As(err, &ex) || ex.Unit != c.unit) {
				t.Fatalf("details %+v, want unit %s", ex, c.unit)
			}
			if c.class == errdefs.ErrQuota && errdefs.Code(err) != "quota_exceeded" {
				t.Fatalf("code %q", errdefs.Code(err))
			}
		})
	}
}

// TestHolds: a paused sandbox counts as a sandbox but holds no CPU or
// memory; every other status holds both.
func TestHolds(t *testing.T) {
	for _, st := range []string{StatusCreating, StatusRunning, StatusPausing, StatusResuming, StatusPooled} {
		if u := holds(st, 2, 4096); u != (usage{1, 2, 4096}) {
			t.Errorf("%s holds %+v", st, u)
		}
	}
	if u := holds(StatusPaused, 2, 4096); u != (usage{Sandboxes: 1}) {
		t.Errorf("paused holds %+v", u)
	}
}

func testService(lim store.Limits, capacity Capacity, max int) *Service {
	return New(Config{Runtime: nil, MaxSandboxes: max, Capacity: capacity,
		Limits: func(context.Context, string) (store.Limits, error) { return lim, nil }})
}

// TestReserveConcurrent: 50 reservations at once against a limit of 5
// sandboxes: exactly 5 are admitted; released ones make room again.
func TestReserveConcurrent(t *testing.T) {
	for _, c := range []struct {
		name  string
		lim   store.Limits
		cap   Capacity
		class error
	}{
		{"project sandboxes", store.Limits{Sandboxes: 5}, Capacity{}, errdefs.ErrQuota},
		{"project vcpus", store.Limits{VCPUs: 10}, Capacity{}, errdefs.ErrQuota},
		{"node vcpus", store.Limits{}, Capacity{VCPUs: 10}, errdefs.ErrCapacity},
		{"node memory", store.Limits{}, Capacity{MemoryMB: 5 * 4096}, errdefs.ErrCapacity},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := testService(c.lim, c.cap, 100)
			var mu sync.Mutex
			var releases []func()
			refused := 0
			var wg sync.WaitGroup
			for range 50 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rec := Record{ID: store.NewID("", 20), ProjectID: "p", CPUs: 2, MemoryMB: 4096}
					release, err := s.reserve(context.Background(), rec)
					mu.Lock()
					defer mu.Unlock()
					switch {
					case err == nil:
						releases = append(releases, release)
					case errors.Is(err, c.class):
						refused++
					default:
						t.Errorf("unexpected refusal: %v", err)
					}
				}()
			}
			wg.Wait()
			if len(releases) != 5 || refused != 45 {
				t.Fatalf("admitted %d, refused %d; want 5 and 45", len(releases), refused)
			}
			releases[0]()
			releases[0]() // twice is harmless
			if _, err := s.reserve(context.Background(), Record{ID: "again", ProjectID: "p", CPUs: 2, MemoryMB: 4096}); err != nil {
				t.Fatalf("after a release: %v", err)
			}
			if _, err := s.reserve(context.Background(), Record{ID: "more", ProjectID: "p", CPUs: 2, MemoryMB: 4096}); !errors.Is(err, c.class) {
				t.Fatalf("full again: %v", err)
			}
		})
	}
}

// TestUsageOfLiveSandboxes: the live set and reservations make up the
// use; other projects' sandboxes count on the node only; a paused sandbox
// frees its CPU and memory, and resuming it takes them back only if they
// fit.
func TestUsageOfLiveSandboxes(t *testing.T) {
	s := testService(store.Limits{Sandboxes: 3, VCPUs: 8}, Capacity{}, 100)
	add := func(id, project, status string) *entry {
		e := &entry{rec: Record{ID: id, ProjectID: project, Status: status, CPUs: 4, MemoryMB: 8192}}
		s.sandboxes[id] = e
		return e
	}
	add("a", "p", StatusRunning)
	paused := add("b", "p", StatusPaused)
	add("c", "q", StatusRunning)
	add("d", "p", StatusPooled)
	s.mu.Lock()
	node, proj := s.usageLocked("p")
	s.mu.Unlock()
	if node != (usage{4, 12, 3 * 8192}) || proj != (usage{3, 8, 2 * 8192}) {
		t.Fatalf("node %+v project %+v", node, proj)
	}
	// p is at 8 of 8 vCPUs: the paused one cannot come back.
	err := s.beginResume(context.Background(), paused)
	if !errors.Is(err, errdefs.ErrQuota) || !strings.Contains(err.Error(), "vcpus 8 of 8 in use, this needs 4") {
		t.Fatalf("resume over quota: %v", err)
	}
	if paused.rec.Status != StatusPaused {
		t.Fatalf("refused resume changed the status to %s", paused.rec.Status)
	}
	// A 4th sandbox is over the sandbox limit even though b holds no CPU.
	if _, err := s.reserve(context.Background(), Record{ID: "e", ProjectID: "p", CPUs: 0.5}); !errors.Is(err, errdefs.ErrQuota) {
		t.Fatalf("4th sandbox: %v", err)
	}
	// Once the warm copy goes, the paused sandbox resumes (as one of the 3).
	delete(s.sandboxes, "d")
	if err := s.beginResume(context.Background(), paused); err != nil || paused.rec.Status != StatusResuming {
		t.Fatalf("resume: %v, status %s", err, paused.rec.Status)
	}
}
