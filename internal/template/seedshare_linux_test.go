package template

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// The real builds share one debootstrap: TestBuildBaseReal's first build
// keeps its debootstrapped tree as a seed (Registry.SeedMaxAge) and hands
// it to sharedSeeds (and checks that debootstrap's second stage ran in a
// container); tests that are about what comes after debootstrap (apt-get's
// failure, a cancel during apt-get, where the recipe's steps run) start
// from a copy of it instead of debootstrapping again (minutes each on a
// slow machine). Run alone, such a test debootstraps as before.
var sharedSeeds string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "lizard-template-seeds-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sharedSeeds = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// shareSeeds copies r's seeds to sharedSeeds.
func shareSeeds(t *testing.T, r *Registry) {
	t.Helper()
	src := filepath.Join(r.Dir(), seedsDir)
	ents, err := os.ReadDir(src)
	if err != nil || len(ents) == 0 {
		t.Fatalf("no seed kept in %s: %v", src, err)
	}
	if err := copyTree(context.Background(), nil, src, sharedSeeds); err != nil {
		t.Fatalf("share the seeds: %v", err)
	}
}

// useSharedSeeds gives r a copy of the shared seeds and a SeedMaxAge, so
// that its builds of built-in templates start from the tree an earlier test
// debootstrapped; without shared seeds r is left as it is. It reports
// whether r got any.
func useSharedSeeds(t *testing.T, r *Registry) bool {
	t.Helper()
	ents, err := os.ReadDir(sharedSeeds)
	if err != nil || len(ents) == 0 {
		t.Logf("no shared debootstrap seed (run with TestBuildBaseReal for one): this build debootstraps")
		return false
	}
	dst := filepath.Join(r.Dir(), seedsDir)
	if err := os.MkdirAll(dst, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := copyTree(context.Background(), nil, sharedSeeds, dst); err != nil {
		t.Fatalf("copy the shared seeds: %v", err)
	}
	r.SeedMaxAge = time.Hour
	return true
}
