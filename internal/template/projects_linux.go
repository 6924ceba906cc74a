//go:build linux

package template

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// Remove removes template name of a project's registry: the name goes at
// once, its versions stay for the sandboxes and snapshots that run on them
// until Prune finds them unused. A build of name under way is waited for.
// Built-in templates cannot be removed this way.
func (r *Registry) Remove(ctx context.Context, name string) error {
	if r.parent == nil || IsBuiltin(name) {
		return fmt.Errorf("template %q is a built-in template; it cannot be removed: %w", name, errdefs.ErrPermission)
	}
	if !validName(name) {
		return notFound(name, "")
	}
	if _, err := r.Get(name); err != nil {
		return err
	}
	lock, err := r.lock(ctx, name, newReporter(nil, name))
	if err != nil {
		return err
	}
	defer lock.unlock()
	link := filepath.Join(r.dir, name)
	fi, err := os.Lstat(link)
	if errors.Is(err, fs.ErrNotExist) {
		return notFound(name, "")
	}
	if err != nil {
		return fmt.Errorf("remove template %q: %w", name, err)
	}
	if fi.Mode()&fs.ModeSymlink == 0 {
		// A directory of the older layout: make it a version first, so
		// that it goes the way versions go.
		if _, err := r.moveLegacy(name); err != nil {
			return fmt.Errorf("remove template %q: %w", name, err)
		}
		return nil
	}
	if err := os.Remove(link); err != nil {
		return fmt.Errorf("remove template %q: %w", name, err)
	}
	syncDir(r.dir)
	return nil
}

// MigrateCustom gives project every template at the top of the registry
// that is not a built-in one: templates built before templates belonged to
// projects. The project gets a new version of each, a hard-linked copy of
// the current one (template files are never written in place), and the
// top-level name goes; the old versions stay where sandboxes and snapshots
// recorded them until Prune finds them unused. Names being built are left
// for a later call. It is for a starting server, after Migrate.
func (r *Registry) MigrateCustom(project string) (migrated []string, err error) {
	top := r.top()
	p, err := top.Project(project)
	if err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(top.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("migrate custom templates: %w", err)
	}
	var errs []error
	for _, e := range ents {
		name := e.Name()
		if e.Type()&fs.ModeSymlink == 0 || !validName(name) || IsBuiltin(name) {
			continue
		}
		ok, err := top.migrateCustom(p, name)
		if err != nil {
			errs = append(errs, fmt.Errorf("migrate template %q to project %s: %w", name, project, err))
			continue
		}
		if ok {
			migrated = append(migrated, name)
		}
	}
	return migrated, errors.Join(errs...)
}

func (r *Registry) migrateCustom(p *Registry, name string) (bool, error) {
	lock, ok, err := r.tryLock(name)
	if err != nil || !ok {
		return false, err // a build of it runs: a later start moves it
	}
	defer lock.unlock()
	vdir, err := filepath.EvalSymlinks(filepath.Join(r.dir, name))
	if err != nil {
		return false, nil // dangling: not a template
	}
	m, err := readMetadata(name, vdir)
	if err != nil {
		return false, nil // not a template
	}
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		return false, err
	}
	plock, err := p.lock(context.Background(), name, newReporter(nil, name))
	if err != nil {
		return false, err
	}
	defer plock.unlock()
	// A start cut short after the copy: the project has it already.
	if _, err := p.Get(name); err != nil {
		tmp, err := os.MkdirTemp(p.dir, ".build-"+name+"-")
		if err != nil {
			return false, err
		}
		cp := exec.Command("cp", "-a", "--link", filepath.Join(vdir, rootfsDir), filepath.Join(tmp, rootfsDir))
		if out, err := cp.CombinedOutput(); err != nil {
			p.removeTree(tmp)
			return false, fmt.Errorf("copy %s: %v: %s", vdir, err, strings.TrimSpace(string(out)))
		}
		if err := os.Chmod(tmp, 0o755); err != nil {
			p.removeTree(tmp)
			return false, err
		}
		if err := writeMetadata(tmp, m); err != nil {
			p.removeTree(tmp)
			return false, err
		}
		if err := p.install(name, tmp, newReporter(nil, name)); err != nil {
			p.removeTree(tmp)
			return false, err
		}
	}
	if err := os.Remove(filepath.Join(r.dir, name)); err != nil {
		return false, err
	}
	syncDir(r.dir)
	return true, nil
}
