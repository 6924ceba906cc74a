package volume

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
)

// Volumes across the nodes of a cluster (Config.Images and Config.Shared
// set): a volume lives on the node of the sandbox that holds it (its
// record's node). At detach its image is synced to the object store; an
// attach on a node that does not hold it fetches the last sync, checking
// every digest, and moves the record to that node. A node lost while a
// volume was attached leaves it at its last sync, flagged Stale.

// findAnyLocked finds the project's volume ref among this node's records,
// then, in a cluster with an object store, among every node's; local says
// this node holds it.
func (m *Manager) findAnyLocked(ctx context.Context, projectID, ref string) (v Volume, local bool, err error) {
	v, err = m.findLocked(ctx, projectID, ref)
	if err == nil || !errors.Is(err, errdefs.ErrNotFound) || m.cfg.Shared == nil || m.cfg.Images == nil {
		return v, err == nil, err
	}
	recs, serr := m.cfg.Shared.Volumes(ctx)
	if serr != nil {
		return Volume{}, false, serr
	}
	for _, r := range recs {
		if r.ProjectID != projectID || (r.ID != ref && r.Name != ref) {
			continue
		}
		if err := json.Unmarshal(r.Spec, &v); err != nil {
			return Volume{}, false, fmt.Errorf("volume %s: %w", r.ID, err)
		}
		v.Node = r.Node
		return v, false, nil
	}
	return Volume{}, false, err
}

// fetchLocked brings another node's volume v here from its last sync (a
// volume never attached is made anew: it holds nothing). A volume never
// synced is unavailable here; a corrupt object is refused (corrupt_object)
// and leaves nothing.
func (m *Manager) fetchLocked(ctx context.Context, v *Volume) error {
	m.unmount(ctx, v.ID)
	if err := os.Remove(m.image(v.ID)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if v.SyncedVersion == 0 {
		if v.Version > 0 {
			return errdefs.WithCode("volume_not_synced", fmt.Errorf("volume %q is on another node and was never synced to the object store: %w", v.Name, errdefs.ErrUnavailable))
		}
		if err := m.initLocked(ctx, v.ID, v.SizeGB); err != nil {
			m.unmount(ctx, v.ID)
			os.Remove(m.image(v.ID))
			return err
		}
		return nil
	}
	tmp := filepath.Join(m.cfg.Dir, ".fetch-"+v.ID)
	os.RemoveAll(tmp)
	defer os.RemoveAll(tmp)
	start := time.Now()
	if _, err := m.cfg.Images.Materialize(ctx, ImageName(v.ID), tmp); err != nil {
		return fmt.Errorf("fetch volume %q: %w", v.Name, err)
	}
	if err := os.Rename(filepath.Join(tmp, imageFile), m.image(v.ID)); err != nil {
		return fmt.Errorf("fetch volume %q: %w", v.Name, err)
	}
	// What the lost node wrote after the last sync is gone.
	v.Version = v.SyncedVersion
	m.cfg.Logger.Info("volume fetched from the object store", "volume", v.ID, "syncedAt", v.SyncedAt, "stale", v.Stale, "took", time.Since(start))
	return nil
}

// Retries of a failed sync, doubling from syncRetryMin to syncRetryMax.
const (
	syncRetryMin = time.Second
	syncRetryMax = time.Minute
)

// syncWait bounds how long an attach on another node waits for the
// holding node's pending sync.
const syncWait = 10 * time.Minute

// syncJob is the background sync of one detached volume.
type syncJob struct {
	cancel context.CancelFunc
	// reading is closed once the job no longer reads the image: the
	// volume may be mounted (and changed) again; done once it is over and
	// recorded.
	reading, done chan struct{}
}

// startSyncLocked syncs detached volume v (unmounted) to the object store
// in the background when it changed since its last sync: its detach
// returns at once. A failed sync is retried with backoff until it succeeds
// or the volume is attached here again or deleted (quiesceLocked), which
// cancels it: the data is still on this node, and the next detach syncs.
func (m *Manager) startSyncLocked(v Volume) {
	if m.cfg.Images == nil || v.Version == 0 || v.SyncedVersion >= v.Version {
		return
	}
	m.quiesceLocked(v.ID)
	ctx, cancel := context.WithCancel(m.bg)
	j := &syncJob{cancel: cancel, reading: make(chan struct{}), done: make(chan struct{})}
	m.syncs[v.ID] = j
	m.wg.Add(1)
	go m.syncLoop(ctx, j, v.ID, v.Version)
}

// quiesceLocked cancels volume id's background sync, if any, and waits
// until it no longer reads the image.
func (m *Manager) quiesceLocked(id string) {
	j := m.syncs[id]
	if j == nil {
		return
	}
	j.cancel()
	<-j.reading
	delete(m.syncs, id)
}

// Syncing reports whether volume id has a sync in progress or waiting to
// retry on this node.
func (m *Manager) Syncing(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.syncs[id] != nil
}

func (m *Manager) syncLoop(ctx context.Context, j *syncJob, id string, version int) {
	defer m.wg.Done()
	defer close(j.done)
	defer j.cancel()
	var err error
	for delay := syncRetryMin; ; delay = min(2*delay, syncRetryMax) {
		if err = m.upload(ctx, id, version); err == nil || ctx.Err() != nil {
			break
		}
		m.cfg.Logger.Warn("volume not synced to the object store; retrying", "volume", id, "version", version, "in", delay, "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(delay):
		}
		if ctx.Err() != nil {
			break
		}
	}
	close(j.reading)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.syncs[id] == j {
		delete(m.syncs, id)
	}
	if err != nil {
		// Canceled: attached again or deleted here, or the server stops
		// (Reconcile syncs at its next start).
		return
	}
	// The upload read version's data, unmounted throughout (an attach
	// here waits for reading): the store holds that version, whatever
	// happened to the record since.
	rctx := context.WithoutCancel(ctx)
	all, err := m.all(rctx)
	if err != nil {
		m.cfg.Logger.Warn("volume synced but not recorded; the next detach syncs again", "volume", id, "err", err)
		return
	}
	for _, v := range all {
		if v.ID != id || v.SyncedVersion >= version {
			continue
		}
		now := time.Now().UTC()
		v.SyncedVersion, v.SyncedAt, v.Stale = version, &now, false
		if err := m.saveLocked(rctx, v); err != nil {
			m.cfg.Logger.Warn("volume synced but not recorded; the next detach syncs again", "volume", id, "err", err)
		}
	}
}

// upload makes the image of volume id, unmounted, durable: only its data
// extents are read, and only chunks the store lacks are uploaded.
func (m *Manager) upload(ctx context.Context, id string, version int) error {
	// The image alone, by a hard link, in a directory of its own.
	stage := filepath.Join(m.cfg.Dir, ".sync-"+id)
	os.RemoveAll(stage)
	defer os.RemoveAll(stage)
	start := time.Now()
	if err := os.Mkdir(stage, 0o700); err != nil {
		return err
	}
	if err := os.Link(m.image(id), filepath.Join(stage, imageFile)); err != nil {
		return err
	}
	man, err := m.cfg.Images.Upload(ctx, ImageName(id), stage)
	if err != nil {
		return err
	}
	stored, size := man.Stored()
	m.cfg.Logger.Info("volume synced", "volume", id, "version", version, "size", size, "stored", stored, "took", time.Since(start))
	return nil
}

// pendingElsewhere reports whether v, held by another node that is not
// gone, was detached there and its sync is not done: its freshest data is
// on that node only.
func (m *Manager) pendingElsewhere(ctx context.Context, v Volume) bool {
	return v.AttachedTo == "" && v.SyncedVersion < v.Version && (m.cfg.Gone == nil || !m.cfg.Gone(ctx, v.Node))
}

// waitSynced waits (m.mu not held) until the record of v, pending on
// another node, changes: synced, attached again, or its node gone.
func (m *Manager) waitSynced(ctx context.Context, v Volume) error {
	m.cfg.Logger.Info("volume attach waits for its sync on the node holding it", "volume", v.ID, "node", v.Node, "version", v.Version, "syncedVersion", v.SyncedVersion)
	ctx, cancel := context.WithTimeout(ctx, syncWait)
	defer cancel()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return errdefs.WithCode("volume_syncing", fmt.Errorf("volume %q: node %s has not synced its last changes to the object store yet: %w", v.Name, v.Node, errors.Join(ctx.Err(), errdefs.ErrUnavailable)))
		case <-tick.C:
		}
		recs, err := m.cfg.Shared.Volumes(ctx)
		if err != nil {
			continue
		}
		for _, r := range recs {
			if r.ID != v.ID {
				continue
			}
			var now Volume
			if err := json.Unmarshal(r.Spec, &now); err != nil {
				return fmt.Errorf("volume %s: %w", r.ID, err)
			}
			now.Node = r.Node
			if now.Node != v.Node || !m.pendingElsewhere(ctx, now) {
				return nil
			}
		}
	}
}

// deleteImage removes volume id's image from the object store, if any.
func (m *Manager) deleteImage(ctx context.Context, id string) {
	if m.cfg.Images == nil {
		return
	}
	if err := m.cfg.Images.Delete(context.WithoutCancel(ctx), ImageName(id)); err != nil {
		m.cfg.Logger.Warn("volume deleted; its image in the object store stays", "volume", id, "err", err)
	}
}

// pruneLocked removes the local images of volumes this node no longer
// holds (another node attached them since), in a cluster with an object
// store.
func (m *Manager) pruneLocked(ctx context.Context) {
	if m.cfg.Shared == nil || m.cfg.Images == nil {
		return
	}
	all, err := m.all(ctx)
	if err != nil {
		return
	}
	mine := map[string]bool{}
	for _, v := range all {
		mine[v.ID] = true
	}
	ents, err := os.ReadDir(m.cfg.Dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".img")
		if !ok || mine[id] {
			continue
		}
		// Still mounted: this node was taken for lost and the sandbox
		// that held it may still run; a later prune (at its detach)
		// unmounts it.
		if err := m.unmount(ctx, id); err != nil {
			continue
		}
		os.Remove(m.image(id))
		os.Remove(m.mountDir(id))
		m.cfg.Logger.Info("volume moved to another node; local copy removed", "volume", id)
	}
}

// NodeLost flags the volumes attached on node, declared dead: each is
// detached at its last sync and marked Stale, so that any node may attach
// it. Without an object store nothing changes (the data is on node's
// disk only).
func (m *Manager) NodeLost(ctx context.Context, node string) error {
	if m.cfg.Shared == nil || m.cfg.Images == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	recs, err := m.cfg.Shared.Volumes(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range recs {
		if r.Node != node {
			continue
		}
		var v Volume
		if err := json.Unmarshal(r.Spec, &v); err != nil {
			errs = append(errs, fmt.Errorf("volume %s: %w", r.ID, err))
			continue
		}
		if v.AttachedTo == "" {
			continue
		}
		m.cfg.Logger.Warn("volume lost with its node; it stays at its last sync", "volume", v.ID, "node", node, "sandbox", v.AttachedTo, "syncedAt", v.SyncedAt)
		v.AttachedTo, v.Stale = "", true
		spec, err := json.Marshal(v)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, m.cfg.Shared.UpdateVolume(ctx, store.Volume{ID: v.ID, Node: node, Spec: spec}))
	}
	return errors.Join(errs...)
}

// Release hands the volumes attached to sandboxID over for a move of the
// sandbox (paused, its runtime gone) to another node: each is unmounted
// and synced, and waits there, still attached to sandboxID, for the
// other node's Attach with the same sandbox, which fetches it. ctx bounds
// the wait for the sync; on failure the volume stays here (Mount takes it
// back).
func (m *Manager) Release(ctx context.Context, sandboxID string) error {
	if m.cfg.Images == nil {
		return errdefs.WithCode("feature_unavailable", fmt.Errorf("volumes cannot move between nodes without an object store: %w", errdefs.ErrConflict))
	}
	m.mu.Lock()
	all, err := m.all(ctx)
	if err != nil {
		m.mu.Unlock()
		return err
	}
	var jobs []*syncJob
	var ids []string
	for _, v := range all {
		if v.AttachedTo != sandboxID {
			continue
		}
		if err := m.unmount(ctx, v.ID); err != nil {
			m.mu.Unlock()
			return fmt.Errorf("release volume %q: %w", v.Name, err)
		}
		m.startSyncLocked(v)
		if j := m.syncs[v.ID]; j != nil {
			jobs = append(jobs, j)
		}
		ids = append(ids, v.ID)
	}
	m.mu.Unlock()
	for _, j := range jobs {
		select {
		case <-j.done:
		case <-ctx.Done():
			return fmt.Errorf("volume of sandbox %s not synced to the object store: %w", sandboxID, errors.Join(ctx.Err(), errdefs.ErrUnavailable))
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	all, err = m.all(ctx)
	if err != nil {
		return err
	}
	for _, v := range all {
		if slices.Contains(ids, v.ID) && (v.AttachedTo != sandboxID || v.SyncedVersion < v.Version) {
			return fmt.Errorf("volume %q changed while it was released (attached to %q, version %d, synced %d): %w", v.Name, v.AttachedTo, v.Version, v.SyncedVersion, errdefs.ErrConflict)
		}
	}
	m.cfg.Logger.Info("volumes released for a move", "sandbox", sandboxID, "volumes", ids)
	return nil
}

// detachReleasedLocked detaches the volumes of other nodes attached to
// sandboxID (local is this node's): released for a move (synced, see
// Release), their sandbox was killed before any node resumed it.
func (m *Manager) detachReleasedLocked(ctx context.Context, sandboxID string, local []Volume) error {
	if m.cfg.Shared == nil || m.cfg.Images == nil {
		return nil
	}
	recs, err := m.cfg.Shared.Volumes(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range recs {
		if slices.ContainsFunc(local, func(v Volume) bool { return v.ID == r.ID }) {
			continue
		}
		var v Volume
		if err := json.Unmarshal(r.Spec, &v); err != nil || v.AttachedTo != sandboxID {
			continue
		}
		v.AttachedTo = ""
		spec, err := json.Marshal(v)
		if err == nil {
			err = m.cfg.Shared.UpdateVolume(ctx, store.Volume{ID: v.ID, Node: r.Node, Spec: spec})
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("detach volume %s of node %s: %w", v.ID, r.Node, err))
			continue
		}
		m.cfg.Logger.Info("released volume detached: its sandbox is gone", "volume", v.ID, "node", r.Node, "sandbox", sandboxID)
	}
	return errors.Join(errs...)
}
