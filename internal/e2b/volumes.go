package e2b

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"path"
	"strings"

	"github.com/lizard-build/lizard/internal/api"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/volume"
)

// E2B's volumes are lizard's volumes (internal/volume): an ext4 image of
// its own each, attached to one sandbox at a time, which sees it at
// volume.MountPath (/workspace). A volume made here has lizard's default
// size (volume.DefaultSizeGB) and may be resized through the Lizard API.

// volumeMount is E2B's SandboxVolumeMount.
type volumeMount struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// mountedVolume is the volume a create's volumeMounts ask for ("" none):
// one, at volume.MountPath, as lizard attaches volumes.
func mountedVolume(ms []volumeMount) (string, error) {
	switch {
	case len(ms) == 0:
		return "", nil
	case len(ms) > 1:
		return "", invalid("volumeMounts: %d volumes: lizard attaches one volume to a sandbox", len(ms))
	case ms[0].Name == "":
		return "", invalid("volumeMounts[0].name: required")
	case ms[0].Path == "" || path.Clean(ms[0].Path) != volume.MountPath:
		return "", invalid("volumeMounts[0].path %q: lizard mounts a sandbox's volume at %s (use that path)", ms[0].Path, volume.MountPath)
	}
	return ms[0].Name, nil
}

// mountsOf is E2B's volumeMounts of rec: its volume, named by vols.
func mountsOf(rec sandbox.Record, vols map[string]string) []volumeMount {
	if rec.VolumeID == "" {
		return []volumeMount{}
	}
	name := vols[rec.VolumeID]
	if name == "" {
		name = rec.VolumeID
	}
	return []volumeMount{{Name: name, Path: volume.MountPath}}
}

// volumeNames are the names of the volumes recs hold, by id (nil when none
// holds one).
func (s *server) volumeNames(ctx context.Context, projectID string, recs []sandbox.Record) (map[string]string, error) {
	need := false
	for _, rec := range recs {
		need = need || rec.VolumeID != ""
	}
	if !need {
		return nil, nil
	}
	vs, err := volumeList(s.volumes, s.cluster)(ctx, projectID)
	if err != nil {
		return nil, err
	}
	names := make(map[string]string, len(vs))
	for _, v := range vs {
		names[v.ID] = v.Name
	}
	return names, nil
}

// volumeInfo is E2B's Volume (in lists) and VolumeAndToken (Token set).
type volumeInfo struct {
	VolumeID string `json:"volumeID"`
	Name     string `json:"name"`
	Token    string `json:"token,omitempty"`
}

// tokenPrefix begins a volume's token as the SDK gets it (bearerToken).
const tokenPrefix = "lzvol."

// bearerToken is the token of volume v of project projectID as E2B's SDK
// sends it to the volume content API: the project (to find the volume,
// and its node in a cluster) and the volume's own token.
func bearerToken(projectID string, v volume.Volume) string {
	return tokenPrefix + base64.RawURLEncoding.EncodeToString([]byte(projectID)) + "." + v.Token
}

// parseBearer splits a bearer token into its project and volume token.
func parseBearer(tok string) (projectID, secret string, ok bool) {
	rest, ok := strings.CutPrefix(tok, tokenPrefix)
	if !ok {
		return "", "", false
	}
	p, secret, ok := strings.Cut(rest, ".")
	b, err := base64.RawURLEncoding.DecodeString(p)
	if !ok || err != nil || len(b) == 0 || secret == "" {
		return "", "", false
	}
	return string(b), secret, true
}

// volumeRoutes serve E2B's /volumes.
type volumeRoutes struct {
	volumes Volumes
	cluster api.Cluster
}

// forward answers r on the node of volume ref in a cluster.
func (s volumeRoutes) forward(w http.ResponseWriter, r *http.Request, p store.Project, ref string) (bool, error) {
	if s.cluster == nil {
		return false, nil
	}
	return s.cluster.Forward(w, r, p.ID, api.Ref{Kind: api.RefVolume, ID: ref})
}

// create answers POST /volumes {name}: a volume of lizard's default size;
// a name the project has is a conflict.
func (s volumeRoutes) create(w http.ResponseWriter, r *http.Request, p store.Project) error {
	body, err := api.ReadBody(w, r, maxBody)
	if err != nil {
		return err
	}
	var req struct {
		Name string `json:"name"`
	}
	if err := api.Unmarshal(body, &req); err != nil {
		return err
	}
	if req.Name != "" {
		// A name the project has on another node is that node's conflict.
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		if fwd, err := s.forward(w, r, p, req.Name); fwd || err != nil {
			return err
		}
	}
	create := func() error {
		v, err := s.volumes.Create(r.Context(), p.ID, req.Name, 0, "", false)
		if err != nil {
			return err
		}
		api.WriteJSON(w, http.StatusCreated, volumeInfo{VolumeID: v.ID, Name: v.Name, Token: bearerToken(p.ID, v)})
		return nil
	}
	if s.cluster == nil {
		return create()
	}
	return s.cluster.Create(w, r, p.ID, api.Placement{}, body, create)
}

// volumeList lists a project's volumes: every node's in a cluster.
func volumeList(vols Volumes, c api.Cluster) func(ctx context.Context, projectID string) ([]volume.Volume, error) {
	if c != nil {
		return c.Volumes
	}
	return vols.List
}

func (s volumeRoutes) list(w http.ResponseWriter, r *http.Request, p store.Project) error {
	vs, err := volumeList(s.volumes, s.cluster)(r.Context(), p.ID)
	if err != nil {
		return err
	}
	out := make([]volumeInfo, len(vs))
	for i, v := range vs {
		out[i] = volumeInfo{VolumeID: v.ID, Name: v.Name}
	}
	api.WriteJSON(w, http.StatusOK, out)
	return nil
}

// get answers GET /volumes/{volumeID} with the volume's token.
func (s volumeRoutes) get(w http.ResponseWriter, r *http.Request, p store.Project) error {
	ref := r.PathValue("volumeID")
	if fwd, err := s.forward(w, r, p, ref); fwd || err != nil {
		return err
	}
	v, err := s.volumes.Token(r.Context(), p.ID, ref)
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusOK, volumeInfo{VolumeID: v.ID, Name: v.Name, Token: bearerToken(p.ID, v)})
	return nil
}

// delete answers DELETE /volumes/{volumeID}: a volume a sandbox holds is
// a conflict naming it.
func (s volumeRoutes) delete(w http.ResponseWriter, r *http.Request, p store.Project) error {
	ref := r.PathValue("volumeID")
	if fwd, err := s.forward(w, r, p, ref); fwd || err != nil {
		return err
	}
	if err := s.volumes.Delete(r.Context(), p.ID, ref); err != nil {
		return fmt.Errorf("delete volume: %w", err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
