package server

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/lizard-build/lizard/internal/agent"
)

// inotifyBufSize holds many events per read; one event is at most
// unix.SizeofInotifyEvent + NAME_MAX + 1 bytes.
const inotifyBufSize = 64 << 10

// pendingScan is a directory that appeared in a recursive watch.
type pendingScan struct {
	w   *watcher
	dir string
}

// read turns the events of the inotify instance f into watcher events
// until f is closed.
func (h *watchHub) read(f *os.File) {
	buf := make([]byte, inotifyBufSize)
	for {
		n, err := f.Read(buf)
		if err != nil {
			if !errors.Is(err, os.ErrClosed) {
				h.log.Error("reading inotify events failed; file watchers report nothing more", "err", err)
			}
			return
		}
		scans, ok := h.dispatch(f, buf[:n])
		if !ok {
			return
		}
		// New directories are walked outside the lock (each watch added
		// under it), so that a big tree moved in does not hold up the
		// other watchers' requests. Their own events wait in the kernel
		// until the next read, after the walk has reported what it found.
		for _, s := range scans {
			if err := h.addTree(s.w, s.dir, true); err != nil {
				h.log.Warn("watching a new directory failed", "dir", s.dir, "err", err)
				s.w.queue.overflow()
			}
		}
	}
}

// dispatch hands a batch of raw events to their watchers. It returns the
// directories to walk, and false when f is no longer the instance (closed
// with the last watcher): its watch descriptors mean nothing now.
func (h *watchHub) dispatch(f *os.File, buf []byte) ([]pendingScan, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.inotify != f {
		return nil, false
	}
	var scans []pendingScan
	for len(buf) >= unix.SizeofInotifyEvent {
		wd := int32(binary.NativeEndian.Uint32(buf[0:]))
		mask := binary.NativeEndian.Uint32(buf[4:])
		cookie := binary.NativeEndian.Uint32(buf[8:])
		end := unix.SizeofInotifyEvent + int(binary.NativeEndian.Uint32(buf[12:]))
		if end > len(buf) {
			break
		}
		// The name is padded with NULs to an aligned length.
		name := string(bytes.TrimRight(buf[unix.SizeofInotifyEvent:end], "\x00"))
		buf = buf[end:]
		switch {
		case mask&unix.IN_Q_OVERFLOW != 0:
			// The kernel's queue was full: anyone may have lost events.
			for _, w := range h.watchers {
				w.queue.overflow()
			}
		case mask&unix.IN_IGNORED != 0:
			// The kernel dropped the watch: its directory is gone.
			for _, w := range h.users[wd] {
				delete(w.dirs, wd)
			}
			delete(h.users, wd)
		default:
			// A copy: handling may release the descriptor.
			for _, w := range slices.Clone(h.users[wd]) {
				dir, ok := w.dirs[wd]
				if !ok {
					continue
				}
				if scan := h.event(w, dir, mask, cookie, name); scan != "" {
					scans = append(scans, pendingScan{w, scan})
				}
			}
		}
	}
	return scans, true
}

// event queues what one inotify event from w's watch of dir means to w. It
// returns a directory to walk (one that appeared in a recursive watch), or
// "". The caller holds h.mu.
func (h *watchHub) event(w *watcher, dir string, mask, cookie uint32, name string) string {
	if name == "" {
		h.selfEvent(w, dir, mask)
		return ""
	}
	fromTemp := false
	if mask&unix.IN_MOVED_TO != 0 {
		fromTemp = w.tempMoves[cookie]
		delete(w.tempMoves, cookie)
	}
	if isTempName(name) {
		// PUT /files writes a temp file and renames it over the target:
		// its creation, writes and chmod are noise, and its rename is
		// reported as the target's write below.
		if mask&unix.IN_MOVED_FROM != 0 {
			if len(w.tempMoves) >= maxTempMoves {
				clear(w.tempMoves)
			}
			w.tempMoves[cookie] = true
		}
		return ""
	}
	p := filepath.Join(dir, name)
	if w.file != "" {
		if name != w.file {
			return ""
		}
		p = w.root
	}
	isDir := mask&unix.IN_ISDIR != 0
	switch {
	case mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0:
		w.queue.push(agent.WatchCreate, p)
		if fromTemp {
			w.queue.push(agent.WatchWrite, p)
		}
		if isDir && w.recursive {
			return p
		}
	case mask&unix.IN_MOVED_FROM != 0:
		w.queue.push(agent.WatchRename, p)
		if isDir && w.recursive {
			// Its watches would report under the old name. If it moved
			// within the tree, its IN_MOVED_TO walks it again.
			h.releaseTree(w, p)
		}
	case mask&unix.IN_DELETE != 0:
		w.queue.push(agent.WatchRemove, p)
	case mask&(unix.IN_MODIFY|unix.IN_CLOSE_WRITE) != 0:
		w.queue.push(agent.WatchWrite, p)
	case mask&unix.IN_ATTRIB != 0:
		w.queue.push(agent.WatchChmod, p)
	}
	return ""
}

// selfEvent handles an event of a watched directory itself. Only the
// watched path's own count: a subdirectory's are reported by its parent's
// watch, and the directory of a watched file is not what was asked for.
// The caller holds h.mu.
func (h *watchHub) selfEvent(w *watcher, dir string, mask uint32) {
	if w.file != "" || dir != w.root {
		return
	}
	switch {
	case mask&unix.IN_DELETE_SELF != 0:
		w.queue.push(agent.WatchRemove, w.root)
	case mask&unix.IN_MOVE_SELF != 0:
		w.queue.push(agent.WatchRename, w.root)
		// Every path it would report from now on would be wrong.
		for wd := range w.dirs {
			h.release(w, wd)
		}
	case mask&unix.IN_ATTRIB != 0:
		w.queue.push(agent.WatchChmod, w.root)
	}
}

// eventQueue is a watcher's bounded queue of undrained events.
type eventQueue struct {
	root  string // the path of the overflow event
	limit int

	mu     sync.Mutex
	events []agent.WatchEvent
	// last is the type of the last queued event of each path since the
	// last drain, for coalescing.
	last    map[string]string
	dropped bool
}

// push queues an event of type typ for path p, unless it repeats p's last
// one (a write after a write says nothing new, a create after a create is
// one entry seen by a walk and by its own event) or the queue is full.
func (q *eventQueue) push(typ, p string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if (typ == agent.WatchWrite || typ == agent.WatchCreate) && q.last[p] == typ {
		return
	}
	if len(q.events) >= q.limit {
		q.dropped = true
		return
	}
	if q.last == nil {
		q.last = make(map[string]string)
	}
	q.events = append(q.events, agent.WatchEvent{Type: typ, Name: filepath.Base(p), Path: p})
	q.last[p] = typ
}

// overflow records that events were lost.
func (q *eventQueue) overflow() {
	q.mu.Lock()
	q.dropped = true
	q.mu.Unlock()
}

// drain returns the queued events, then an overflow event if some were
// lost, and empties the queue; never nil.
func (q *eventQueue) drain() []agent.WatchEvent {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := q.events
	q.events = nil
	// A new map rather than clear: a map keeps the room of its biggest
	// burst.
	q.last = nil
	if q.dropped {
		out = append(out, agent.WatchEvent{Type: agent.WatchOverflow, Path: q.root})
		q.dropped = false
	}
	if out == nil {
		out = []agent.WatchEvent{}
	}
	return out
}
