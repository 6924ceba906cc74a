package server

import (
	"context"
	"errors"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/lizard-build/lizard/internal/agent"
	fspb "github.com/lizard-build/lizard/internal/envd/filesystem"
)

// codeExists is the file-op code of MakeDir on an existing directory.
const codeExists = "exists"

// maxListDepth bounds ListDir's depth.
const maxListDepth = 64

// makeDir creates p and its parents; an existing directory is codeExists.
func makeDir(p string) error {
	if fi, err := os.Stat(p); err == nil {
		if fi.IsDir() {
			return &apiError{http.StatusConflict, codeExists, p + " already exists"}
		}
		return &fs.PathError{Op: "mkdir", Path: p, Err: syscall.EEXIST}
	}
	return os.MkdirAll(p, 0o755)
}

// entryStat is what envd tells of a path: the agent's stat and the
// user-defined metadata (envd_metadata.go).
type entryStat struct {
	agent.FileStat
	Metadata map[string]string `json:"metadata,omitempty"`
}

// statEntry describes p without following a final symlink.
func statEntry(p string) (entryStat, error) {
	st, err := statPath(p)
	if err != nil {
		return entryStat{}, err
	}
	return entryStat{FileStat: st, Metadata: readMetadata(p)}, nil
}

// listTree describes what is under directory p down to depth levels
// (symlinks are listed, not followed, below p itself).
func listTree(p string, depth int) ([]entryStat, error) {
	ents, err := listDir(p)
	if err != nil {
		return nil, err
	}
	out := make([]entryStat, 0, len(ents))
	for _, e := range ents {
		st, err := statEntry(e.Path)
		if err != nil {
			continue // removed since the listing
		}
		out = append(out, st)
		if st.Type == "dir" && depth > 1 {
			sub, err := listTree(e.Path, depth-1)
			if err != nil {
				continue // unreadable: listed, not entered
			}
			out = append(out, sub...)
		}
	}
	return out, nil
}

// envdFS is filesystem.Filesystem.
type envdFS struct {
	s *Server
	e *envd
}

// target resolves the request's user and path.
func (f *envdFS) target(h http.Header, name, p string) (string, *account, error) {
	acct, err := f.e.account(h, "")
	if err != nil {
		return "", nil, err
	}
	p, err = resolvePath(name, p, acct)
	return p, acct, err
}

func (f *envdFS) stat(acct *account, p string) (*fspb.EntryInfo, error) {
	res, err := f.s.fileOpFor(acct, fileOp{Op: opEntry, Path: p})
	if err != nil {
		return nil, err
	}
	return entryInfo(*res.Entry), nil
}

// entryInfo is E2B's EntryInfo of st. A symlink's target is absolute, as
// envd gives it: a relative one is taken from the link's directory.
func entryInfo(st entryStat) *fspb.EntryInfo {
	e := &fspb.EntryInfo{
		Name:         st.Name,
		Path:         st.Path,
		Size:         st.Size,
		Mode:         st.Mode,
		Permissions:  st.Permissions,
		Owner:        st.Owner,
		Group:        st.Group,
		ModifiedTime: timestamppb.New(time.UnixMilli(st.ModTime)),
	}
	switch st.Type {
	case "dir":
		e.Type = fspb.FileType_FILE_TYPE_DIRECTORY
	case "symlink":
		e.Type = fspb.FileType_FILE_TYPE_SYMLINK
	default:
		e.Type = fspb.FileType_FILE_TYPE_FILE
	}
	if t := st.SymlinkTarget; t != "" {
		if !filepath.IsAbs(t) {
			t = filepath.Join(filepath.Dir(st.Path), t)
		}
		e.SymlinkTarget = &t
	}
	e.Metadata = st.Metadata
	return e
}

func (f *envdFS) Stat(_ context.Context, req *connect.Request[fspb.StatRequest]) (*connect.Response[fspb.StatResponse], error) {
	p, acct, err := f.target(req.Header(), "path", req.Msg.Path)
	if err != nil {
		return nil, connectError(err)
	}
	e, err := f.stat(acct, p)
	if err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&fspb.StatResponse{Entry: e}), nil
}

func (f *envdFS) MakeDir(_ context.Context, req *connect.Request[fspb.MakeDirRequest]) (*connect.Response[fspb.MakeDirResponse], error) {
	p, acct, err := f.target(req.Header(), "path", req.Msg.Path)
	if err != nil {
		return nil, connectError(err)
	}
	if _, err := f.s.fileOpFor(acct, fileOp{Op: opMkdir, Path: p}); err != nil {
		return nil, connectError(err)
	}
	e, err := f.stat(acct, p)
	if err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&fspb.MakeDirResponse{Entry: e}), nil
}

func (f *envdFS) Move(_ context.Context, req *connect.Request[fspb.MoveRequest]) (*connect.Response[fspb.MoveResponse], error) {
	from, acct, err := f.target(req.Header(), "source", req.Msg.Source)
	if err != nil {
		return nil, connectError(err)
	}
	to, err := resolvePath("destination", req.Msg.Destination, acct)
	if err != nil {
		return nil, connectError(err)
	}
	if _, err := f.s.fileOpFor(acct, fileOp{Op: opMove, Path: from, To: to}); err != nil {
		return nil, connectError(err)
	}
	e, err := f.stat(acct, to)
	if err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&fspb.MoveResponse{Entry: e}), nil
}

func (f *envdFS) ListDir(_ context.Context, req *connect.Request[fspb.ListDirRequest]) (*connect.Response[fspb.ListDirResponse], error) {
	p, acct, err := f.target(req.Header(), "path", req.Msg.Path)
	if err != nil {
		return nil, connectError(err)
	}
	depth := int(req.Msg.Depth)
	switch {
	case depth == 0:
		depth = 1
	case depth > maxListDepth:
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("depth must be at most 64"))
	}
	res, err := f.s.fileOpFor(acct, fileOp{Op: opTree, Path: p, Depth: depth})
	if err != nil {
		return nil, connectError(err)
	}
	out := &fspb.ListDirResponse{Entries: make([]*fspb.EntryInfo, 0, len(res.Tree))}
	for _, st := range res.Tree {
		out.Entries = append(out.Entries, entryInfo(st))
	}
	return connect.NewResponse(out), nil
}

func (f *envdFS) Remove(_ context.Context, req *connect.Request[fspb.RemoveRequest]) (*connect.Response[fspb.RemoveResponse], error) {
	p, acct, err := f.target(req.Header(), "path", req.Msg.Path)
	if err != nil {
		return nil, connectError(err)
	}
	// As in E2B's envd, removing what is not there succeeds.
	_, err = f.s.fileOpFor(acct, fileOp{Op: opRemove, Path: p})
	if err != nil && toAPIError(err).status != http.StatusNotFound {
		return nil, connectError(err)
	}
	return connect.NewResponse(&fspb.RemoveResponse{}), nil
}

// addWatcher starts a watcher of the agent's hub for an E2B client: of a
// directory only, as E2B's envd (the agent's own watches take files too),
// and not of one on a network file system unless the client allows it
// (envd 0.6.4): inotify there sees only this sandbox's changes.
func (f *envdFS) addWatcher(h http.Header, path string, recursive, entries, network bool) (*watcher, error) {
	p, acct, err := f.target(h, "path", path)
	if err != nil {
		return nil, err
	}
	// As the user: a missing path is NotFound, an unreadable one
	// PermissionDenied.
	if _, err := f.s.fileOpFor(acct, fileOp{Op: opAccess, Path: p}); err != nil {
		return nil, err
	}
	// The user may read p, so the agent looking at it tells them nothing
	// more.
	fi, err := os.Stat(p)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return nil, errInvalid("path %s is not a directory; watch the directory that holds it", p)
	}
	if !network {
		fsType, err := networkFS(p)
		if err != nil {
			return nil, err
		}
		if fsType != "" {
			return nil, errInvalid("path %s is on a network file system (%s), where changes made elsewhere go unseen; allow network mounts to watch it anyway", p, fsType)
		}
	}
	id, err := f.s.watches.add(p, recursive, acct, entries)
	if err != nil {
		return nil, err
	}
	return f.s.watches.get(id)
}

// networkFS names the network file system p is on (by statfs(2)'s magic
// number, as E2B's envd tells them: NFS, CIFS, SMB, FUSE), or "".
func networkFS(p string) (string, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(p, &st); err != nil {
		return "", &fs.PathError{Op: "statfs", Path: p, Err: err}
	}
	return networkFSName(int64(st.Type)), nil
}

func networkFSName(magic int64) string {
	switch magic {
	case unix.NFS_SUPER_MAGIC:
		return "nfs"
	case unix.CIFS_SUPER_MAGIC:
		return "cifs"
	case unix.SMB_SUPER_MAGIC:
		return "smb"
	case unix.SMB2_SUPER_MAGIC:
		return "smb2"
	case unix.FUSE_SUPER_MAGIC:
		return "fuse"
	}
	return ""
}

// fsEvents turns drained agent events into E2B's: names relative to the
// watched path; overflow markers have no E2B equivalent and are dropped.
// A watcher asking for entries gets them on creates, writes and chmods
// (what is at the path now), best-effort: not on removes and renames,
// whose entry is gone (and a new one at the path is not theirs), nor when
// the path is gone again. The agent stats them itself: a watch only
// covers directories its user may list.
func fsEvents(w *watcher, evs []agent.WatchEvent) []*fspb.FilesystemEvent {
	out := make([]*fspb.FilesystemEvent, 0, len(evs))
	for _, ev := range evs {
		var t fspb.EventType
		withEntry := false
		switch ev.Type {
		case agent.WatchCreate:
			t, withEntry = fspb.EventType_EVENT_TYPE_CREATE, true
		case agent.WatchWrite:
			t, withEntry = fspb.EventType_EVENT_TYPE_WRITE, true
		case agent.WatchRemove:
			t = fspb.EventType_EVENT_TYPE_REMOVE
		case agent.WatchRename:
			t = fspb.EventType_EVENT_TYPE_RENAME
		case agent.WatchChmod:
			t, withEntry = fspb.EventType_EVENT_TYPE_CHMOD, true
		default:
			continue
		}
		name, err := filepath.Rel(w.root, ev.Path)
		if err != nil || w.file != "" {
			name = ev.Name
		}
		fe := &fspb.FilesystemEvent{Name: name, Type: t}
		if w.entries && withEntry {
			if st, err := statEntry(ev.Path); err == nil {
				fe.Entry = entryInfo(st)
			}
		}
		out = append(out, fe)
	}
	return out
}

// watchPoll is how often a WatchDir stream drains its watcher.
const watchPoll = 50 * time.Millisecond

func (f *envdFS) WatchDir(ctx context.Context, req *connect.Request[fspb.WatchDirRequest], stream *connect.ServerStream[fspb.WatchDirResponse]) error {
	m := req.Msg
	w, err := f.addWatcher(req.Header(), m.Path, m.Recursive, m.IncludeEntry, m.AllowNetworkMounts)
	if err != nil {
		return connectError(err)
	}
	defer f.s.watches.remove(w)
	if err := stream.Send(&fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Start{Start: &fspb.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	every := f.e.keepaliveEvery(req.Header())
	poll := time.NewTicker(watchPoll)
	defer poll.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-poll.C:
		}
		evs := fsEvents(w, w.queue.drain())
		for _, ev := range evs {
			if err := stream.Send(&fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Filesystem{Filesystem: ev}}); err != nil {
				return err
			}
		}
		if len(evs) > 0 {
			last = time.Now()
		} else if time.Since(last) >= every {
			if err := stream.Send(&fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Keepalive{Keepalive: &fspb.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
			last = time.Now()
		}
	}
}

func (f *envdFS) CreateWatcher(_ context.Context, req *connect.Request[fspb.CreateWatcherRequest]) (*connect.Response[fspb.CreateWatcherResponse], error) {
	m := req.Msg
	w, err := f.addWatcher(req.Header(), m.Path, m.Recursive, m.IncludeEntry, m.AllowNetworkMounts)
	if err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&fspb.CreateWatcherResponse{WatcherId: w.id}), nil
}

func (f *envdFS) GetWatcherEvents(_ context.Context, req *connect.Request[fspb.GetWatcherEventsRequest]) (*connect.Response[fspb.GetWatcherEventsResponse], error) {
	w, err := f.s.watches.get(req.Msg.WatcherId)
	if err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&fspb.GetWatcherEventsResponse{Events: fsEvents(w, w.queue.drain())}), nil
}

func (f *envdFS) RemoveWatcher(_ context.Context, req *connect.Request[fspb.RemoveWatcherRequest]) (*connect.Response[fspb.RemoveWatcherResponse], error) {
	w, err := f.s.watches.get(req.Msg.WatcherId)
	if err != nil {
		return nil, connectError(err)
	}
	if !f.s.watches.remove(w) {
		return nil, connectError(errNotFound("no file watcher %q", w.id))
	}
	return connect.NewResponse(&fspb.RemoveWatcherResponse{}), nil
}
