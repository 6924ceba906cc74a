package volume

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/lizard-build/lizard/internal/durable"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
)

// Volumes across the nodes of a cluster (Config.Images and Config.Shared
// set): a volume lives on the node of the sandbox that holds it (its
// record's node). At detach its image is synced to the object store; an
// attach on a node that does not hold it fetches the last sync, checking
// every digest, and moves the record to that node. A node lost while a
// volume was attached leaves it at its last sync, flagged Stale.

// syncTimeout bounds one sync at detach.
const syncTimeout = 30 * time.Minute

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

// syncLocked uploads detached volume v's image (unmounted) when it changed
// since its last sync and records the sync in v. A failed sync is logged:
// v keeps its last sync, and the next detach tries again.
func (m *Manager) syncLocked(ctx context.Context, v *Volume) {
	if m.cfg.Images == nil || v.Version == 0 || v.SyncedVersion == v.Version {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), syncTimeout)
	defer cancel()
	// The image alone, by a hard link, in a directory of its own.
	stage := filepath.Join(m.cfg.Dir, ".sync-"+v.ID)
	os.RemoveAll(stage)
	defer os.RemoveAll(stage)
	start := time.Now()
	err := os.Mkdir(stage, 0o700)
	if err == nil {
		err = os.Link(m.image(v.ID), filepath.Join(stage, imageFile))
	}
	if err == nil {
		var man durable.Manifest
		man, err = m.cfg.Images.Upload(ctx, ImageName(v.ID), stage)
		if err == nil {
			stored, _ := man.Stored()
			m.cfg.Logger.Info("volume synced", "volume", v.ID, "version", v.Version, "stored", stored, "took", time.Since(start))
		}
	}
	if err != nil {
		m.cfg.Logger.Warn("volume not synced to the object store; it stays at its last sync", "volume", v.ID, "syncedVersion", v.SyncedVersion, "err", err)
		return
	}
	now := time.Now().UTC()
	v.SyncedVersion, v.SyncedAt, v.Stale = v.Version, &now, false
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
