package server

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/lizard-build/lizard/internal/agent"
)

// File watching (see "File watching" in package agent).
//
// The agent has one inotify instance for all its watchers, made with the
// first watcher and closed with the last. inotify instances are a per-user
// quota (128 by default on Linux) that the agent, as root, shares with the
// sandbox's own root programs (editors, dev servers, test runners), so a
// watcher must not cost one; and one instance needs one reader goroutine
// however many watchers there are. The price: the kernel gives one watch
// descriptor per directory and instance, so two watchers of a directory
// share it. watchHub.users counts who uses each descriptor, and it is
// removed from the kernel only when the last user lets go.
//
// Nothing lives outside the process (no files, no helpers), so a checkpoint
// of the sandbox, which saves the agent's memory and its inotify instance
// with its watches and queued events, carries the watchers over a pause and
// resume or into a snapshot's copies.

const (
	// watchMask is what every directory watch asks for. IN_EXCL_UNLINK
	// leaves out the writes to files already unlinked but still open (a
	// deleted log still being written).
	watchMask = unix.IN_CREATE | unix.IN_MOVED_TO | unix.IN_MOVED_FROM |
		unix.IN_MODIFY | unix.IN_CLOSE_WRITE | unix.IN_DELETE | unix.IN_ATTRIB |
		unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_EXCL_UNLINK
	// maxWatchBody bounds a WatchRequest.
	maxWatchBody = 64 << 10
)

// errWatchLimit is the kernel refusing another watch (ENOSPC from
// inotify_add_watch: fs.inotify.max_user_watches is reached).
var errWatchLimit = errors.New("the sandbox's limit of inotify watches is reached")

// watchHub is the agent's set of watchers and their inotify instance.
type watchHub struct {
	log *slog.Logger

	// mu guards everything below and every watcher's dirs and tempMoves.
	// The reader holds it while it handles a batch of events, so that no
	// watch is added or removed under its feet.
	mu sync.Mutex
	// inotify is the instance, nil while there is no watcher; conn reaches
	// its descriptor without taking it out of the runtime's poller (as Fd
	// would) and without racing its Close.
	inotify  *os.File
	conn     syscall.RawConn
	watchers map[string]*watcher
	// users lists the watchers of each watch descriptor.
	users map[int32][]*watcher
}

// watcher is one client's watch of a path.
type watcher struct {
	id string
	// root is the watched path as the client named it; event paths are
	// built on it even when it goes through symlinks.
	root string
	// file is the base name of the watched file in the watched directory,
	// or "" when root is a directory. A file is watched through its
	// directory: a file replaced by a rename (as editors and PUT /files
	// save) is a new inode, which a watch of the old one would never see.
	file      string
	recursive bool
	acct      *account
	// entries: envd's include_entry, events are to carry the entry's
	// description (envd_fs.go reads it when it drains).
	entries bool

	// dirs maps this watcher's watch descriptors to the directory each
	// stands for. Under watchHub.mu.
	dirs map[int32]string
	// tempMoves holds the rename cookies of hidden temp files whose
	// IN_MOVED_TO is yet to come. Under watchHub.mu.
	tempMoves map[uint32]bool

	queue eventQueue
}

// maxTempMoves bounds tempMoves: a cookie whose IN_MOVED_TO never comes (a
// temp file renamed out of sight) must not stay forever.
const maxTempMoves = 64

func newWatchHub(log *slog.Logger) *watchHub {
	return &watchHub{
		log:      log,
		watchers: make(map[string]*watcher),
		users:    make(map[int32][]*watcher),
	}
}

func (s *Server) watch(w http.ResponseWriter, r *http.Request) error {
	var req agent.WatchRequest
	if err := decodeJSON(w, r, maxWatchBody, &req); err != nil {
		return err
	}
	p, err := cleanPath("path", req.Path)
	if err != nil {
		return err
	}
	acct, err := s.accts.lookupAccount(req.User)
	if err != nil {
		return err
	}
	// The kernel's own check, as the user: a missing path is 404, one the
	// user may not read 403.
	if _, err := s.fileOpFor(acct, fileOp{Op: opAccess, Path: p}); err != nil {
		return err
	}
	id, err := s.watches.add(p, req.Recursive, acct, false)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, agent.WatchReply{WatcherID: id})
	return nil
}

func (s *Server) watchEvents(w http.ResponseWriter, r *http.Request) error {
	wt, err := s.watches.lookup(r)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, wt.queue.drain())
	return nil
}

func (s *Server) unwatch(w http.ResponseWriter, r *http.Request) error {
	wt, err := s.watches.lookup(r)
	if err != nil {
		return err
	}
	if !s.watches.remove(wt) {
		return errNotFound("no file watcher %q", wt.id)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// lookup finds the watcher named by the watcherId query parameter.
func (h *watchHub) lookup(r *http.Request) (*watcher, error) {
	return h.get(r.URL.Query().Get("watcherId"))
}

// get finds the watcher id.
func (h *watchHub) get(id string) (*watcher, error) {
	if id == "" {
		return nil, errInvalid("watcherId is required")
	}
	h.mu.Lock()
	w := h.watchers[id]
	h.mu.Unlock()
	if w == nil {
		return nil, errNotFound("no file watcher %q", id)
	}
	return w, nil
}

// add starts watching p, a clean absolute path, for acct and returns the
// watcher's id; entries is watcher.entries.
func (h *watchHub) add(p string, recursive bool, acct *account, entries bool) (string, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return "", err
	}
	w := &watcher{
		id:        rand.Text(),
		root:      p,
		acct:      acct,
		entries:   entries,
		dirs:      make(map[int32]string),
		tempMoves: make(map[uint32]bool),
		queue:     eventQueue{root: p, limit: agent.MaxWatchEvents},
	}
	dir := p
	if fi.IsDir() {
		w.recursive = recursive
	} else {
		// The directory that holds the file itself, not the link's.
		target, err := filepath.EvalSymlinks(p)
		if err != nil {
			return "", err
		}
		dir, w.file = filepath.Dir(target), filepath.Base(target)
	}
	if err := h.register(w); err != nil {
		return "", err
	}
	if err := h.addTree(w, dir, false); err != nil {
		h.remove(w)
		if errors.Is(err, errWatchLimit) {
			return "", errConflict("cannot watch %s: %v", p, err)
		}
		return "", err
	}
	return w.id, nil
}

// register counts w against agent.MaxWatchers and makes the inotify
// instance if w is the first watcher.
func (h *watchHub) register(w *watcher) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.watchers) >= agent.MaxWatchers {
		return errConflict("the sandbox already has %d file watchers, the most it keeps; close one first", agent.MaxWatchers)
	}
	if h.inotify == nil {
		fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
		if errors.Is(err, unix.EMFILE) {
			return errConflict("cannot watch: the sandbox's limit of inotify instances is reached")
		}
		if err != nil {
			return fmt.Errorf("creating an inotify instance: %w", err)
		}
		// Non-blocking, the file is read through the runtime's poller, so
		// that Close wakes a blocked read.
		f := os.NewFile(uintptr(fd), "inotify")
		conn, err := f.SyscallConn()
		if err != nil {
			f.Close()
			return fmt.Errorf("inotify instance: %w", err)
		}
		h.inotify, h.conn = f, conn
		go h.read(f)
	}
	h.watchers[w.id] = w
	return nil
}

// remove closes w; it says whether w was still open.
func (h *watchHub) remove(w *watcher) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.watchers[w.id] != w {
		return false
	}
	delete(h.watchers, w.id)
	for wd := range w.dirs {
		h.release(w, wd)
	}
	if len(h.watchers) == 0 && h.inotify != nil {
		// Closing drops whatever watches are left and ends the reader.
		h.inotify.Close()
		h.inotify, h.conn = nil, nil
	}
	return true
}

// addDir adds the inotify watch of dir for w. seen is true when w already
// had it (a directory reached twice, through a bind mount) or when w has
// been closed meanwhile: either way there is nothing to walk.
func (h *watchHub) addDir(w *watcher, dir string, follow bool) (seen bool, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.watchers[w.id] != w {
		return true, nil
	}
	mask := uint32(watchMask | unix.IN_ONLYDIR)
	if !follow {
		mask |= unix.IN_DONT_FOLLOW
	}
	var wd int
	var addErr error
	if err := h.conn.Control(func(fd uintptr) {
		wd, addErr = unix.InotifyAddWatch(int(fd), dir, mask)
	}); err != nil {
		return false, fmt.Errorf("inotify instance: %w", err)
	}
	if errors.Is(addErr, unix.ENOSPC) {
		return false, errWatchLimit
	}
	if addErr != nil {
		return false, &fs.PathError{Op: "watch", Path: dir, Err: addErr}
	}
	if _, ok := w.dirs[int32(wd)]; ok {
		return true, nil
	}
	w.dirs[int32(wd)] = dir
	h.users[int32(wd)] = append(h.users[int32(wd)], w)
	return false, nil
}

// release drops w's use of wd, and the kernel's watch with the last use.
// The caller holds h.mu.
func (h *watchHub) release(w *watcher, wd int32) {
	delete(w.dirs, wd)
	users := slices.DeleteFunc(h.users[wd], func(o *watcher) bool { return o == w })
	if len(users) > 0 {
		h.users[wd] = users
		return
	}
	delete(h.users, wd)
	// EINVAL means the kernel has dropped it already (its directory is
	// gone); its IN_IGNORED finds no user.
	_ = h.conn.Control(func(fd uintptr) {
		_, _ = unix.InotifyRmWatch(int(fd), uint32(wd))
	})
}

// releaseTree drops w's watches of dir and every directory under it. The
// caller holds h.mu.
func (h *watchHub) releaseTree(w *watcher, dir string) {
	prefix := dir + "/"
	for wd, d := range w.dirs {
		if d == dir || strings.HasPrefix(d, prefix) {
			h.release(w, wd)
		}
	}
}

// treeDir is a directory addTree still has to read.
type treeDir struct {
	path string
	dev  uint64
}

// addTree watches dir and, for a recursive watcher, every directory under
// it that w may see. emit is for a directory that appeared after the watch
// began: all it holds is reported as created, since it may have got there
// before the directory's own watch was added (mkdir -p, a moved-in tree).
// Each watch is added before its directory is read, so nothing falls in
// between; what is seen twice is coalesced by the queue.
//
// The error is dir's own, or errWatchLimit; a directory below dir that
// cannot be watched (removed meanwhile) is skipped.
func (h *watchHub) addTree(w *watcher, dir string, emit bool) error {
	var st syscall.Stat_t
	if emit {
		// A new directory, found by name: no symlinks followed, and the
		// user's check of the initial walk. (It cannot be another file
		// system's root: mkdir and rename stay on their file system.)
		if err := syscall.Lstat(dir, &st); err != nil || !w.acct.mayList(&st) {
			return nil
		}
	} else if err := syscall.Stat(dir, &st); err != nil {
		return &fs.PathError{Op: "stat", Path: dir, Err: err}
	}
	seen, err := h.addDir(w, dir, !emit)
	if err != nil || seen || !w.recursive {
		return err
	}
	stack := []treeDir{{dir, st.Dev}}
	for len(stack) > 0 {
		d := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		// A directory removed meanwhile has nothing to report; one that
		// fails halfway still gives what was read.
		ents, _ := os.ReadDir(d.path)
		for _, e := range ents {
			p := filepath.Join(d.path, e.Name())
			if emit && !isTempName(e.Name()) {
				w.queue.push(agent.WatchCreate, p)
			}
			if !e.IsDir() {
				continue
			}
			fi, err := e.Info()
			if err != nil {
				continue
			}
			sub, ok := fi.Sys().(*syscall.Stat_t)
			if !ok || !w.acct.mayList(sub) || (sub.Dev != d.dev && pseudoFS(p)) {
				continue
			}
			seen, err := h.addDir(w, p, false)
			if errors.Is(err, errWatchLimit) {
				return err
			}
			if err != nil || seen {
				continue
			}
			stack = append(stack, treeDir{p, sub.Dev})
		}
	}
	return nil
}

// pseudoFS says whether dir is on a file system the kernel makes up (proc,
// sysfs, cgroup, …): inotify reports nothing of their changes, and /proc
// alone would make a recursive watch of / enormous.
func pseudoFS(dir string) bool {
	var sfs unix.Statfs_t
	if err := unix.Statfs(dir, &sfs); err != nil {
		return true
	}
	switch int64(sfs.Type) {
	case unix.PROC_SUPER_MAGIC, unix.SYSFS_MAGIC, unix.CGROUP_SUPER_MAGIC,
		unix.CGROUP2_SUPER_MAGIC, unix.DEBUGFS_MAGIC, unix.TRACEFS_MAGIC,
		unix.SECURITYFS_MAGIC, unix.BPF_FS_MAGIC:
		return true
	}
	return false
}
