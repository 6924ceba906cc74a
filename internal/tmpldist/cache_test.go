package tmpldist

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/template"
)

// fakeVersion makes version n of template name in the registry at dir
// (a rootfs with one file, template.json) and makes it current; it
// returns the version's directory.
func fakeVersion(t *testing.T, dir, name string, n int) string {
	t.Helper()
	digest := "sha256:" + strings.Repeat(string(rune('0'+n)), 64)
	vdir := filepath.Join(dir, ".v", name+"@"+strings.Replace(digest, ":", "-", 1))
	if err := os.MkdirAll(filepath.Join(vdir, "rootfs", "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(vdir, "rootfs", "etc", "hostname"), []byte(name), 0o644); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(map[string]any{"name": name, "version": "v", "digest": digest, "size_bytes": 100, "built_at": time.Now()})
	if err := os.WriteFile(filepath.Join(vdir, "template.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, name)
	os.Remove(link)
	if err := os.Symlink(filepath.Join(".v", filepath.Base(vdir)), link); err != nil {
		t.Fatal(err)
	}
	return vdir
}

// TestCacheLRU: over its bound, the cache evicts fetched versions least
// recently used first, through the registry (the name goes with its
// current version); never one in use nor the one kept; the index outlives
// a reopen.
func TestCacheLRU(t *testing.T) {
	dir := t.TempDir()
	reg := template.NewRegistry(dir)
	index := filepath.Join(t.TempDir(), "cache.json")
	c, err := openCache(index, 250)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	dirs := map[string]string{}
	for i, name := range []string{"old", "busy", "mid", "new"} {
		dirs[name] = fakeVersion(t, dir, name, i+1)
		if err := c.add(cacheEntry{Name: name, Dir: dirs[name], Size: 100, LastUsed: t0.Add(time.Duration(i) * time.Minute)}); err != nil {
			t.Fatal(err)
		}
	}
	// "mid" is used again: now more recent than "new".
	c.touch(dirs["mid"], t0.Add(time.Hour))
	inUse := map[string]bool{filepath.Join(dirs["busy"], "rootfs"): true}
	evict := func(e cacheEntry) (bool, error) {
		return reg.Evict(e.Name, e.Dir, func(rootfs string) bool { return inUse[rootfs] })
	}
	// 400 bytes against 250: "old" goes (least recently used), "busy" is
	// in use, then "new" (used before "mid").
	gone, err := c.evict("", evict)
	if err != nil {
		t.Fatal(err)
	}
	if names := entryNames(gone); names != "old,new" {
		t.Fatalf("evicted %q, want old,new", names)
	}
	for _, name := range []string{"old", "new"} {
		if _, err := os.Stat(dirs[name]); !os.IsNotExist(err) {
			t.Fatalf("version of %s still there after eviction: %v", name, err)
		}
		if _, err := reg.Get(name); err == nil {
			t.Fatalf("template %s still held after its current version was evicted", name)
		}
	}
	for _, name := range []string{"busy", "mid"} {
		if _, err := reg.Get(name); err != nil {
			t.Fatalf("template %s: %v", name, err)
		}
	}
	if c.total() != 200 {
		t.Fatalf("total %d after eviction, want 200", c.total())
	}

	// Reopened with a smaller bound: "busy" is still in use and "mid" is
	// kept (a create is about to use it): nothing goes.
	c2, err := openCache(index, 50)
	if err != nil {
		t.Fatal(err)
	}
	if c2.total() != 200 || !c2.has(dirs["busy"]) || !c2.has(dirs["mid"]) || c2.has(dirs["old"]) {
		t.Fatalf("reopened index: total %d, entries %v", c2.total(), c2.entries)
	}
	if gone, err := c2.evict(dirs["mid"], evict); err != nil || len(gone) != 0 {
		t.Fatalf("evicted %v (%v), want none: in use or kept", entryNames(gone), err)
	}
	// Once nothing uses it, "busy" goes.
	delete(inUse, filepath.Join(dirs["busy"], "rootfs"))
	if gone, err := c2.evict(dirs["mid"], evict); err != nil || entryNames(gone) != "busy" {
		t.Fatalf("evicted %v (%v), want busy", entryNames(gone), err)
	}
	if _, err := reg.Get("mid"); err != nil {
		t.Fatalf("kept template mid: %v", err)
	}
	// No bound: nothing is evicted.
	c3, _ := openCache(index, 0)
	if gone, _ := c3.evict("", evict); len(gone) != 0 {
		t.Fatalf("evicted %v without a bound", entryNames(gone))
	}
}

// A version that is not its name's current one is evicted without
// touching the name.
func TestEvictOldVersion(t *testing.T) {
	dir := t.TempDir()
	reg := template.NewRegistry(dir)
	old := fakeVersion(t, dir, "web", 1)
	cur := fakeVersion(t, dir, "web", 2)
	ok, err := reg.Evict("web", old, func(string) bool { return false })
	if err != nil || !ok {
		t.Fatalf("evict: %v %v", ok, err)
	}
	got, err := reg.Get("web")
	if err != nil || filepath.Dir(got.Rootfs) != cur {
		t.Fatalf("current version after evicting the old one: %+v %v", got, err)
	}
}

func entryNames(es []cacheEntry) string {
	var s []string
	for _, e := range es {
		s = append(s, e.Name)
	}
	return strings.Join(s, ",")
}
