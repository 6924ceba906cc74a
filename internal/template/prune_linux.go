//go:build linux

package template

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// Prune removes the template versions nothing needs any more: every
// directory under <dir>/.v (directories of the older layout that builds
// moved there included) that is not the current version of its name and
// whose rootfs inUse does not claim. inUse is given the rootfs path Get
// returned for the version (absolute, without symbolic links) and must
// report whether a sandbox, snapshot or anything else still uses it.
// Versions of names that no longer exist are removed likewise.
//
// Names whose build lock is held (a build is running, and may be about to
// switch to a version it has just placed) are left alone for a later
// Prune. removed lists the version directories removed; an error does not
// stop the others from being pruned, and err joins them all.
func (r *Registry) Prune(inUse func(rootfs string) bool) (removed []string, err error) {
	if inUse == nil {
		return nil, fmt.Errorf("prune templates: no in-use test: %w", errdefs.ErrInvalid)
	}
	vroot := filepath.Join(r.dir, versionsDir)
	byName, err := versionsByName(vroot)
	if err != nil {
		return nil, fmt.Errorf("prune templates: %w", err)
	}
	if len(byName) == 0 {
		return nil, nil
	}
	// Get's rootfs paths are free of symbolic links; so must be inUse's.
	realRoot, err := filepath.EvalSymlinks(vroot)
	if err != nil {
		return nil, fmt.Errorf("prune templates: %w", err)
	}
	names := make([]string, 0, len(byName))
	for n := range byName {
		names = append(names, n)
	}
	sort.Strings(names)
	var errs []error
	for _, name := range names {
		rm, err := r.pruneName(name, byName[name], realRoot, inUse)
		removed = append(removed, rm...)
		if err != nil {
			errs = append(errs, fmt.Errorf("prune template %q: %w", name, err))
		}
	}
	return removed, errors.Join(errs...)
}

// versionsByName lists the version directories in vroot (<dir>/.v) by the
// name they are versions of. A missing vroot has none.
func versionsByName(vroot string) (map[string][]string, error) {
	ents, err := os.ReadDir(vroot)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	for _, e := range ents {
		name, _, ok := strings.Cut(e.Name(), "@")
		if !e.IsDir() || !ok || !validName(name) {
			continue // not ours: leave it
		}
		out[name] = append(out[name], e.Name())
	}
	return out, nil
}

// pruneName removes the versions (entries of <dir>/.v, whose real path is
// realRoot) of name that are neither current nor in use, unless a build of
// name holds its lock.
func (r *Registry) pruneName(name string, versions []string, realRoot string, inUse func(string) bool) ([]string, error) {
	lock, ok, err := r.tryLock(name)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, nil // a build of name is running
	}
	defer lock.unlock()
	cur, err := r.currentVersion(name, realRoot)
	if err != nil {
		return nil, err // not knowing which is current, remove none
	}
	var removed []string
	var errs []error
	for _, v := range versions {
		if v == cur || inUse(filepath.Join(realRoot, v, rootfsDir)) {
			continue
		}
		vdir := filepath.Join(r.dir, versionsDir, v)
		if err := r.removeTree(vdir); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", vdir, err))
			continue
		}
		removed = append(removed, vdir)
	}
	return removed, errors.Join(errs...)
}

// currentVersion returns the entry of <dir>/.v (whose real path is
// realRoot) that <dir>/<name> points to, or "" when name has no current
// version there: it does not exist, its link dangles, or it is a
// directory of the older layout.
func (r *Registry) currentVersion(name, realRoot string) (string, error) {
	target, err := filepath.EvalSymlinks(filepath.Join(r.dir, name))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("find the current version: %w", err)
	}
	if filepath.Dir(target) != realRoot {
		return "", nil
	}
	return filepath.Base(target), nil
}

// Migrate moves every template directory of the older layout (<dir>/<name>
// holding rootfs and template.json itself) under .v as a version, with
// <dir>/<name> a link to it, so that the rootfs path Get gives names that
// version for good: a sandbox recorded on it keeps its files when the
// template is rebuilt. Names being built are left for a later Migrate. It
// is for a starting server, before it creates sandboxes.
func (r *Registry) Migrate() (migrated []string, err error) {
	ents, err := os.ReadDir(r.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("migrate templates: %w", err)
	}
	var errs []error
	for _, e := range ents {
		name := e.Name()
		if !e.IsDir() || !validName(name) {
			continue // links (the layout of now) and hidden entries
		}
		if _, err := os.Stat(filepath.Join(r.dir, name, metadataFile)); err != nil {
			continue // not a template
		}
		if err := r.migrate(name); err != nil {
			errs = append(errs, fmt.Errorf("migrate template %q: %w", name, err))
			continue
		}
		migrated = append(migrated, name)
	}
	return migrated, errors.Join(errs...)
}

func (r *Registry) migrate(name string) error {
	lock, ok, err := r.tryLock(name)
	if err != nil || !ok {
		return err // a build of it runs: it moves the directory itself
	}
	defer lock.unlock()
	if err := os.MkdirAll(filepath.Join(r.dir, versionsDir), 0o755); err != nil {
		return err
	}
	vdir, err := r.moveLegacy(name)
	if err != nil || vdir == "" {
		return err
	}
	if err := r.switchTo(name, vdir, newReporter(nil, name)); err != nil {
		// Put the directory back where it was.
		if rerr := os.Rename(vdir, filepath.Join(r.dir, name)); rerr != nil {
			return errors.Join(err, rerr)
		}
		return err
	}
	return nil
}
