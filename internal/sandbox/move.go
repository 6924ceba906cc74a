package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/runtime"
	"github.com/lizard-build/lizard/internal/store"
)

// Orphans is what the store of a cluster node offers so that the node can
// resume paused sandboxes it does not hold: their node was declared dead,
// was removed or let them go (docs/CLUSTER.md). Orphan returns the row of
// the project's sandbox id when it is paused, its image durable, and it is
// orphaned or on this node without this service holding it (a take-over
// that failed); anything else is ErrNotFound.
type Orphans interface {
	Orphan(ctx context.Context, projectID, id string) (store.Sandbox, error)
}

// orphan is the record of the project's orphaned sandbox id, if the store
// knows orphans and id is one.
func (s *Service) orphan(ctx context.Context, projectID, id string) (Record, bool) {
	o, ok := s.cfg.Store.(Orphans)
	if !ok {
		return Record{}, false
	}
	row, err := o.Orphan(ctx, projectID, id)
	if err != nil {
		if !errors.Is(err, errdefs.ErrNotFound) {
			s.log.Warn("look an orphaned sandbox up", "sandbox", id, "err", err)
		}
		return Record{}, false
	}
	var rec Record
	if err := json.Unmarshal(row.Spec, &rec); err != nil || rec.ID != id || rec.Status != StatusPaused || rec.DurableAt == nil {
		return Record{}, false
	}
	return rec, true
}

// adopt resumes an orphaned paused sandbox on this node: its image is
// downloaded from the object store and restored with the same id and agent
// token (a new address), and the row is taken over (fenced, admitted on
// this node) as it is written. A failure leaves it paused and durable,
// resumable again, here or anywhere once this node goes.
func (s *Service) adopt(ctx context.Context, rec Record) (Record, error) {
	id := rec.ID
	if err := s.checkpointer("resume"); err != nil {
		return Record{}, err
	}
	if s.cfg.Images == nil {
		return Record{}, errdefs.WithCode("feature_unavailable", fmt.Errorf("resume sandbox %q: it was paused on another node and this one has no object store: %w", id, errdefs.ErrConflict))
	}
	if rec.VolumeID != "" && s.cfg.Volumes == nil {
		return Record{}, errdefs.WithCode("feature_unavailable", fmt.Errorf("resume sandbox %q: it holds volume %s and this node has no volumes: %w", id, rec.VolumeID, errdefs.ErrConflict))
	}
	size, err := LookupSize(rec.Size)
	if err != nil {
		return Record{}, err
	}
	rootfs, release, err := s.hereRootfs(rec.ProjectID, rec.Template, rec.Rootfs, true)
	if err != nil {
		return Record{}, fmt.Errorf("resume sandbox %q on this node: its template: %w", id, err)
	}
	defer release()
	s.mu.Lock()
	if _, busy := s.moving[id]; busy {
		s.mu.Unlock()
		return Record{}, fmt.Errorf("sandbox %q is being resumed on this node; retry shortly: %w", id, errdefs.ErrUnavailable)
	}
	s.moving[id] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.moving, id)
		s.mu.Unlock()
	}()

	paused := rec
	if err := os.MkdirAll(s.cfg.SnapshotDir, 0o700); err != nil {
		return Record{}, err
	}
	dir := filepath.Join(s.cfg.SnapshotDir, "resume-"+id)
	os.RemoveAll(dir) // a download an earlier attempt left
	defer os.RemoveAll(dir)
	start := time.Now()
	if err := s.images.Materialize(ctx, PauseImageName(id), dir); err != nil {
		return Record{}, fmt.Errorf("resume sandbox %q: %w", id, err)
	}
	// Its volume, released by the node it left (synced, still attached to
	// it), is fetched here before the restore: the restored processes
	// find /workspace as they left it.
	vol, err := s.attachVolume(ctx, &rec, rec.VolumeID)
	if err != nil {
		return Record{}, fmt.Errorf("resume sandbox %q: its volume: %w", id, err)
	}
	defer func() {
		if err != nil && vol != nil {
			// Back to the object store, attached to the sandbox still,
			// for the next attempt, here or elsewhere.
			if rerr := s.cfg.Volumes.Release(context.WithoutCancel(ctx), id); rerr != nil {
				s.log.Error("release the volume of a sandbox whose resume failed", "sandbox", id, "err", rerr)
			}
		}
	}()
	files := rec.FilesOnly
	rec.Status, rec.PauseError, rec.DurableAt, rec.Rootfs, rec.Region = StatusRunning, "", nil, rootfs, s.cfg.Region
	rec.FilesOnly = false
	rec.EndAt = nil
	if rec.RemainingMs > 0 {
		rec.EndAt = deadline(time.Now().UTC(), rec.RemainingMs)
	}
	rec.RemainingMs = 0
	rec, err = s.start(ctx, rec, func(ctx context.Context, rec *Record) (runtime.Sandbox, error) {
		return s.cp.Restore(ctx, runtime.Spec{ID: id, Rootfs: rootfs, AgentToken: rec.AgentToken, Resources: size.resources(),
			Egress: rec.Egress, Mounts: s.mounts(rec.Template, vol)}, dir)
	}, rec.AgentToken, func(ctx context.Context, id string) {
		// What was made goes; the sandbox stays what it was: paused, its
		// image durable.
		if err := s.cfg.Runtime.Destroy(ctx, id); err != nil {
			s.log.Error("undo a resume from another node", "sandbox", id, "err", err)
		}
		if err := s.persist(ctx, paused); err != nil && !errors.Is(err, errdefs.ErrConflict) {
			s.log.Error("record a sandbox paused again after its resume failed", "sandbox", id, "err", err)
		}
	})
	if err != nil {
		s.log.Error("resume from another node failed; the sandbox stays paused", "sandbox", id, "err", err)
		return Record{}, fmt.Errorf("resume sandbox %q: %w", id, err)
	}
	// Its image is in use no more: its objects stay only as the base of
	// its next pause's upload.
	s.images.Retire(PauseImageName(id))
	s.log.Info("sandbox resumed from another node", "sandbox", id, "took", time.Since(start))
	s.logs.event(id, "resumed on this node from the object store")
	how := "on another node than it was paused on"
	if files {
		how += ", booted over its files"
		s.restartCommand(ctx, rec)
	}
	s.emit(EventResumed, rec, causeOf(ctx), how)
	return rec, nil
}

// killOrphan kills an orphaned paused sandbox: this node takes its row over
// (fenced: of two kills, or a kill and a resume, one wins), removes it and
// its image in the object store.
func (s *Service) killOrphan(ctx context.Context, rec Record) error {
	if err := s.persist(ctx, rec); err != nil {
		return fmt.Errorf("kill sandbox %q: %w", rec.ID, err)
	}
	s.images.Drop(PauseImageName(rec.ID))
	if rec.VolumeID != "" && s.cfg.Volumes != nil {
		// Released with it by the node it left: free again.
		if err := s.cfg.Volumes.Detach(ctx, rec.ID); err != nil {
			return fmt.Errorf("kill sandbox %q: detach its volume: %w", rec.ID, err)
		}
	}
	s.log.Info("orphaned sandbox killed", "sandbox", rec.ID)
	s.emit(EventKilled, rec, causeOf(ctx), "")
	return s.cfg.Store.DeleteSandbox(ctx, rec.ID)
}

// Releaser is what the store of a cluster node offers so that the node can
// let a paused sandbox whose image is durable go (a move): its row is
// orphaned, fenced, and another node takes it over.
type Releaser interface {
	ReleaseSandbox(ctx context.Context, id string) error
}

// Release lets this node's paused sandbox id, whose image is durable, go
// to another node (a move): its volume is released (synced, fetched by the
// node that resumes it), its row orphaned (fenced) and this node forgets
// it, keeping its image in the object store. A sandbox that is not paused
// and durable is ErrConflict; it stays as it is.
func (s *Service) Release(ctx context.Context, id string) error {
	r, ok := s.cfg.Store.(Releaser)
	if !ok || s.cfg.Images == nil {
		return fmt.Errorf("sandbox %q cannot move: this node is not in a cluster with an object store: %w", id, errdefs.ErrConflict)
	}
	s.mu.Lock()
	e := s.sandboxes[id]
	s.mu.Unlock()
	if e == nil {
		return NotFound(id)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	s.mu.Lock()
	ok = !e.gone && e.rec.Status == StatusPaused && e.rec.DurableAt != nil
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("sandbox %q is not paused with a durable image; it cannot move: %w", id, errdefs.ErrConflict)
	}
	// The record says durable only once its row does (makePauseDurable);
	// the upload's job may still be ending: nothing of it runs once
	// StopUpload returns.
	s.images.StopUpload(PauseImageName(id))
	s.mu.Lock()
	vol := e.rec.VolumeID
	s.mu.Unlock()
	if vol != "" {
		// Its volume goes first: synced, then fetched by the node that
		// resumes it. On failure it stays here, paused (a resume mounts
		// the volume again).
		if err := s.cfg.Volumes.Release(ctx, id); err != nil {
			return fmt.Errorf("sandbox %q: its volume: %w", id, err)
		}
	}
	if err := r.ReleaseSandbox(ctx, id); err != nil {
		return fmt.Errorf("release sandbox %q: %w", id, err)
	}
	if s.take(e) {
		s.emit(EventMoved, s.recordOf(e), CauseMove, "released to another node")
		if err := s.cfg.Runtime.Destroy(context.WithoutCancel(ctx), id); err != nil {
			// Recovery removes it as a stray at the next start.
			s.log.Error("remove a moved sandbox's local copy", "sandbox", id, "err", err)
		}
		s.logs.remove(id)
	}
	s.log.Info("sandbox released to another node", "sandbox", id)
	return nil
}
