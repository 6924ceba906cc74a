package server

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/lizard-build/lizard/internal/agent"
)

func eventTypes(evs []agent.WatchEvent) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.Type + " " + e.Path
	}
	return out
}

func TestEventQueueCoalesces(t *testing.T) {
	q := eventQueue{root: "/w", limit: 100}
	for range 50 {
		q.push(agent.WatchWrite, "/w/a")
	}
	q.push(agent.WatchCreate, "/w/b")
	q.push(agent.WatchCreate, "/w/b") // seen by a walk and by its own event
	q.push(agent.WatchWrite, "/w/b")
	q.push(agent.WatchChmod, "/w/a")
	q.push(agent.WatchWrite, "/w/a") // after a chmod: news again
	q.push(agent.WatchChmod, "/w/a")
	q.push(agent.WatchChmod, "/w/a") // chmods are not coalesced
	want := []string{"write /w/a", "create /w/b", "write /w/b", "chmod /w/a", "write /w/a", "chmod /w/a", "chmod /w/a"}
	if got := eventTypes(q.drain()); !slices.Equal(got, want) {
		t.Fatalf("drained %q, want %q", got, want)
	}
	// A drain starts coalescing afresh.
	q.push(agent.WatchWrite, "/w/a")
	if got := eventTypes(q.drain()); !slices.Equal(got, []string{"write /w/a"}) {
		t.Fatalf("after a drain: %q, want one write", got)
	}
	if got := q.drain(); got == nil || len(got) != 0 {
		t.Fatalf("empty drain = %#v, want an empty non-nil slice", got)
	}
}

func TestEventQueueOverflow(t *testing.T) {
	q := eventQueue{root: "/w", limit: 3}
	for _, p := range []string{"/w/1", "/w/2", "/w/3", "/w/4", "/w/5"} {
		q.push(agent.WatchCreate, p)
	}
	got := q.drain()
	want := []string{"create /w/1", "create /w/2", "create /w/3", "overflow /w"}
	if !slices.Equal(eventTypes(got), want) || got[3].Name != "" {
		t.Fatalf("drained %+v, want %q with an unnamed overflow", got, want)
	}
	q.push(agent.WatchCreate, "/w/6")
	if got := eventTypes(q.drain()); !slices.Equal(got, []string{"create /w/6"}) {
		t.Fatalf("after the overflow drain: %q", got)
	}
	// The kernel's overflow is reported the same way.
	q.overflow()
	if got := eventTypes(q.drain()); !slices.Equal(got, []string{"overflow /w"}) {
		t.Fatalf("after a kernel overflow: %q", got)
	}
}

func TestIsTempName(t *testing.T) {
	dir := t.TempDir()
	for _, target := range []string{"a.txt", "noext", ".hidden", "x.lizard-1.tmp", "long-" + strings.Repeat("n", 200)} {
		f, err := os.CreateTemp(dir, tempPattern(filepath.Join(dir, target)))
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
		if name := filepath.Base(f.Name()); !isTempName(name) {
			t.Errorf("isTempName(%q) = false for writeFile's temp name of %q", name, target)
		}
	}
	for _, name := range []string{"a.txt", ".a.txt", ".a.lizard-.tmp", ".lizard-12.tmp", ".a.lizard-12x.tmp", "a.lizard-12.tmp", ".a.lizard-12.tmp.swp"} {
		if isTempName(name) {
			t.Errorf("isTempName(%q) = true", name)
		}
	}
}

func TestMayList(t *testing.T) {
	user := &account{uid: 1000, gid: 1000, groups: []uint32{1000, 27}}
	root := &account{}
	tests := []struct {
		uid, gid, mode uint32
		want           bool
	}{
		{1000, 0, 0o700, true},
		{1000, 0, 0o070, false}, // the owner's bits decide for the owner
		{0, 1000, 0o750, true},
		{0, 27, 0o750, true}, // a supplementary group
		{0, 27, 0o740, false},
		{0, 0, 0o755, true},
		{0, 0, 0o751, false},
		{0, 0, 0o700, false},
	}
	for _, tt := range tests {
		st := &syscall.Stat_t{Uid: tt.uid, Gid: tt.gid, Mode: syscall.S_IFDIR | tt.mode}
		if got := user.mayList(st); got != tt.want {
			t.Errorf("mayList(uid %d gid %d mode %o) = %v, want %v", tt.uid, tt.gid, tt.mode, got, tt.want)
		}
		if !root.mayList(st) {
			t.Errorf("root may not list mode %o", tt.mode)
		}
	}
}
