package api

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"time"

	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/volume"
)

// Volumes is what the API needs of the volume manager.
type Volumes interface {
	Create(ctx context.Context, projectID, name string, sizeGB int, region string, getOrCreate bool) (volume.Volume, error)
	Get(ctx context.Context, projectID, ref string) (volume.Volume, error)
	List(ctx context.Context, projectID string) ([]volume.Volume, error)
	Resize(ctx context.Context, projectID, ref string, sizeGB int) (volume.Volume, error)
	Delete(ctx context.Context, projectID, ref string) error
}

// volumeInfo is a volume as the SDKs read it.
type volumeInfo struct {
	ID         string  `json:"id"`
	Name       string  `json:"name"`
	SizeGB     int     `json:"sizeGb"`
	Region     *string `json:"region"`
	Status     string  `json:"status"`
	AttachedTo *string `json:"attachedTo"`
	CreatedAt  string  `json:"createdAt"`
	// In a cluster: the node holding it; with an object store, its syncs
	// (see volume.Volume) and whether its node was lost while attached.
	Node          string     `json:"node,omitempty"`
	Version       int        `json:"version,omitempty"`
	SyncedVersion int        `json:"syncedVersion,omitempty"`
	SyncedAt      *time.Time `json:"syncedAt,omitempty"`
	Stale         bool       `json:"stale,omitempty"`
}

func volumeOf(v volume.Volume) volumeInfo {
	info := volumeInfo{ID: v.ID, Name: v.Name, SizeGB: v.SizeGB, Status: "available", CreatedAt: v.CreatedAt.UTC().Format(time.RFC3339Nano),
		Node: v.Node, Version: v.Version, SyncedVersion: v.SyncedVersion, SyncedAt: v.SyncedAt, Stale: v.Stale}
	if v.Region != "" {
		info.Region = &v.Region
	}
	if v.AttachedTo != "" {
		info.AttachedTo = &v.AttachedTo
		info.Status = "attached"
	}
	return info
}

// volumeRoutes serve /api/projects/{pid}/volumes.
type volumeRoutes struct {
	volumes Volumes
	cluster Cluster
}

func (s volumeRoutes) createVolume(w http.ResponseWriter, r *http.Request, p store.Project) error {
	if err := sameProject(p, r.PathValue("pid")); err != nil {
		return err
	}
	var req struct {
		Name        string `json:"name"`
		SizeGB      int    `json:"sizeGb"`
		Region      string `json:"region"`
		GetOrCreate bool   `json:"getOrCreate"`
	}
	body, err := readBody(w, r, maxBody)
	if err != nil {
		return err
	}
	if err := unmarshal(body, &req); err != nil {
		return err
	}
	if s.cluster != nil && req.Name != "" {
		// A name the project has on another node is that node's to
		// answer (getOrCreate, or the conflict).
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		if forwarded, err := s.cluster.Forward(w, r, p.ID, Ref{Kind: RefVolume, ID: req.Name}); forwarded || err != nil {
			return err
		}
	}
	create := func() error {
		v, err := s.volumes.Create(r.Context(), p.ID, req.Name, req.SizeGB, req.Region, req.GetOrCreate)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusCreated, volumeOf(v))
		return nil
	}
	if s.cluster != nil {
		// A new volume lives where its sandboxes will: on a node placement
		// chooses (never a draining one), like a sandbox create.
		return s.cluster.Create(w, r, p.ID, Placement{}, body, create)
	}
	return create()
}

func (s volumeRoutes) listVolumes(w http.ResponseWriter, r *http.Request, p store.Project) error {
	if err := sameProject(p, r.PathValue("pid")); err != nil {
		return err
	}
	list := s.volumes.List
	if s.cluster != nil {
		list = s.cluster.Volumes
	}
	vs, err := list(r.Context(), p.ID)
	if err != nil {
		return err
	}
	out := []volumeInfo{}
	for _, v := range vs {
		out = append(out, volumeOf(v))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s volumeRoutes) getVolume(w http.ResponseWriter, r *http.Request, p store.Project) error {
	if err := sameProject(p, r.PathValue("pid")); err != nil {
		return err
	}
	v, err := s.volumes.Get(r.Context(), p.ID, r.PathValue("vid"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, volumeOf(v))
	return nil
}

func (s volumeRoutes) resizeVolume(w http.ResponseWriter, r *http.Request, p store.Project) error {
	if err := sameProject(p, r.PathValue("pid")); err != nil {
		return err
	}
	var req struct {
		SizeGB int `json:"sizeGb"`
	}
	if err := decode(w, r, maxBody, &req); err != nil {
		return err
	}
	v, err := s.volumes.Resize(r.Context(), p.ID, r.PathValue("vid"), req.SizeGB)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, volumeOf(v))
	return nil
}

func (s volumeRoutes) deleteVolume(w http.ResponseWriter, r *http.Request, p store.Project) error {
	if err := sameProject(p, r.PathValue("pid")); err != nil {
		return err
	}
	if err := s.volumes.Delete(r.Context(), p.ID, r.PathValue("vid")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
