package e2b

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/api"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/sandbox/snapshot"
	"github.com/lizard-build/lizard/internal/store"
)

// E2B's snapshots are lizard's snapshots of sandboxes made through the E2B
// API: they keep memory and running processes, and a sandbox made from one
// (Sandbox.create with the snapshot's id or name as its template) goes on
// from the moment it was taken. Those of other sandboxes are not seen here,
// as those sandboxes are not.

// snapshotInfo is E2B's SnapshotInfo: the id to create sandboxes from and
// the names it answers to.
type snapshotInfo struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

// snapshotNameRE is what an E2B snapshot's name may be here: one name,
// usable as a sandbox's template (no team namespace, no tag).
var snapshotNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

func snapshotOf(sn snapshot.Info) snapshotInfo {
	names := []string{}
	// A snapshot taken without a name has lizard's ("Snapshot <sandbox>"),
	// which is no E2B name.
	if snapshotNameRE.MatchString(sn.Name) {
		names = append(names, sn.Name)
	}
	return snapshotInfo{SnapshotID: sn.ID, Names: names}
}

// snapshotFinder finds the project's E2B snapshots: this node's, or every
// node's in a cluster.
type snapshotFinder struct {
	snapshots Snapshots
	templates Templates
	cluster   api.Cluster
}

// all is the project's E2B snapshots.
func (f snapshotFinder) all(ctx context.Context, projectID string) ([]snapshot.Info, error) {
	var all []snapshot.Info
	if f.cluster != nil {
		var err error
		if all, err = f.cluster.Snapshots(ctx, projectID); err != nil {
			return nil, err
		}
	} else {
		all = f.snapshots.List(projectID)
	}
	return slices.DeleteFunc(all, func(sn snapshot.Info) bool { return !sn.E2B }), nil
}

// find returns the project's E2B snapshot that ref names: its id, or its
// name (the newest of that name) unless a template the project sees has
// that name, as a sandbox's template may be either. ok is false when ref
// names none.
func (f snapshotFinder) find(ctx context.Context, projectID, ref string) (_ snapshot.Info, ok bool, err error) {
	all, err := f.all(ctx, projectID)
	if err != nil {
		return snapshot.Info{}, false, err
	}
	var named *snapshot.Info
	for i, sn := range all {
		if sn.ID == ref {
			return sn, true, nil
		}
		if sn.Name == ref && (named == nil || !sn.CreatedAt.Before(named.CreatedAt)) {
			named = &all[i]
		}
	}
	if named == nil {
		return snapshot.Info{}, false, nil
	}
	if tpl, err := f.isTemplate(projectID, ref); err != nil || tpl {
		return snapshot.Info{}, false, err
	}
	return *named, true, nil
}

// isTemplate says whether name is a template (or an alias of one) the
// project sees.
func (f snapshotFinder) isTemplate(projectID, name string) (bool, error) {
	_, ok, err := templateNamed(f.templates, projectID, name)
	_, e2bName := templateAliases[name]
	return ok || e2bName, err
}

// snapshotRoutes serve E2B's snapshot calls.
type snapshotRoutes struct {
	find      snapshotFinder
	sandboxes api.Lifecycle
}

// take answers POST /sandboxes/{id}/snapshots: a snapshot of the running
// sandbox, which keeps running. A name must be one a sandbox can be
// created from, and no template's.
func (s snapshotRoutes) take(w http.ResponseWriter, r *http.Request, p store.Project) error {
	var req struct {
		Name *string `json:"name"`
	}
	if err := api.Decode(w, r, maxBody, &req); err != nil {
		return err
	}
	name := ""
	if req.Name != nil {
		name = *req.Name
		if !snapshotNameRE.MatchString(name) {
			return invalid("name %q: letters, digits, '.', '_' and '-', starting with a letter or digit, at most 128 (no team namespace or tag)", name)
		}
		if tpl, err := s.find.isTemplate(p.ID, name); err != nil {
			return err
		} else if tpl {
			return invalid("name %q: a template has that name; a snapshot's name must not hide it", name)
		}
	}
	rec, err := e2bRecord(s.sandboxes, p, r.PathValue("id"))
	if err != nil {
		return err
	}
	sn, err := s.find.snapshots.Take(r.Context(), p.ID, rec.ID, name, 0)
	if err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusCreated, snapshotOf(sn))
	return nil
}

// snapshotQuery is a validated GET /snapshots.
type snapshotQuery struct {
	sandboxID string // "": any
	name      string // an id or a name; "": any
	pageOrder
}

func parseSnapshotQuery(r *http.Request) (snapshotQuery, error) {
	sq := snapshotQuery{pageOrder: pageOrder{limit: defaultLimit}}
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return sq, invalid("query %q: %v", r.URL.RawQuery, err)
	}
	sq.sandboxID, sq.name = q.Get("sandboxID"), q.Get("name")
	return sq, sq.parsePage(q)
}

// page is the page of snapshots sq asks for, newest first, and the token
// of the next ("" if none).
func (sq snapshotQuery) page(all []snapshot.Info) ([]snapshot.Info, string) {
	all = slices.DeleteFunc(all, func(sn snapshot.Info) bool {
		return (sq.sandboxID != "" && sn.SourceID != sq.sandboxID) || (sq.name != "" && sn.ID != sq.name && sn.Name != sq.name)
	})
	pos := func(sn snapshot.Info) cursor { return cursor{started: sn.CreatedAt, id: sn.ID} }
	return pageOf(all, pos, sq.pageOrder)
}

// list answers GET /snapshots: the project's E2B snapshots, newest first,
// filtered by source sandbox and name, in pages named by X-Next-Token.
func (s snapshotRoutes) list(w http.ResponseWriter, r *http.Request, p store.Project) error {
	sq, err := parseSnapshotQuery(r)
	if err != nil {
		return err
	}
	all, err := s.find.all(r.Context(), p.ID)
	if err != nil {
		return err
	}
	page, next := sq.page(all)
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	out := make([]snapshotInfo, len(page))
	for i, sn := range page {
		out[i] = snapshotOf(sn)
	}
	api.WriteJSON(w, http.StatusOK, out)
	return nil
}

// deleteOr answers DELETE /templates/{templateID} for a snapshot (the
// SDK's Sandbox.deleteSnapshot) and hands anything else to next, the
// templates' own delete.
func (s snapshotRoutes) deleteOr(next func(http.ResponseWriter, *http.Request, store.Project) error) func(http.ResponseWriter, *http.Request, store.Project) error {
	return func(w http.ResponseWriter, r *http.Request, p store.Project) error {
		sn, ok, err := s.find.find(r.Context(), p.ID, r.PathValue("templateID"))
		if err != nil {
			return err
		}
		if !ok {
			return next(w, r, p)
		}
		if s.find.cluster != nil {
			if fwd, err := s.find.cluster.Forward(w, r, p.ID, api.Ref{Kind: api.RefSnapshot, ID: sn.ID}); fwd || err != nil {
				return err
			}
		}
		if err := s.find.snapshots.Delete(r.Context(), p.ID, sn.ID); err != nil {
			return err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
}

// fromSnapshot checks what a create from snapshot sn asks for beyond a
// timeout, metadata and envs: a copy has its source's network, security
// and volume, so a request for a different one is refused rather than
// silently not granted.
func fromSnapshot(req newSandbox, sn snapshot.Info) error {
	if len(req.VolumeMounts) > 0 {
		return invalid("volumeMounts: a sandbox made from snapshot %s has its source's volume, if it had one", sn.ID)
	}
	if n := req.Network; n != nil && (len(n.AllowOut) > 0 || len(n.DenyOut) > 0 || len(n.Rules) > 0 || n.EgressProxy != nil ||
		len(n.HTTPSPorts) > 0 || n.AllowPublicTraffic != nil || n.MaskRequestHost != "") {
		return invalid("network: a sandbox made from snapshot %s has its source's network settings (change them with updateNetwork once it runs)", sn.ID)
	}
	if a := req.AllowInternetAccess; a != nil && !*a && !sn.Egress.Restricted {
		return invalid("allow_internet_access: false: snapshot %s is of a sandbox with internet access, and so are the sandboxes made from it", sn.ID)
	}
	if secure(req.Secure) && !sn.Secure {
		return invalid("secure: snapshot %s is of a sandbox made with secure: false, and so are the sandboxes made from it (create with secure: false)", sn.ID)
	}
	return nil
}

// restore answers a create whose template is snapshot sn: a new sandbox
// from it, with the create's metadata (as E2B, the snapshot's are not
// kept), its envs over the source's for new commands, and its autoPause.
func (s *server) restore(w http.ResponseWriter, r *http.Request, p store.Project, req newSandbox, sn snapshot.Info, timeout int64, body []byte) error {
	if err := fromSnapshot(req, sn); err != nil {
		return err
	}
	create := func() error {
		made, err := s.copies.Restore(r.Context(), p.ID, sn.ID, timeout)
		if err != nil {
			return err
		}
		rec, err := s.sandboxes.Update(r.Context(), p.ID, made.ID, func(rec *sandbox.Record) error {
			rec.Metadata = req.Metadata
			if len(req.EnvVars) > 0 {
				envs := make(map[string]string, len(rec.Envs)+len(req.EnvVars))
				for k, v := range rec.Envs {
					envs[k] = v
				}
				for k, v := range req.EnvVars {
					envs[k] = v
				}
				rec.Envs = envs
			}
			rec.AutoPause = req.AutoPause != nil && *req.AutoPause
			rec.AutoResume = rec.AutoPause && req.AutoResume != nil && req.AutoResume.Enabled
			return nil
		})
		if err == nil && len(req.EnvVars) > 0 {
			err = s.giveEnvs(r.Context(), rec)
		}
		if err != nil {
			s.sandboxes.Kill(context.WithoutCancel(r.Context()), p.ID, made.ID)
			return fmt.Errorf("sandbox from snapshot %s: %w", sn.ID, err)
		}
		api.WriteJSON(w, http.StatusCreated, s.infoOf(rec))
		return nil
	}
	if s.cluster == nil {
		return create()
	}
	return s.cluster.Create(w, r, p.ID, api.Placement{Snapshot: sn.ID}, body, create)
}

// giveEnvs tells the envd of rec, a sandbox made from a snapshot, its envs
// as they are now: it was told the snapshot's when it came up.
func (s *server) giveEnvs(ctx context.Context, rec sandbox.Record) error {
	ag, _, err := s.agents.Agent(rec.ProjectID, rec.ID)
	if err != nil {
		return err
	}
	return ag.SetEnvd(ctx, agent.EnvdRequest{Token: rec.EnvdToken, Secure: rec.Secure, User: rec.User, Workdir: rec.Workdir, Env: rec.Envs})
}
