package template

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// Templates belong to projects. The built-in templates (see Builtins) live
// at the top of the registry directory, as they always did, and every
// project sees them; they are read-only to projects. A project's own
// templates (Dockerfile builds) live in a registry of their own,
// <dir>/.projects/<project id>, laid out like the top one (versions, locks,
// layer cache), so two projects may each have a template "myapp":
//
//	<dir>/base                          a built-in (link to .v/base@…)
//	<dir>/.projects/<project>/myapp     a project's template (link to its .v/myapp@…)
//	<dir>/.projects/<project>/.layers   the project's Dockerfile layer cache
//
// Keeping the layer caches apart means one project's RUN output is never
// another's cache hit.

const projectsDir = ".projects"

// IsBuiltin reports whether name (or alias) is a built-in template, built
// or derived (derived.go).
func IsBuiltin(name string) bool {
	_, ok := builtins[Resolve(name)]
	_, d := derived[Resolve(name)]
	return ok || d
}

// Project returns the registry of project's own templates. Its Get, List,
// BuildDockerfile, Remove, Prune and PruneLayers work on that project's
// templates alone; a Dockerfile built there may start FROM a built-in
// template or one of the project's own.
func (r *Registry) Project(project string) (*Registry, error) {
	if !validName(project) {
		return nil, fmt.Errorf("project %q: not a valid project id: %w", project, errdefs.ErrInvalid)
	}
	top := r.top()
	return &Registry{
		dir: filepath.Join(top.dir, projectsDir, project), Mirror: top.Mirror, Debootstrap: top.Debootstrap, RunCommand: top.RunCommand,
		parent: top, project: project,
	}, nil
}

// top is the registry holding the built-in templates: r itself, or the
// registry r is a project's part of.
func (r *Registry) top() *Registry {
	if r.parent != nil {
		return r.parent
	}
	return r
}

// ProjectID is the project whose templates r holds; "" for the top registry.
func (r *Registry) ProjectID() string { return r.project }

// Lookup returns template name as project sees it: a built-in one (or an
// alias), else the project's own. Another project's template is not found.
func (r *Registry) Lookup(project, name string) (Template, error) {
	if IsBuiltin(name) {
		return r.top().Get(name)
	}
	p, err := r.Project(project)
	if err != nil {
		return Template{}, notFound(name, "")
	}
	return p.Get(name)
}

// LookupVersion returns the version with digest of template name (not an
// alias) as project sees it, current or not: errdefs.ErrNotFound when this
// node holds no such version.
func (r *Registry) LookupVersion(project, name, digest string) (Template, error) {
	reg, err := r.For(project, name)
	if err != nil {
		return Template{}, notFound(name, "")
	}
	v, err := reg.ByDigest(name, digest)
	if err != nil {
		return Template{}, err
	}
	return reg.read(name, v.Dir)
}

// For is the registry that holds template name as project sees it: the
// top one for a built-in template, else the project's.
func (r *Registry) For(project, name string) (*Registry, error) {
	if IsBuiltin(name) {
		return r.top(), nil
	}
	return r.Project(project)
}

// Delete removes project's template name (see Remove).
func (r *Registry) Delete(ctx context.Context, project, name string) error {
	if IsBuiltin(name) {
		return fmt.Errorf("template %q is a built-in template; it cannot be removed: %w", name, errdefs.ErrPermission)
	}
	p, err := r.Project(project)
	if err != nil {
		return err
	}
	return p.Remove(ctx, name)
}

// ListFor returns the built templates project sees, sorted by name: the
// built-in ones and its own.
func (r *Registry) ListFor(project string) ([]Template, error) {
	out, err := r.builtinsBuilt()
	if err != nil {
		return nil, err
	}
	p, err := r.Project(project)
	if err != nil {
		return nil, err
	}
	own, err := p.List()
	if err != nil {
		return nil, err
	}
	out = append(out, own...)
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// ListAll returns the built built-in templates and every project's own
// templates (Template.Project tells whose).
func (r *Registry) ListAll() ([]Template, error) {
	out, err := r.builtinsBuilt()
	if err != nil {
		return nil, err
	}
	ps, err := r.Projects()
	if err != nil {
		return nil, err
	}
	for _, p := range ps {
		own, err := p.List()
		if err != nil {
			return nil, err
		}
		out = append(out, own...)
	}
	return out, nil
}

// builtinsBuilt lists the built-in templates that are built. Templates of
// other names at the top of the directory (custom templates from before
// templates belonged to projects, until MigrateCustom moves them) are
// nobody's.
func (r *Registry) builtinsBuilt() ([]Template, error) {
	all, err := r.top().List()
	if err != nil {
		return nil, err
	}
	out := []Template{}
	for _, t := range all {
		if IsBuiltin(t.Name) {
			out = append(out, t)
		}
	}
	return out, nil
}

// Projects returns the registries of the projects that have a directory of
// templates, sorted by project.
func (r *Registry) Projects() ([]*Registry, error) {
	ents, err := os.ReadDir(filepath.Join(r.top().dir, projectsDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list project templates: %w", err)
	}
	var out []*Registry
	for _, e := range ents {
		if !e.IsDir() || !validName(e.Name()) {
			continue
		}
		p, err := r.Project(e.Name())
		if err != nil {
			continue
		}
		out = append(out, p)
	}
	return out, nil
}

// All returns the top registry and every project's, for what runs over
// all of them (Prune, PruneLayers).
func (r *Registry) All() ([]*Registry, error) {
	ps, err := r.Projects()
	if err != nil {
		return nil, err
	}
	return append([]*Registry{r.top()}, ps...), nil
}
