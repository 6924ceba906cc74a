package server_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/errdefs"
)

// watchDeadline bounds every wait for an event; inotify is asynchronous,
// so tests poll rather than assume a speed.
const watchDeadline = 15 * time.Second

func startWatch(t *testing.T, c *agent.Client, path string, recursive bool, user string) *eventLog {
	t.Helper()
	id, err := c.Watch(testContext(t), path, recursive, user)
	if err != nil {
		t.Fatalf("Watch(%s, recursive %v, user %q): %v", path, recursive, user, err)
	}
	if id == "" {
		t.Fatal("Watch returned an empty id")
	}
	t.Cleanup(func() { _ = c.Unwatch(context.Background(), id) })
	return &eventLog{t: t, c: c, id: id}
}

// eventLog collects a watcher's events across drains.
type eventLog struct {
	t   *testing.T
	c   *agent.Client
	id  string
	all []agent.WatchEvent
}

// drain adds one drain's events to the log and returns them.
func (l *eventLog) drain() []agent.WatchEvent {
	l.t.Helper()
	evs, err := l.c.WatchEvents(testContext(l.t), l.id)
	if err != nil {
		l.t.Fatalf("WatchEvents: %v", err)
	}
	if evs == nil {
		l.t.Fatal("WatchEvents returned nil, want an empty slice")
	}
	for _, e := range evs {
		if e.Type != agent.WatchOverflow && e.Name != filepath.Base(e.Path) {
			l.t.Fatalf("event %+v: name is not the base name of path", e)
		}
	}
	l.all = append(l.all, evs...)
	return evs
}

// until drains until cond holds, failing after watchDeadline.
func (l *eventLog) until(what string, cond func() bool) {
	l.t.Helper()
	deadline := time.Now().Add(watchDeadline)
	for {
		l.drain()
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			l.t.Fatalf("no %s within %v; events: %v", what, watchDeadline, l.all)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitFor waits until the log has every one of want ("type path").
func (l *eventLog) waitFor(want ...string) {
	l.t.Helper()
	l.until(strings.Join(want, ", "), func() bool {
		for _, w := range want {
			typ, p, _ := strings.Cut(w, " ")
			if !l.has(typ, p) {
				return false
			}
		}
		return true
	})
}

func (l *eventLog) has(typ, path string) bool {
	return l.count(typ, path) > 0
}

func (l *eventLog) count(typ, path string) int {
	n := 0
	for _, e := range l.all {
		if e.Type == typ && e.Path == path {
			n++
		}
	}
	return n
}

// about lists the events of path.
func (l *eventLog) about(path string) []agent.WatchEvent {
	var out []agent.WatchEvent
	for _, e := range l.all {
		if e.Path == path {
			out = append(out, e)
		}
	}
	return out
}

func (l *eventLog) reset() { l.all = nil }

func mustWrite(t *testing.T, p, data string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func mustAppend(t *testing.T, p, data string) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func mustMkdir(t *testing.T, p string) {
	t.Helper()
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
}

func TestWatchDirectory(t *testing.T) {
	c := newClient(t)
	dir := testDir(t)
	l := startWatch(t, c, dir, false, "")
	a := filepath.Join(dir, "a.txt")
	b := filepath.Join(dir, "b.txt")

	mustWrite(t, a, "one")
	l.waitFor("create "+a, "write "+a)

	l.reset()
	mustAppend(t, a, "two")
	l.waitFor("write " + a)

	l.reset()
	if err := os.Chmod(a, 0o600); err != nil {
		t.Fatal(err)
	}
	l.waitFor("chmod " + a)

	l.reset()
	if err := os.Rename(a, b); err != nil {
		t.Fatal(err)
	}
	l.waitFor("rename "+a, "create "+b)

	l.reset()
	if err := os.Remove(b); err != nil {
		t.Fatal(err)
	}
	l.waitFor("remove " + b)

	l.reset()
	sub := filepath.Join(dir, "sub")
	mustMkdir(t, sub)
	l.waitFor("create " + sub)
	if err := os.Remove(sub); err != nil {
		t.Fatal(err)
	}
	l.waitFor("remove " + sub)
}

func TestWatchFile(t *testing.T) {
	c := newClient(t)
	dir := testDir(t)
	f := filepath.Join(dir, "watched.txt")
	other := filepath.Join(dir, "other.txt")
	mustWrite(t, f, "start")
	l := startWatch(t, c, f, true, "") // recursive means nothing for a file

	mustWrite(t, other, "not watched")
	mustAppend(t, f, "more")
	l.waitFor("write " + f)

	if err := os.Chmod(f, 0o600); err != nil {
		t.Fatal(err)
	}
	l.waitFor("chmod " + f)

	// PUT /files replaces the file with a renamed temp file: the watch of
	// the path must see that, and must not show the temp file.
	l.reset()
	if err := c.WriteFile(testContext(t), f, "", strings.NewReader("replaced")); err != nil {
		t.Fatal(err)
	}
	l.waitFor("create "+f, "write "+f)

	if err := os.Remove(f); err != nil {
		t.Fatal(err)
	}
	l.waitFor("remove " + f)

	// The watch outlives the file: a new one at the path is seen.
	mustWrite(t, f, "again")
	l.waitFor("create " + f)

	if err := os.Rename(f, other); err != nil {
		t.Fatal(err)
	}
	l.waitFor("rename " + f)
	for _, e := range l.all {
		if e.Path != f {
			t.Errorf("event %+v is not about the watched file", e)
		}
	}
}

func TestWatchHidesAgentTempFiles(t *testing.T) {
	c := newClient(t)
	dir := testDir(t)
	l := startWatch(t, c, dir, false, "")
	p := filepath.Join(dir, "new.txt")
	if err := c.WriteFile(testContext(t), p, "", strings.NewReader("hello")); err != nil {
		t.Fatal(err)
	}
	l.waitFor("create "+p, "write "+p)
	// Overwriting an existing file is a write too.
	if err := c.WriteFile(testContext(t), p, "", strings.NewReader("hello again")); err != nil {
		t.Fatal(err)
	}
	l.until("a second write", func() bool { return l.count(agent.WatchWrite, p) >= 2 })
	for _, e := range l.all {
		if e.Path != p {
			t.Errorf("event %+v: want only events of %s (temp files hidden)", e, p)
		}
	}
}

func TestWatchRecursive(t *testing.T) {
	c := newClient(t)
	dir := testDir(t)
	deep := filepath.Join(dir, "sub", "deep")
	mustMkdir(t, deep)
	l := startWatch(t, c, dir, true, "")

	// A directory that was there at the start.
	f := filepath.Join(deep, "f.txt")
	mustWrite(t, f, "x")
	l.waitFor("create "+f, "write "+f)

	// A tree made after the start, faster than its watches can be added:
	// the walk of the new directory reports what got there first.
	newTree := filepath.Join(dir, "new")
	leafDir := filepath.Join(newTree, "a", "b")
	mustMkdir(t, leafDir)
	leaf := filepath.Join(leafDir, "leaf.txt")
	mustWrite(t, leaf, "y")
	l.waitFor("create "+newTree, "create "+filepath.Join(newTree, "a"), "create "+leafDir, "create "+leaf)
	// ... and its watches are in place from then on.
	later := filepath.Join(leafDir, "later.txt")
	mustWrite(t, later, "z")
	l.waitFor("create "+later, "write "+later)

	// A directory renamed inside the tree is watched under its new name.
	l.reset()
	moved := filepath.Join(dir, "moved")
	if err := os.Rename(filepath.Join(dir, "sub"), moved); err != nil {
		t.Fatal(err)
	}
	l.waitFor("rename "+filepath.Join(dir, "sub"), "create "+moved)
	g := filepath.Join(moved, "deep", "g.txt")
	mustWrite(t, g, "g")
	l.waitFor("create " + g)
	for _, e := range l.all {
		if strings.HasPrefix(e.Path, filepath.Join(dir, "sub")+"/") {
			t.Errorf("event %+v under the old name of a moved directory", e)
		}
	}

	// A tree moved in from outside is walked like a new one.
	outside := testDir(t)
	mustMkdir(t, filepath.Join(outside, "tree", "inner"))
	mustWrite(t, filepath.Join(outside, "tree", "inner", "in.txt"), "i")
	movedIn := filepath.Join(dir, "tree")
	if err := os.Rename(filepath.Join(outside, "tree"), movedIn); err != nil {
		t.Fatal(err)
	}
	l.waitFor("create "+movedIn, "create "+filepath.Join(movedIn, "inner", "in.txt"))

	l.reset()
	if err := os.RemoveAll(newTree); err != nil {
		t.Fatal(err)
	}
	l.waitFor("remove "+leaf, "remove "+later, "remove "+leafDir, "remove "+newTree)
}

func TestWatchNotRecursive(t *testing.T) {
	c := newClient(t)
	dir := testDir(t)
	sub := filepath.Join(dir, "sub")
	mustMkdir(t, sub)
	l := startWatch(t, c, dir, false, "")
	inSub := filepath.Join(sub, "f.txt")
	mustWrite(t, inSub, "x")
	marker := filepath.Join(dir, "marker")
	mustWrite(t, marker, "m")
	l.waitFor("create " + marker)
	newSub := filepath.Join(dir, "sub2")
	mustMkdir(t, newSub)
	mustWrite(t, filepath.Join(newSub, "g.txt"), "g")
	marker2 := filepath.Join(dir, "marker2")
	mustWrite(t, marker2, "m")
	l.waitFor("create "+newSub, "create "+marker2)
	for _, e := range l.all {
		if filepath.Dir(e.Path) != dir {
			t.Errorf("event %+v is not about a direct child of %s", e, dir)
		}
	}
}

func TestWatchDrainEmptiesQueue(t *testing.T) {
	ts := newTestServer(t)
	c := agent.NewClient(ts.URL, testToken, ts.Client())
	dir := testDir(t)
	l := startWatch(t, c, dir, false, "")
	p := filepath.Join(dir, "f")
	mustWrite(t, p, "x")
	l.waitFor("create " + p)
	// The write that follows the create may come in a later drain; once a
	// drain is empty, the queue is.
	l.until("an empty drain", func() bool { return len(l.drain()) == 0 })

	// Empty is [] on the wire, not null.
	req, err := http.NewRequest(http.MethodGet, ts.URL+"/watch/events?watcherId="+l.id, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(agent.TokenHeader, testToken)
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || strings.TrimSpace(string(body)) != "[]" {
		t.Fatalf("empty drain: %d %q, want 200 []", resp.StatusCode, body)
	}
}

func TestWatchCoalescesWrites(t *testing.T) {
	c := newClient(t)
	dir := testDir(t)
	p := filepath.Join(dir, "burst")
	mustWrite(t, p, "")
	l := startWatch(t, c, dir, false, "")
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	const writes = 500
	for range writes {
		if _, err := f.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	marker := filepath.Join(dir, "marker")
	mustWrite(t, marker, "m")
	l.waitFor("write "+p, "create "+marker)
	// One write per drain: only drains that fell inside the burst split
	// it, and there are far fewer of those than writes.
	if n := l.count(agent.WatchWrite, p); n > 20 {
		t.Fatalf("%d write events for %d writes; want them coalesced", n, writes)
	}
}

func TestWatchOverflow(t *testing.T) {
	c := newClient(t)
	dir := testDir(t)
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	mustWrite(t, a, "")
	mustWrite(t, b, "")
	l := startWatch(t, c, dir, false, "")

	// Chmods are never coalesced, and alternating two files keeps the
	// kernel from merging repeats. Each round queues far more than the
	// limit between two drains, so the queue overflows whatever the speed.
	deadline := time.Now().Add(watchDeadline)
	var overflowed []agent.WatchEvent
	for overflowed == nil {
		if time.Now().After(deadline) {
			t.Fatalf("no overflow event within %v", watchDeadline)
		}
		for i := range 3 * agent.MaxWatchEvents {
			mode := os.FileMode(0o600)
			if i%4 < 2 {
				mode = 0o644
			}
			p := a
			if i%2 == 1 {
				p = b
			}
			if err := os.Chmod(p, mode); err != nil {
				t.Fatal(err)
			}
		}
		evs := l.drain()
		for i, e := range evs {
			if e.Type == agent.WatchOverflow {
				if i != len(evs)-1 {
					t.Fatalf("overflow event at %d of %d, want it last", i, len(evs))
				}
				overflowed = evs
			}
		}
		if len(evs) > agent.MaxWatchEvents+1 {
			t.Fatalf("a drain returned %d events, more than the limit %d and an overflow", len(evs), agent.MaxWatchEvents)
		}
	}
	last := overflowed[len(overflowed)-1]
	if last.Name != "" || last.Path != dir {
		t.Fatalf("overflow event %+v, want empty name and path %s", last, dir)
	}

	// Once the backlog is read, the queue works again.
	l.until("a quiet drain", func() bool { return len(l.drain()) == 0 })
	l.reset()
	marker := filepath.Join(dir, "marker")
	mustWrite(t, marker, "m")
	l.waitFor("create " + marker)
	for _, e := range l.all {
		if e.Type == agent.WatchOverflow {
			t.Fatalf("overflow reported again after a quiet drain: %v", l.all)
		}
	}
}

func TestWatchRequestErrors(t *testing.T) {
	ts := newTestServer(t)
	c := agent.NewClient(ts.URL, testToken, ts.Client())
	ctx := testContext(t)
	dir := testDir(t)

	_, err := c.Watch(ctx, filepath.Join(dir, "missing"), false, "")
	wantClass(t, err, errdefs.ErrNotFound)
	_, err = c.Watch(ctx, filepath.Join(dir, "missing"), true, "nobody")
	wantClass(t, err, errdefs.ErrNotFound)
	_, err = c.Watch(ctx, "relative/path", false, "")
	wantClass(t, err, errdefs.ErrInvalid)
	_, err = c.Watch(ctx, "", false, "")
	wantClass(t, err, errdefs.ErrInvalid)
	_, err = c.Watch(ctx, dir, false, "no-such-user-lizard")
	wantClass(t, err, errdefs.ErrInvalid)

	_, err = c.WatchEvents(ctx, "no-such-watcher")
	wantClass(t, err, errdefs.ErrNotFound)
	wantClass(t, c.Unwatch(ctx, "no-such-watcher"), errdefs.ErrNotFound)

	for _, tt := range []struct{ method, path, body string }{
		{http.MethodGet, "/watch/events", ""},
		{http.MethodDelete, "/watch", ""},
		{http.MethodPost, "/watch", `{"path":"/tmp","recursive":"yes"}`},
	} {
		status, e := rawRequest(t, ts.URL, tt.method, tt.path, tt.body, true)
		if status != http.StatusBadRequest || e.Code != "invalid" {
			t.Errorf("%s %s %s: %d %+v, want 400 invalid", tt.method, tt.path, tt.body, status, e)
		}
	}
}

func TestWatchAsUser(t *testing.T) {
	c := newClient(t)
	ctx := testContext(t)
	dir := testDir(t)
	private := filepath.Join(dir, "private")
	if err := os.Mkdir(private, 0o700); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(dir, "secret.txt")
	if err := os.WriteFile(secret, []byte("s"), 0o600); err != nil {
		t.Fatal(err)
	}

	_, err := c.Watch(ctx, private, false, "nobody")
	wantClass(t, err, errdefs.ErrPermission)
	_, err = c.Watch(ctx, secret, false, "nobody")
	wantClass(t, err, errdefs.ErrPermission)
	_, err = c.Watch(ctx, filepath.Join(private, "x"), false, "nobody")
	wantClass(t, err, errdefs.ErrPermission)

	// A recursive watch as nobody leaves out the directory nobody cannot
	// read, while root's sees into it.
	l := startWatch(t, c, dir, true, "nobody")
	rootLog := startWatch(t, c, dir, true, "")
	hidden := filepath.Join(private, "f.txt")
	mustWrite(t, hidden, "h")
	marker := filepath.Join(dir, "marker")
	mustWrite(t, marker, "m")
	l.waitFor("create " + marker)
	rootLog.waitFor("create "+hidden, "create "+marker)
	if evs := l.about(hidden); len(evs) > 0 {
		t.Fatalf("nobody's watcher saw %v inside a directory nobody cannot read", evs)
	}
}

// inotifyFDs counts this process's inotify instances.
func inotifyFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && strings.Contains(target, "inotify") {
			n++
		}
	}
	return n
}

func TestWatchClose(t *testing.T) {
	c := newClient(t)
	ctx := testContext(t)
	dir := testDir(t)
	before := inotifyFDs(t)

	// Two watchers of one directory share its kernel watch; closing one
	// must leave the other working.
	first := startWatch(t, c, dir, false, "")
	second := startWatch(t, c, dir, true, "")
	if first.id == second.id {
		t.Fatalf("two watchers got the same id %q", first.id)
	}
	if err := c.Unwatch(ctx, first.id); err != nil {
		t.Fatal(err)
	}
	_, err := c.WatchEvents(ctx, first.id)
	wantClass(t, err, errdefs.ErrNotFound)
	wantClass(t, c.Unwatch(ctx, first.id), errdefs.ErrNotFound)

	p := filepath.Join(dir, "after-close")
	mustWrite(t, p, "x")
	second.waitFor("create " + p)

	// The last watcher takes the inotify instance with it.
	if err := c.Unwatch(ctx, second.id); err != nil {
		t.Fatal(err)
	}
	_, err = c.WatchEvents(ctx, second.id)
	wantClass(t, err, errdefs.ErrNotFound)
	deadline := time.Now().Add(watchDeadline)
	for inotifyFDs(t) > before {
		if time.Now().After(deadline) {
			t.Fatalf("%d inotify instances open after every watcher closed, want %d", inotifyFDs(t), before)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// A new watcher after that makes a new instance.
	l := startWatch(t, c, dir, false, "")
	q := filepath.Join(dir, "reopened")
	mustWrite(t, q, "x")
	l.waitFor("create " + q)
}

func TestWatchLimit(t *testing.T) {
	c := newClient(t)
	ctx := testContext(t)
	dir := testDir(t)
	ids := make([]string, 0, agent.MaxWatchers)
	for range agent.MaxWatchers {
		ids = append(ids, startWatch(t, c, dir, false, "").id)
	}
	_, err := c.Watch(ctx, dir, false, "")
	wantClass(t, err, errdefs.ErrConflict)
	if !strings.Contains(err.Error(), fmt.Sprint(agent.MaxWatchers)) {
		t.Errorf("limit error %q does not name the limit", err)
	}
	if err := c.Unwatch(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	startWatch(t, c, dir, false, "")
}

func TestWatchedDirectoryRemovedOrMoved(t *testing.T) {
	c := newClient(t)
	dir := testDir(t)
	gone := filepath.Join(dir, "gone")
	mustMkdir(t, gone)
	mustWrite(t, filepath.Join(gone, "f"), "x")
	away := filepath.Join(dir, "away")
	mustMkdir(t, away)

	lg := startWatch(t, c, gone, true, "")
	la := startWatch(t, c, away, false, "")

	if err := os.RemoveAll(gone); err != nil {
		t.Fatal(err)
	}
	lg.waitFor("remove "+filepath.Join(gone, "f"), "remove "+gone)

	if err := os.Rename(away, filepath.Join(dir, "elsewhere")); err != nil {
		t.Fatal(err)
	}
	la.waitFor("rename " + away)
	// Nothing is reported under the old name after the move.
	mustWrite(t, filepath.Join(dir, "elsewhere", "f"), "x")
	mustMkdir(t, away)
	marker := filepath.Join(away, "marker")
	mustWrite(t, marker, "m")
	check := startWatch(t, c, away, false, "")
	mustWrite(t, filepath.Join(away, "marker2"), "m")
	check.waitFor("create " + filepath.Join(away, "marker2"))
	la.drain()
	if evs := la.about(filepath.Join(away, "f")); len(evs) > 0 || la.has(agent.WatchCreate, marker) {
		t.Fatalf("events after the watched directory moved away: %v", la.all)
	}
}

func TestWatchSymlinkedFile(t *testing.T) {
	c := newClient(t)
	dir := testDir(t)
	target := filepath.Join(dir, "real.txt")
	mustWrite(t, target, "x")
	link := filepath.Join(dir, "link.txt")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	l := startWatch(t, c, link, false, "")
	mustAppend(t, target, "y")
	l.waitFor("write " + link)
	if l.all[0].Name != "link.txt" {
		t.Fatalf("event %+v, want it named as the watched path", l.all[0])
	}
}
