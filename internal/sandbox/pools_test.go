package sandbox

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/durable"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/runtime"
	"github.com/lizard-build/lizard/internal/store"
)

// poolStore is a cluster node's store as far as pools go: its name.
type poolStore struct {
	store.Store
	node string
}

func (p poolStore) Node() string                                           { return p.node }
func (p poolStore) AdoptPool(context.Context, string, string) error        { return nil }
func (p poolStore) AdoptedPools(context.Context) ([]store.Snapshot, error) { return nil, nil }

// TestLoadSnapshotPools: recovery keeps a node's own snapshots, with their
// pool here or on the node that adopted it, and another node's only when
// this node keeps its pool and its image is durable (a foreign entry,
// which does not count against the project's snapshots here).
func TestLoadSnapshotPools(t *testing.T) {
	s := New(Config{Store: poolStore{node: "b"}, Limits: func(context.Context, string) (store.Limits, error) { return store.Limits{Snapshots: 1}, nil }})
	durable := time.Now()
	for _, tc := range []struct {
		name        string
		row         store.Snapshot
		durable     bool
		ok, foreign bool
		poolHere    bool
	}{
		{"own, pool here", store.Snapshot{Node: "b"}, false, true, false, true},
		{"own, pool adopted elsewhere", store.Snapshot{Node: "b", PoolNode: "c"}, true, true, false, false},
		{"another's, pool here", store.Snapshot{Node: "a", PoolNode: "b"}, true, true, true, true},
		{"another's, pool here, not durable", store.Snapshot{Node: "a", PoolNode: "b"}, false, false, false, false},
		{"another's, pool elsewhere", store.Snapshot{Node: "a", PoolNode: "c"}, true, false, false, false},
	} {
		snap := Snapshot{ID: "snap_x", ProjectID: "p"}
		if tc.durable {
			snap.DurableAt = &durable
		}
		tc.row.ID, tc.row.ProjectID = "snap_x", "p"
		se, ok := s.loadSnapshot(tc.row, snap)
		if ok != tc.ok {
			t.Fatalf("%s: kept %v, want %v", tc.name, ok, tc.ok)
		}
		if !ok {
			continue
		}
		s.mu.Lock()
		here := s.poolHereLocked(se)
		s.mu.Unlock()
		if se.foreign != tc.foreign || here != tc.poolHere {
			t.Fatalf("%s: foreign %v, pool here %v; want %v, %v", tc.name, se.foreign, here, tc.foreign, tc.poolHere)
		}
		// The metrics count a pool where it is kept.
		se.snap.PoolSize = 2
		s.snapshots["snap_x"] = se
		if got := len(s.WarmPools()); got != map[bool]int{true: 1, false: 0}[tc.poolHere] {
			t.Fatalf("%s: %d warm pools in the metrics", tc.name, got)
		}
		delete(s.snapshots, "snap_x")
		if se.foreign {
			// Another node's record: this node's project limit of one
			// snapshot still has room.
			s.snapshots["snap_x"] = se
			release, err := s.reserveSnapshot(context.Background(), "p")
			if err != nil {
				t.Fatalf("%s: a foreign entry counted as a snapshot here: %v", tc.name, err)
			}
			release()
			delete(s.snapshots, "snap_x")
		}
	}
}

// buildImages holds one image written by runsc build digest ("": its
// manifest does not say).
type buildImages struct {
	Images
	digest string
}

func (b buildImages) Stat(context.Context, string) (durable.Manifest, error) {
	m := durable.Manifest{Name: "snapshots/snap_x"}
	if b.digest != "" {
		m.Checkpoint = []byte(`{"runscVersion":"runsc x","runscDigest":"` + b.digest + `"}`)
	}
	return m, nil
}

// buildRuntime is a runtime of runsc build digest.
type buildRuntime struct {
	runtime.Runtime
	digest string
}

func (b buildRuntime) RunscDigest(context.Context) (string, error) { return b.digest, nil }

// TestAdoptSameBuild: a node adopts only pools whose image its runsc build
// restores; it says so before downloading anything.
func TestAdoptSameBuild(t *testing.T) {
	for _, tc := range []struct {
		image, node string
		ok          bool
	}{
		{"sha256:aaa", "sha256:aaa", true},
		{"", "sha256:aaa", true}, // an image that does not say: the restore checks
		{"sha256:aaa", "sha256:bbb", false},
	} {
		s := New(Config{Runtime: buildRuntime{digest: tc.node}, Images: buildImages{digest: tc.image}})
		err := s.sameBuild(context.Background(), "snapshots/snap_x")
		if tc.ok != (err == nil) || err != nil && (!errors.Is(err, errdefs.ErrConflict) || errdefs.Code(err) != "incompatible_checkpoint") {
			t.Fatalf("image of %q on a node of %q: %v, want ok %v", tc.image, tc.node, err, tc.ok)
		}
	}
}
