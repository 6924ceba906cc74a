//go:build linux

package template

import (
	"errors"
	"fmt"
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
// the returned file to release it.
func layersShared(layers string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(layers, layersLock), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock the layer cache: %w", err)
	}
	return f, nil
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
	f, err := os.OpenFile(filepath.Join(layers, layersLock), os.O_RDWR|os.O_CREATE, 0o600)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, false, nil // no Dockerfile was ever built
	}
	if err != nil {
		return 0, false, err
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return 0, true, nil
		}
		return 0, false, fmt.Errorf("lock the layer cache: %w", err)
	}
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
