//go:build linux

package template

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Dockerfile layers are kept for the next build's cache, and go once no
// build has used them for a while (LayerTTL): a build marks each layer it
// makes or finds cached by touching its layer.json. Templates are hard-linked
// copies of their last layer, so removing a layer never touches a template.
//
// Every Dockerfile build holds <dir>/.layers/.lock shared for as long as it
// runs; PruneLayers takes it exclusively, without waiting, so it never
// removes a layer a build is about to copy from.

// LayerTTL is how long a Dockerfile layer no build used is kept.
const LayerTTL = 7 * 24 * time.Hour

const layersLock = ".lock"

// layersShared takes the layers lock shared (for a build); the caller closes
// the returned file to release it. PruneLayers holds it only briefly.
func layersShared(ctx context.Context, layers string) (*os.File, error) {
	return flock(ctx, filepath.Join(layers, layersLock), syscall.LOCK_SH, nil)
}

// touchLayer records that a build used layer dir now.
func touchLayer(dir string) {
	now := time.Now()
	os.Chtimes(filepath.Join(dir, "layer.json"), now, now)
}

// PruneLayers removes the Dockerfile layers no build has used for unusedFor,
// and what builds cut short left half-made, and returns how many layers.
// While any build runs it removes nothing (and says so with busy).
func (r *Registry) PruneLayers(unusedFor time.Duration) (removed int, busy bool, err error) {
	layers := filepath.Join(r.dir, ".layers")
	f, ok, err := tryFlock(filepath.Join(layers, layersLock), syscall.LOCK_EX)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, false, nil // no Dockerfile was ever built
	}
	if err != nil {
		return 0, false, err
	}
	if !ok {
		return 0, true, nil
	}
	defer f.Close()
	ents, err := os.ReadDir(layers)
	if err != nil {
		return 0, false, err
	}
	cutoff := time.Now().Add(-unusedFor)
	var errs []error
	for _, e := range ents {
		dir := filepath.Join(layers, e.Name())
		if strings.HasPrefix(e.Name(), ".tmp-") {
			os.RemoveAll(dir) // no build runs: nobody is making it
			continue
		}
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		fi, err := os.Stat(filepath.Join(dir, "layer.json"))
		if err == nil && fi.ModTime().After(cutoff) {
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, err)
			continue
		}
		removed++
	}
	return removed, false, errors.Join(errs...)
}
