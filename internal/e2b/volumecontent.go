package e2b

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/api"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/volume"
	"github.com/lizard-build/lizard/internal/volume/content"
)

// E2B's volume content API (/volumecontent/{volumeID}/…): a volume's
// files, with the volume's token (from Volume.create or Volume.connect) as
// the bearer. A volume no sandbox holds is lent by the volume manager and
// its files are changed on the host (volume.Manager.Lend: mounted for the
// call, no sandbox attaches it, no resize, delete or sync runs meanwhile);
// a volume a running sandbox holds is reached through that sandbox's
// agent (`lizard volume-content` for everything but the bytes, which go
// through the agent's file reads and writes), so that its files change
// only through the sandbox's own kernel. A paused holder is a conflict.

// contentRoutes serve the volume content API.
type contentRoutes struct {
	volumes Volumes
	agents  Agents
	cli     string // the lizard CLI in sandboxes
	cluster api.Cluster
	log     *slog.Logger
}

// volumeRequest is a content request of a volume whose token it carries.
type volumeRequest struct {
	projectID string
	volume    volume.Volume
	path      string
}

func (c contentRoutes) register(mux *http.ServeMux) {
	for pattern, h := range map[string]func(http.ResponseWriter, *http.Request, volumeRequest) error{
		"GET /volumecontent/{volumeID}/dir":     c.list,
		"POST /volumecontent/{volumeID}/dir":    c.makeDir,
		"GET /volumecontent/{volumeID}/path":    c.stat,
		"PATCH /volumecontent/{volumeID}/path":  c.setAttrs,
		"DELETE /volumecontent/{volumeID}/path": c.remove,
		"GET /volumecontent/{volumeID}/file":    c.read,
		"PUT /volumecontent/{volumeID}/file":    c.write,
	} {
		mux.Handle(pattern, c.authed(h))
	}
}

// contentError is the volume content API's error: its code is a string.
type contentError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// authed admits a request that carries the token of the volume its path
// names, forwards it to the volume's node in a cluster, and answers its
// errors in the content API's shape.
func (c contentRoutes) authed(h func(http.ResponseWriter, *http.Request, volumeRequest) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		vr, forwarded, err := c.admit(w, r)
		if err == nil && !forwarded {
			err = h(w, r, vr)
		}
		if err != nil {
			status, _, msg := api.StatusOf(err)
			if status >= 500 {
				c.log.Error("e2b volume content request failed", "method", r.Method, "path", r.URL.Path, "status", status, "err", err)
			}
			api.WriteJSON(w, status, contentError{Code: strconv.Itoa(status), Message: msg})
		}
	})
}

func (c contentRoutes) admit(w http.ResponseWriter, r *http.Request) (volumeRequest, bool, error) {
	unauthorized := errdefs.WithCode("invalid_volume_token", fmt.Errorf("missing or invalid volume token: send the volume's token (Volume.create, Volume.connect) as Authorization: Bearer: %w", errdefs.ErrUnauthenticated))
	h := r.Header.Get("Authorization")
	tok, ok := strings.CutPrefix(h, "Bearer ")
	if !ok {
		return volumeRequest{}, false, unauthorized
	}
	projectID, secret, ok := parseBearer(tok)
	if !ok {
		return volumeRequest{}, false, unauthorized
	}
	ref := r.PathValue("volumeID")
	if c.cluster != nil {
		if fwd, err := c.cluster.Forward(w, r, projectID, api.Ref{Kind: api.RefVolume, ID: ref}); fwd || err != nil {
			return volumeRequest{}, fwd, err
		}
	}
	v, err := c.volumes.Get(r.Context(), projectID, ref)
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return volumeRequest{}, false, err
	}
	if err != nil || v.Token == "" || subtle.ConstantTimeCompare([]byte(v.Token), []byte(secret)) != 1 {
		return volumeRequest{}, false, unauthorized
	}
	p, err := content.Clean(r.URL.Query().Get("path"))
	if err != nil {
		return volumeRequest{}, false, err
	}
	return volumeRequest{projectID: projectID, volume: v, path: p}, false, nil
}

// do runs req on the volume: lent on the host, or in the sandbox that
// holds it.
func (c contentRoutes) do(ctx context.Context, vr volumeRequest, write bool, req content.Request) (content.Reply, error) {
	var rep content.Reply
	holder, err := c.volumes.Lend(ctx, vr.projectID, vr.volume.ID, write, func(dir string) error {
		f, err := content.Open(dir)
		if err != nil {
			return err
		}
		defer f.Close()
		rep = f.Do(req)
		return nil
	})
	if err != nil {
		return content.Reply{}, err
	}
	if holder == "" {
		return rep, rep.Err()
	}
	ag, err := c.holder(vr, holder)
	if err != nil {
		return content.Reply{}, err
	}
	return c.remote(ctx, ag, req)
}

// holder is the agent of the running sandbox id that holds the volume.
func (c contentRoutes) holder(vr volumeRequest, id string) (*agent.Client, error) {
	ag, _, err := c.agents.Agent(vr.projectID, id)
	switch {
	case errdefs.Code(err) == "sandbox_not_running":
		return nil, errdefs.WithCode("volume_holder_not_running", fmt.Errorf("volume %q is attached to sandbox %s, which is not running (paused): resume it (Sandbox.connect) or kill it to reach the volume's files: %w",
			vr.volume.Name, id, errdefs.ErrConflict))
	case errors.Is(err, errdefs.ErrNotFound):
		// It ended between the look-up and now (a 404 would say the path
		// is not there).
		return nil, errdefs.WithCode("volume_holder_gone", fmt.Errorf("volume %q was attached to sandbox %s, which has just ended: retry: %w", vr.volume.Name, id, errdefs.ErrConflict))
	case err != nil:
		return nil, fmt.Errorf("volume %q is attached to sandbox %s: %w", vr.volume.Name, id, err)
	}
	return ag, nil
}

// remote runs req in the holder's sandbox with its lizard CLI, as root;
// the reply's own error is its error.
func (c contentRoutes) remote(ctx context.Context, ag *agent.Client, req content.Request) (content.Reply, error) {
	argv, err := content.Command(c.cli, volume.MountPath, req)
	if err != nil {
		return content.Reply{}, err
	}
	var stdout, stderr strings.Builder
	exit := -1
	err = ag.Exec(ctx, agent.ExecRequest{Cmd: argv, TimeoutMs: 120_000}, func(ev agent.Event) error {
		switch {
		case ev.Line != nil && ev.Stream == "stdout":
			stdout.WriteString(*ev.Line)
			if !ev.Partial {
				stdout.WriteByte('\n')
			}
		case ev.Line != nil:
			stderr.WriteString(*ev.Line + "\n")
		case ev.ExitCode != nil:
			exit = *ev.ExitCode
		}
		return nil
	})
	if err != nil {
		return content.Reply{}, fmt.Errorf("the volume's files through its sandbox: %w", err)
	}
	var rep content.Reply
	if exit != 0 || json.Unmarshal([]byte(stdout.String()), &rep) != nil {
		return content.Reply{}, errdefs.WithCause(errdefs.ErrUnavailable,
			"the sandbox holding the volume cannot run lizard volume-content (a sandbox of an older server?)",
			fmt.Errorf("exit %d: %s", exit, strings.TrimSpace(stderr.String())))
	}
	return rep, rep.Err()
}

// depth reads the query's depth (default 1).
func depth(r *http.Request) (int, error) {
	v := r.URL.Query().Get("depth")
	if v == "" {
		return 1, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > content.MaxDepth {
		return 0, invalid("depth %q: must be 1 to %d", v, content.MaxDepth)
	}
	return n, nil
}

// attrsAndForce reads uid, gid, mode and force from the query.
func attrsAndForce(r *http.Request) (content.Attrs, bool, error) {
	q := r.URL.Query()
	var a content.Attrs
	for _, f := range []struct {
		name string
		dst  **uint32
	}{{"uid", &a.UID}, {"gid", &a.GID}, {"mode", &a.Mode}} {
		v := q.Get(f.name)
		if v == "" {
			continue
		}
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return a, false, invalid("%s %q: must be an integer from 0 to %d", f.name, v, uint32(1<<32-1))
		}
		u := uint32(n)
		*f.dst = &u
	}
	force := false
	if v := q.Get("force"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return a, false, invalid("force %q: must be true or false", v)
		}
		force = b
	}
	return a, force, nil
}

// answer runs req on the volume and answers with status what it gives: the
// entries of a list, nothing for a remove, else the entry.
func (c contentRoutes) answer(w http.ResponseWriter, r *http.Request, vr volumeRequest, status int, req content.Request) error {
	write := req.Op != content.OpList && req.Op != content.OpStat
	rep, err := c.do(r.Context(), vr, write, req)
	switch {
	case err != nil:
		return err
	case req.Op == content.OpList:
		api.WriteJSON(w, status, rep.Entries)
	case req.Op == content.OpRemove:
		w.WriteHeader(status)
	default:
		api.WriteJSON(w, status, rep.Entry)
	}
	return nil
}

func (c contentRoutes) list(w http.ResponseWriter, r *http.Request, vr volumeRequest) error {
	d, err := depth(r)
	if err != nil {
		return err
	}
	return c.answer(w, r, vr, http.StatusOK, content.Request{Op: content.OpList, Path: vr.path, Depth: d})
}

func (c contentRoutes) makeDir(w http.ResponseWriter, r *http.Request, vr volumeRequest) error {
	a, force, err := attrsAndForce(r)
	if err != nil {
		return err
	}
	return c.answer(w, r, vr, http.StatusCreated, content.Request{Op: content.OpMakeDir, Path: vr.path, Attrs: a, Force: force})
}

func (c contentRoutes) stat(w http.ResponseWriter, r *http.Request, vr volumeRequest) error {
	return c.answer(w, r, vr, http.StatusOK, content.Request{Op: content.OpStat, Path: vr.path})
}

// setAttrs answers PATCH …/path {uid, gid, mode}.
func (c contentRoutes) setAttrs(w http.ResponseWriter, r *http.Request, vr volumeRequest) error {
	var a content.Attrs
	if err := api.Decode(w, r, maxBody, &a); err != nil {
		return err
	}
	return c.answer(w, r, vr, http.StatusOK, content.Request{Op: content.OpSetAttrs, Path: vr.path, Attrs: a})
}

func (c contentRoutes) remove(w http.ResponseWriter, r *http.Request, vr volumeRequest) error {
	return c.answer(w, r, vr, http.StatusNoContent, content.Request{Op: content.OpRemove, Path: vr.path})
}

// read streams the file's bytes.
func (c contentRoutes) read(w http.ResponseWriter, r *http.Request, vr volumeRequest) error {
	ctx := r.Context()
	var answered bool
	holder, err := c.volumes.Lend(ctx, vr.projectID, vr.volume.ID, false, func(dir string) error {
		f, err := content.Open(dir)
		if err != nil {
			return err
		}
		defer f.Close()
		file, e, err := f.OpenRead(vr.path)
		if err != nil {
			return err
		}
		defer file.Close()
		answered = true
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.FormatInt(e.Size, 10))
		w.WriteHeader(http.StatusOK)
		io.Copy(w, io.LimitReader(file, e.Size))
		return nil
	})
	if err != nil || holder == "" {
		if answered {
			return nil // the answer has begun: a failure can only cut it short
		}
		return err
	}
	ag, err := c.holder(vr, holder)
	if err != nil {
		return err
	}
	rep, err := c.remote(ctx, ag, content.Request{Op: content.OpCheckRead, Path: vr.path})
	if err != nil {
		return err
	}
	body, err := ag.ReadFile(ctx, volume.MountPath+rep.Entry.Path, "")
	if err != nil {
		return err
	}
	defer body.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.WriteHeader(http.StatusOK)
	io.Copy(w, body)
	return nil
}

// write writes the body to the file: all or nothing (an upload file beside
// it, renamed over it when complete).
func (c contentRoutes) write(w http.ResponseWriter, r *http.Request, vr volumeRequest) error {
	a, force, err := attrsAndForce(r)
	if err != nil {
		return err
	}
	ctx := r.Context()
	var e content.Entry
	holder, err := c.volumes.Lend(ctx, vr.projectID, vr.volume.ID, true, func(dir string) error {
		f, err := content.Open(dir)
		if err != nil {
			return err
		}
		defer f.Close()
		e, err = f.Write(vr.path, r.Body, a, force)
		return err
	})
	if err != nil {
		return err
	}
	if holder != "" {
		if e, err = c.writeThrough(ctx, vr, holder, r.Body, a, force); err != nil {
			return err
		}
	}
	api.WriteJSON(w, http.StatusCreated, e)
	return nil
}

// writeThrough writes body to the file through the holder's agent: an
// upload file beside it, then its commit.
func (c contentRoutes) writeThrough(ctx context.Context, vr volumeRequest, holder string, body io.Reader, a content.Attrs, force bool) (content.Entry, error) {
	ag, err := c.holder(vr, holder)
	if err != nil {
		return content.Entry{}, err
	}
	rep, err := c.remote(ctx, ag, content.Request{Op: content.OpCheckWrite, Path: vr.path, Force: force})
	if err != nil {
		return content.Entry{}, err
	}
	upload := rep.Upload
	if err := ag.WriteFile(ctx, volume.MountPath+upload, "", body); err != nil {
		c.remote(context.WithoutCancel(ctx), ag, content.Request{Op: content.OpRemove, Path: upload})
		return content.Entry{}, fmt.Errorf("write %q: %w", vr.path, err)
	}
	rep, err = c.remote(ctx, ag, content.Request{Op: content.OpCommit, Path: vr.path, Upload: upload, Attrs: a, Force: force})
	if err != nil {
		return content.Entry{}, err
	}
	return *rep.Entry, nil
}
