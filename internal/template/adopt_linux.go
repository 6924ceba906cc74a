//go:build linux

package template

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// AdoptVersion makes the version of template name with digest, made on
// another node, the current version of name in r. Unless r holds that
// version already, populate fills a new build directory of r with the
// version's files (rootfs, template.json, manifest), which must then prove
// to be that version (its metadata names digest, the manifest and the
// metadata give digest, the rootfs matches the manifest) before it is
// placed: a copy that does not is removed and is errdefs.ErrInvalid
// naming the first difference. Builds and adoptions of name are
// serialized by its build lock.
func (r *Registry) AdoptVersion(ctx context.Context, name, digest string, populate func(dir string) error) (Template, error) {
	if _, err := r.placeVersion(ctx, name, digest, populate, true); err != nil {
		return Template{}, err
	}
	return r.Get(name)
}

// AddVersion places the version of template name with digest, made on
// another node, in r beside its current version, which stays current:
// for a sandbox or snapshot recorded on that version that moves here. It
// is checked as AdoptVersion's are, and is pruned (Prune) once nothing
// uses it.
func (r *Registry) AddVersion(ctx context.Context, name, digest string, populate func(dir string) error) (Template, error) {
	v, err := r.placeVersion(ctx, name, digest, populate, false)
	if err != nil {
		return Template{}, err
	}
	return r.read(name, v.Dir)
}

// placeVersion places version digest of name (populate fills it unless r
// holds it), under name's build lock, and makes it current if current.
func (r *Registry) placeVersion(ctx context.Context, name, digest string, populate func(dir string) error, current bool) (Version, error) {
	if !validName(name) || !validDigest(digest) {
		return Version{}, fmt.Errorf("adopt template %q version %q: not a template name and digest: %w", name, digest, errdefs.ErrInvalid)
	}
	if err := os.MkdirAll(r.dir, 0o755); err != nil {
		return Version{}, fmt.Errorf("make template directory: %w", err)
	}
	rep := newReporter(nil, name)
	lock, err := r.lock(ctx, name, rep)
	if err != nil {
		return Version{}, err
	}
	defer lock.unlock()
	r.removeStale(name, rep)
	v, err := r.ByDigest(name, digest)
	if errors.Is(err, errdefs.ErrNotFound) {
		v.Dir, err = r.adopt(name, digest, populate)
	}
	if err != nil {
		return Version{}, err
	}
	if current {
		if err := r.switchTo(name, v.Dir, rep); err != nil {
			return Version{}, err
		}
	}
	return v, nil
}

// adopt fills a new build directory with populate, checks it is version
// digest of name, and moves it under .v.
func (r *Registry) adopt(name, digest string, populate func(dir string) error) (string, error) {
	vroot := filepath.Join(r.dir, versionsDir)
	if err := os.MkdirAll(vroot, 0o755); err != nil {
		return "", fmt.Errorf("make versions directory: %w", err)
	}
	tmp, err := reserveDir(r.dir, ".build-"+name+"-")
	if err != nil {
		return "", err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		os.Remove(tmp)
		return "", err
	}
	err = populate(tmp)
	if err == nil {
		err = verifyCopy(name, digest, tmp)
	}
	if err != nil {
		if rerr := r.removeTree(tmp); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return "", err
	}
	vdir := filepath.Join(vroot, name+"@"+dirDigest(digest))
	if err := syscall.Rename(tmp, vdir); err != nil {
		r.removeTree(tmp)
		return "", fmt.Errorf("move adopted version into place: rename %s %s: %w", tmp, vdir, err)
	}
	syncDir(vroot)
	return vdir, nil
}

// verifyCopy checks that dir holds version digest of template name (see
// VerifyVersion, which also checks the directory's name).
func verifyCopy(name, digest, dir string) error {
	m, err := readMetadata(name, dir)
	if err != nil {
		return fmt.Errorf("copy of template %q %s: %v: %w", name, digest, err, errdefs.ErrInvalid)
	}
	if m.Digest != digest {
		return fmt.Errorf("copy of template %q %s: its metadata names digest %q: %w", name, digest, m.Digest, errdefs.ErrInvalid)
	}
	stored, err := os.ReadFile(filepath.Join(dir, manifestFile))
	if err != nil {
		return fmt.Errorf("copy of template %q %s: %v: %w", name, digest, err, errdefs.ErrInvalid)
	}
	if d := digestOf(stored, m); d != digest {
		return fmt.Errorf("copy of template %q %s: its manifest and metadata give digest %s: %w", name, digest, d, errdefs.ErrInvalid)
	}
	return verifyRootfs(dir, stored)
}

// Evict removes version directory vdir of template name from r unless
// inUse says a sandbox or snapshot uses its rootfs: when it is name's
// current version the name goes first (r no longer holds the template),
// then the version. evicted is false when it is in use or a build of name
// holds its lock (try again later).
func (r *Registry) Evict(name, vdir string, inUse func(rootfs string) bool) (evicted bool, err error) {
	real, err := filepath.EvalSymlinks(vdir)
	if errors.Is(err, fs.ErrNotExist) {
		return true, nil // gone already
	}
	if err != nil {
		return false, err
	}
	if inUse(filepath.Join(real, rootfsDir)) {
		return false, nil
	}
	lock, ok, err := r.tryLock(name)
	if err != nil || !ok {
		return false, err
	}
	defer lock.unlock()
	link := filepath.Join(r.dir, name)
	if cur, err := filepath.EvalSymlinks(link); err == nil && cur == real {
		if err := os.Remove(link); err != nil {
			return false, fmt.Errorf("evict template %q: %w", name, err)
		}
		syncDir(r.dir)
	}
	if err := r.removeTree(filepath.Join(r.dir, versionsDir, filepath.Base(real))); err != nil {
		return false, fmt.Errorf("evict template %q: %w", name, err)
	}
	return true, nil
}
