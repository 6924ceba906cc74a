//go:build linux

package template

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestPruneLayers(t *testing.T) {
	r := NewRegistry(t.TempDir())
	layers := filepath.Join(r.Dir(), ".layers")
	mk := func(name string, age time.Duration) string {
		dir := filepath.Join(layers, name)
		if err := os.MkdirAll(filepath.Join(dir, rootfsDir), 0o755); err != nil {
			t.Fatal(err)
		}
		if name[0] != '.' {
			meta := filepath.Join(dir, "layer.json")
			os.WriteFile(meta, []byte("{}\n"), 0o644)
			at := time.Now().Add(-age)
			os.Chtimes(meta, at, at)
		}
		return dir
	}
	if n, busy, err := r.PruneLayers(time.Hour); n != 0 || busy || err != nil {
		t.Fatalf("no layers yet: %d %v %v", n, busy, err)
	}
	old := mk("old", 48*time.Hour)
	recent := mk("recent", time.Minute)
	used := mk("used", 48*time.Hour)
	half := mk(".tmp-1-abc-", 0)
	touchLayer(used) // a build found it cached

	// While a build holds the cache, nothing goes.
	f, err := layersShared(context.Background(), layers)
	if err != nil {
		t.Fatal(err)
	}
	if n, busy, err := r.PruneLayers(time.Hour); n != 0 || !busy || err != nil {
		t.Fatalf("during a build: %d %v %v, want busy", n, busy, err)
	}
	f.Close()

	n, busy, err := r.PruneLayers(time.Hour)
	if n != 1 || busy || err != nil {
		t.Fatalf("PruneLayers = %d %v %v, want 1 removed", n, busy, err)
	}
	for dir, want := range map[string]bool{old: false, recent: true, used: true, half: false} {
		if _, err := os.Stat(dir); (err == nil) != want {
			t.Errorf("%s: exists %v, want %v", filepath.Base(dir), err == nil, want)
		}
	}
}
