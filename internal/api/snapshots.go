package api

import (
	"net/http"
	"time"

	"github.com/lizard-build/lizard/internal/sandbox/snapshot"
	"github.com/lizard-build/lizard/internal/store"
)

// snapshotInfo is a snapshot as the SDKs read it.
type snapshotInfo struct {
	ID              string  `json:"id"`
	Name            string  `json:"name"`
	ProjectID       string  `json:"projectId"`
	Region          *string `json:"region"`
	Status          string  `json:"status"`
	PoolSize        int     `json:"poolSize"`
	PoolPaused      bool    `json:"poolPaused"`
	ReadyCount      int     `json:"readyCount"`
	CPUs            float64 `json:"cpus"`
	MemoryMB        int64   `json:"memoryMb"`
	Size            string  `json:"size"`
	Template        string  `json:"template"`
	SourceSandboxID string  `json:"sourceSandboxId"`
	Scope           string  `json:"scope"`
	CreatedAt       string  `json:"createdAt"`
	Error           *string `json:"error"`
	// DurableAt is when the image became durable in the object store (a
	// lizard addition).
	DurableAt *string `json:"durableAt,omitempty"`
}

func snapshotOf(sn snapshot.Info) snapshotInfo {
	info := snapshotInfo{
		ID: sn.ID, Name: sn.Name, ProjectID: sn.ProjectID, Status: "ready",
		PoolSize: sn.PoolSize, PoolPaused: sn.PoolPaused, ReadyCount: sn.ReadyCount,
		CPUs: sn.CPUs, MemoryMB: sn.MemoryMB, Size: sn.Size, Template: sn.Template,
		SourceSandboxID: sn.SourceID, Scope: "project", CreatedAt: sn.CreatedAt.UTC().Format(time.RFC3339Nano),
	}
	if sn.Region != "" {
		info.Region = &sn.Region
	}
	if sn.DurableAt != nil {
		d := sn.DurableAt.UTC().Format(time.RFC3339Nano)
		info.DurableAt = &d
	}
	return info
}

// snapshotRoutes serve the snapshot routes.
type snapshotRoutes struct {
	snapshots Snapshots
	cluster   Cluster
}

func (s snapshotRoutes) takeSnapshot(w http.ResponseWriter, r *http.Request, p store.Project) error {
	var req struct {
		Name     string `json:"name"`
		PoolSize *int   `json:"poolSize"`
	}
	if err := decode(w, r, maxBody, &req); err != nil {
		return err
	}
	pool := 0
	if req.PoolSize != nil {
		pool = *req.PoolSize
	}
	sn, err := s.snapshots.Take(r.Context(), p.ID, r.PathValue("id"), req.Name, pool)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, snapshotOf(sn))
	return nil
}

func (s snapshotRoutes) listSnapshots(w http.ResponseWriter, r *http.Request, p store.Project) error {
	var all []snapshot.Info
	if s.cluster != nil {
		var err error
		if all, err = s.cluster.Snapshots(r.Context(), p.ID); err != nil {
			return err
		}
	} else {
		all = s.snapshots.List(p.ID)
	}
	out := []snapshotInfo{}
	for _, sn := range all {
		out = append(out, snapshotOf(sn))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s snapshotRoutes) listProjectSnapshots(w http.ResponseWriter, r *http.Request, p store.Project) error {
	if err := sameProject(p, r.PathValue("pid")); err != nil {
		return err
	}
	return s.listSnapshots(w, r, p)
}

func (s snapshotRoutes) getSnapshot(w http.ResponseWriter, r *http.Request, p store.Project) error {
	sn, err := s.snapshots.Get(p.ID, r.PathValue("sid"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, snapshotOf(sn))
	return nil
}

// updateSnapshot changes poolSize; scope is accepted and changes nothing
// (every snapshot restores only in its own project).
func (s snapshotRoutes) updateSnapshot(w http.ResponseWriter, r *http.Request, p store.Project) error {
	var req struct {
		PoolSize *int    `json:"poolSize"`
		Scope    *string `json:"scope"`
	}
	if err := decode(w, r, maxBody, &req); err != nil {
		return err
	}
	sn, err := s.snapshots.Update(r.Context(), p.ID, r.PathValue("sid"), req.PoolSize, nil)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, snapshotOf(sn))
	return nil
}

func (s snapshotRoutes) setPool(w http.ResponseWriter, r *http.Request, p store.Project, paused bool) error {
	sn, err := s.snapshots.Update(r.Context(), p.ID, r.PathValue("sid"), nil, &paused)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, snapshotOf(sn))
	return nil
}

// pauseSnapshotPool releases the warm copies; the saved state stays.
func (s snapshotRoutes) pauseSnapshotPool(w http.ResponseWriter, r *http.Request, p store.Project) error {
	return s.setPool(w, r, p, true)
}

// resumeSnapshotPool refills the warm pool.
func (s snapshotRoutes) resumeSnapshotPool(w http.ResponseWriter, r *http.Request, p store.Project) error {
	return s.setPool(w, r, p, false)
}

func (s snapshotRoutes) deleteSnapshot(w http.ResponseWriter, r *http.Request, p store.Project) error {
	if err := s.snapshots.Delete(r.Context(), p.ID, r.PathValue("sid")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
