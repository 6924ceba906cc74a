//go:build linux

package template

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/reaper"
)

func TestParseMountsUnder(t *testing.T) {
	const mountinfo = `22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
40 22 0:5 / /var/cache/lizard/templates/.build-base-1/rootfs/proc rw - proc proc rw
41 22 0:6 / /var/cache/lizard/templates/.build-base-1/rootfs/dev rw - tmpfs nodev rw
42 41 0:7 /null /var/cache/lizard/templates/.build-base-1/rootfs/dev/null rw - devtmpfs udev rw
43 22 0:8 / /var/cache/lizard/templates/.build-base-10/rootfs/proc rw - proc proc rw
44 22 0:9 / /var/cache/lizard/templates/.build-base-1/with\040space rw - tmpfs x rw
`
	got, err := parseMountsUnder(strings.NewReader(mountinfo), "/var/cache/lizard/templates/.build-base-1")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"/var/cache/lizard/templates/.build-base-1/rootfs/dev/null",
		"/var/cache/lizard/templates/.build-base-1/rootfs/proc",
		"/var/cache/lizard/templates/.build-base-1/rootfs/dev",
		"/var/cache/lizard/templates/.build-base-1/with space",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q\nwant %q", got, want)
	}
}

func TestUnescapeMount(t *testing.T) {
	for in, want := range map[string]string{`/a\040b`: "/a b", `/a\134b`: `/a\b`, `/a\04`: `/a\04`, `/plain`: "/plain"} {
		if got := unescapeMount(in); got != want {
			t.Errorf("unescapeMount(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestRemoveTreeStaysInside: removing a build directory must not follow
// symlinks out of it nor descend into what is mounted in it.
func TestRemoveTreeStaysInside(t *testing.T) {
	base := t.TempDir()
	outside := filepath.Join(base, "outside")
	if err := os.MkdirAll(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	precious := filepath.Join(outside, "precious")
	if err := os.WriteFile(precious, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := NewRegistry(filepath.Join(base, "templates"))
	build := filepath.Join(r.Dir(), ".build-base-42")
	if err := os.MkdirAll(filepath.Join(build, "rootfs", "dev", "shm"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(build, "rootfs", "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(precious, filepath.Join(build, "rootfs", "filelink")); err != nil {
		t.Fatal(err)
	}
	mounted := false
	if os.Geteuid() == 0 {
		// What a killed debootstrap leaves in a container: a bind mount of
		// a host directory inside the target.
		target := filepath.Join(build, "rootfs", "dev", "shm")
		if err := syscall.Mount(outside, target, "", syscall.MS_BIND, ""); err == nil {
			mounted = true
			t.Cleanup(func() { syscall.Unmount(target, syscall.MNT_DETACH) })
			if err := syscall.Mount("tmpfs", filepath.Join(build, "rootfs", "dev", "shm"), "tmpfs", 0, "size=1m"); err != nil {
				t.Logf("stacked tmpfs mount: %v", err)
			}
		} else {
			t.Logf("bind mount not possible here (%v); testing symlinks only", err)
		}
	}

	if err := r.removeTree(build); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(build); !os.IsNotExist(err) {
		t.Errorf("build dir still there: %v", err)
	}
	if b, err := os.ReadFile(precious); err != nil || string(b) != "keep" {
		t.Errorf("file outside the tree was touched: %q, %v", b, err)
	}
	if mounted {
		if mps, _ := mountsUnder(build); len(mps) != 0 {
			t.Errorf("mounts left: %v", mps)
		}
	} else {
		t.Log("mount part skipped (not root or no mount permission)")
	}

	// Only hidden build directories and versions of the registry may be
	// removed.
	for _, p := range []string{outside, filepath.Join(r.Dir(), "base"), filepath.Join(base, ".build-base-1"),
		filepath.Join(r.Dir(), versionsDir), filepath.Join(r.Dir(), versionsDir, "noversion"), filepath.Join(r.Dir(), versionsDir, ".x@1"),
		filepath.Join(r.Dir(), versionsDir, "base@1", "rootfs"), filepath.Join(r.Dir(), ".link-base-1")} {
		if err := r.removeTree(p); err == nil {
			t.Errorf("removeTree(%s) allowed", p)
		}
	}
	if _, err := os.Stat(precious); err != nil {
		t.Errorf("precious gone: %v", err)
	}
}

func TestRemoveStale(t *testing.T) {
	r := NewRegistry(t.TempDir())
	for _, d := range []string{".build-base-1", ".old-base-22", ".build-base-x-3", ".build-other-4", "base", ".v/base@1"} {
		if err := os.MkdirAll(filepath.Join(r.Dir(), d, "rootfs"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// Links a crashed switch left: base's goes (not what it points to),
	// base-x's stays.
	for _, l := range []string{".link-base-5", ".link-base-x-6"} {
		if err := os.Symlink(".v/base@1", filepath.Join(r.Dir(), l)); err != nil {
			t.Fatal(err)
		}
	}
	var buf bytes.Buffer
	r.removeStale("base", newReporter(&buf, "base"))
	ents, _ := os.ReadDir(r.Dir())
	var left []string
	for _, e := range ents {
		left = append(left, e.Name())
	}
	if want := []string{".build-base-x-3", ".build-other-4", ".link-base-x-6", ".v", "base"}; !reflect.DeepEqual(left, want) {
		t.Errorf("left %v, want %v", left, want)
	}
	if _, err := os.Stat(filepath.Join(r.Dir(), ".v", "base@1", "rootfs")); err != nil {
		t.Errorf("removing a link removed its target: %v", err)
	}
}

func TestInstallReplaces(t *testing.T) {
	r := NewRegistry(t.TempDir())
	fakeTemplate(t, r.Dir(), "base", metadata{Version: "old"})
	fakeTemplate(t, r.Dir(), ".build-base-7", metadata{Version: "new"})
	if err := r.install("base", filepath.Join(r.Dir(), ".build-base-7"), newReporter(nil, "base")); err != nil {
		t.Fatal(err)
	}
	got, err := r.Get("base")
	if err != nil || got.Version != "new" {
		t.Fatalf("Get = %+v, %v", got, err)
	}
	// The link and the versions (the old one moved under .v), nothing else.
	if left := entries(t, r.Dir()); !reflect.DeepEqual(left, []string{".v", "base"}) {
		t.Errorf("entries left: %v", left)
	}
	if vs := entries(t, filepath.Join(r.Dir(), versionsDir)); len(vs) != 2 {
		t.Errorf("versions: %v, want the old and the new", vs)
	}
	// First install, nothing to replace.
	fakeTemplate(t, r.Dir(), ".build-other-8", metadata{Version: "1"})
	if err := r.install("other", filepath.Join(r.Dir(), ".build-other-8"), newReporter(nil, "other")); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Get("other"); err != nil {
		t.Fatal(err)
	}
}

// entries lists the names in dir, sorted.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	names := []string{}
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func TestLockSerializes(t *testing.T) {
	r := NewRegistry(t.TempDir())
	if err := os.MkdirAll(r.Dir(), 0o755); err != nil {
		t.Fatal(err)
	}
	var buf syncBuffer
	rep := newReporter(&buf, "base")
	l1, err := r.lock(context.Background(), "base", rep)
	if err != nil {
		t.Fatal(err)
	}
	// A different name is independent.
	l3, err := r.lock(context.Background(), "other", rep)
	if err != nil {
		t.Fatal(err)
	}
	l3.unlock()

	// A waiter gives up when its context ends.
	ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
	defer cancel()
	if _, err := r.lock(ctx, "base", rep); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("lock while held = %v, want deadline exceeded", err)
	}
	if !strings.Contains(buf.String(), "waiting for another build of base") {
		t.Errorf("no waiting message: %q", buf.String())
	}

	// A waiter gets the lock once it is released.
	got := make(chan error, 1)
	go func() {
		l2, err := r.lock(context.Background(), "base", rep)
		if err == nil {
			l2.unlock()
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("second lock returned while the first was held: %v", err)
	case <-time.After(400 * time.Millisecond):
	}
	l1.unlock()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("second lock not granted after unlock")
	}
}

func TestTreeSize(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "a"), make([]byte, 1000), 0o644)
	os.Mkdir(filepath.Join(dir, "d"), 0o755)
	os.WriteFile(filepath.Join(dir, "d", "b"), make([]byte, 24), 0o644)
	os.Link(filepath.Join(dir, "a"), filepath.Join(dir, "d", "hard")) // counted once
	os.Symlink("/usr/bin/env", filepath.Join(dir, "sym"))             // not followed
	n, err := treeSize(dir)
	if err != nil {
		t.Fatal(err)
	}
	if n != 1024 {
		t.Errorf("treeSize = %d, want 1024", n)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestBuildToolsRunCommand: the host commands of a built-in build
// (debootstrap's first stage) go through the registry's RunCommand, so that
// in a server (a child subreaper) they run through its reaper: their exit
// statuses come back intact while the reaper reaps, and a cancelled tool's
// group is stopped.
func TestBuildToolsRunCommand(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reap, err := reaper.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ran atomic.Int32
	run := func(cmd *exec.Cmd) error {
		ran.Add(1)
		return reap.Run(cmd)
	}
	exitCode := func(err error) int {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("want an exit status, got %v", err)
		}
		return ee.ExitCode()
	}
	lock, err := os.CreateTemp(t.TempDir(), "lock")
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	rep := newReporter(nil, "test")
	for i := range 20 {
		if err := runTool(ctx, run, exec.CommandContext(ctx, "/bin/sh", "-c", "exit 0"), lock, rep, func(string) {}); err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
	}
	if code := exitCode(runTool(ctx, run, exec.CommandContext(ctx, "/bin/sh", "-c", "exit 4"), lock, rep, func(string) {})); code != 4 {
		t.Fatalf("tool: exit %d, want 4", code)
	}

	// Cancelled once it runs: the group (sh and its sleep) is stopped.
	tctx, tcancel := context.WithCancel(ctx)
	defer tcancel()
	cmd := exec.CommandContext(tctx, "sh", "-c", "sleep 1000 & echo $!; wait")
	var sleeper string
	err = runTool(tctx, run, cmd, lock, rep, func(line string) {
		sleeper = line
		tcancel()
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled tool: %v, want context.Canceled", err)
	}
	if n := ran.Load(); n != 22 {
		t.Fatalf("%d commands went through RunCommand, want 22", n)
	}
	pid, err := strconv.Atoi(sleeper)
	if err != nil {
		t.Fatalf("the tool's sleep: %q", sleeper)
	}
	// The sleep was SIGTERMed with its group: gone, or a zombie the
	// reaper has yet to collect.
	for deadline := time.Now().Add(30 * time.Second); ; {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil || strings.Contains(string(b), ") Z ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cancelled tool's sleep (pid %d) still runs", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestBuildWithoutRuntime: a built-in build needs a runtime to run its
// steps in; without one it fails at once, naming what is missing.
func TestBuildWithoutRuntime(t *testing.T) {
	r := NewRegistry(t.TempDir())
	_, err := r.Build(context.Background(), "base", nil)
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "no runtime to run the recipe's steps in (Registry.Runtime") {
		t.Fatalf("build without a runtime: %v, want ErrUnavailable naming Registry.Runtime", err)
	}
	if _, err := os.Stat(filepath.Join(r.Dir(), "base")); !os.IsNotExist(err) {
		t.Errorf("a build without a runtime left %s (%v)", filepath.Join(r.Dir(), "base"), err)
	}
}
