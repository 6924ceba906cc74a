package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/sandbox/tplpool"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/template"
)

// templatePool is what `lizard template pool` sets: project's pool of
// template at sandboxSize ("" for the server's default size) to size
// sandboxes on each node, 0 removing it.
type templatePool struct {
	project     string // id or slug, as --project gives it
	template    string
	sandboxSize string
	size        int
}

// setTemplatePool runs `lizard template pool`: it checks p (its size, its
// sandbox size, and that project sees its template), records it in st and
// says what it set on w. reg is the template cache of this machine.
func setTemplatePool(ctx context.Context, w io.Writer, st store.Store, reg *template.Registry, p templatePool) error {
	set, err := tplpool.Setting("", p.template, p.sandboxSize, p.size)
	if err != nil {
		return err
	}
	pools, ok := st.(store.TemplatePools)
	if !ok {
		return fmt.Errorf("the %T store keeps no template pools", st)
	}
	proj, err := st.ProjectByRef(ctx, p.project)
	if err != nil {
		return fmt.Errorf("--project %s: %w", p.project, err)
	}
	if err := checkPoolTemplate(ctx, st, reg, proj, set.Template); err != nil {
		return err
	}
	set.ProjectID = proj.ID
	if err := pools.SetTemplatePool(ctx, set); err != nil {
		return err
	}
	what := fmt.Sprintf("pool of %s (%s) for project %s", set.Template, set.SandboxSize, proj.Slug)
	switch p.size {
	case 0:
		fmt.Fprintf(w, "%s removed\n", what)
	case 1:
		fmt.Fprintf(w, "%s: 1 sandbox per node\n", what)
	default:
		fmt.Fprintf(w, "%s: %d sandboxes per node\n", what, p.size)
	}
	return nil
}

// checkPoolTemplate refuses a pool of a template project does not see: a
// built-in one always is (it need not be built yet); one of the project's
// own must be built in reg or published by a node of the cluster
// (store.TemplateVersions). Any other name is ErrNotFound.
func checkPoolTemplate(ctx context.Context, st store.Store, reg *template.Registry, proj store.Project, name string) error {
	if template.IsBuiltin(name) {
		return nil
	}
	preg, err := reg.Project(proj.ID)
	if err != nil {
		return err
	}
	if _, err := preg.Get(name); !errors.Is(err, errdefs.ErrNotFound) {
		return err // built here, or the registry failed
	}
	if recs, ok := st.(store.TemplateVersions); ok {
		if _, err := recs.TemplateVersion(ctx, proj.ID, name); !errors.Is(err, errdefs.ErrNotFound) {
			return err // published by a node, or the store failed
		}
	}
	return fmt.Errorf("template %q not found for project %s: %w", name, proj.Slug, errdefs.ErrNotFound)
}

// listTemplatePools runs `lizard template pools`: the pools of project
// (an id or slug) as a table on w, or every project's when all is set.
func listTemplatePools(ctx context.Context, w io.Writer, st store.Store, project string, all bool) error {
	pools, ok := st.(store.TemplatePools)
	if !ok {
		return fmt.Errorf("the %T store keeps no template pools", st)
	}
	var only string // the project listed; "" with all
	if !all {
		proj, err := st.ProjectByRef(ctx, project)
		if err != nil {
			return fmt.Errorf("--project %s: %w", project, err)
		}
		only = proj.ID
	}
	ps, err := pools.TemplatePools(ctx)
	if err != nil {
		return err
	}
	header := []string{"TEMPLATE", "SANDBOX SIZE", "SIZE", "UPDATED"}
	slugs := map[string]string{} // project id → slug, for --all
	if all {
		header = append([]string{"PROJECT"}, header...)
		projects, err := st.Projects(ctx)
		if err != nil {
			return err
		}
		for _, p := range projects {
			slugs[p.ID] = p.Slug
		}
	}
	rows := [][]string{}
	for _, p := range ps {
		if !all && p.ProjectID != only {
			continue
		}
		row := []string{p.Template, p.SandboxSize, strconv.Itoa(p.Size), fmtTime(&p.UpdatedAt)}
		if all {
			slug, ok := slugs[p.ProjectID]
			if !ok {
				slug = p.ProjectID // a project that is gone
			}
			row = append([]string{slug}, row...)
		}
		rows = append(rows, row)
	}
	if all { // by project slug; the store's order holds within each
		slices.SortStableFunc(rows, func(a, b []string) int { return strings.Compare(a[0], b[0]) })
	}
	return printTable(w, header, rows)
}

// parseTemplatePools reads serve's --template-pool values,
// [PROJECT/]TEMPLATE[:SANDBOX-SIZE]=N, into pool settings: the project (by
// id or slug, "default" when none is named) must exist, the size be known
// and N within 1..tplpool.MaxSize. Whether the template exists is judged
// as the pools fill (a project's template may be built later).
func parseTemplatePools(ctx context.Context, st store.Store, values []string) ([]store.TemplatePool, error) {
	var out []store.TemplatePool
	for _, v := range values {
		p, err := parseTemplatePool(ctx, st, v)
		if err != nil {
			return nil, fmt.Errorf("--template-pool %q: %w", v, err)
		}
		out = append(out, p)
	}
	return out, nil
}

func parseTemplatePool(ctx context.Context, st store.Store, v string) (store.TemplatePool, error) {
	spec, count, ok := strings.Cut(v, "=")
	if !ok {
		return store.TemplatePool{}, fmt.Errorf("want [PROJECT/]TEMPLATE[:SANDBOX-SIZE]=N")
	}
	n, err := strconv.Atoi(strings.TrimSpace(count))
	if err != nil || n < 1 || n > tplpool.MaxSize {
		return store.TemplatePool{}, fmt.Errorf("N %q: must be a number from 1 to %d", count, tplpool.MaxSize)
	}
	projectRef, tpl := "default", spec
	if before, after, ok := strings.Cut(spec, "/"); ok {
		projectRef, tpl = before, after
	}
	tpl, size, _ := strings.Cut(tpl, ":")
	set, err := tplpool.Setting("", tpl, size, n)
	if err != nil {
		return store.TemplatePool{}, err
	}
	p, err := st.ProjectByRef(ctx, projectRef)
	if err != nil {
		return store.TemplatePool{}, fmt.Errorf("project %q: %w", projectRef, err)
	}
	set.ProjectID = p.ID
	return set, nil
}
