package e2b

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/lizard-build/lizard/internal/api"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/template"
)

// Tags name builds of a template (E2B's "name:tag"): a build is given the
// tags it was requested with ("default" when none), Template.assignTags
// gives a build more. A template's version is named by the id of the build
// that made it, so a tag names a version. Sandboxes start from a
// template's current version only (its latest build, which "name" alone
// names, not "name:default" as in E2B): a tag naming an earlier build is
// refused at create.

// templateRefs resolves E2B's references to a project's templates.
type templateRefs struct {
	templates Templates
	tags      store.TemplateTags // nil: no tags kept
}

// current returns project's own template name.
func (t templateRefs) current(project, name string) (template.Template, error) {
	ts, err := t.templates.ListFor(project)
	if err != nil {
		return template.Template{}, fmt.Errorf("list templates: %w", err)
	}
	for _, tpl := range ts {
		if tpl.Project == project && tpl.Name == name {
			return tpl, nil
		}
	}
	return template.Template{}, errdefs.WithCode(template.CodeNotFound,
		fmt.Errorf("template %q: no template of that name is built for this project: %w", name, errdefs.ErrNotFound))
}

// tagged returns the build tag names of project's template name.
func (t templateRefs) tagged(ctx context.Context, project, name, tag string) (string, error) {
	if t.tags != nil {
		l, err := t.tags.TemplateTags(ctx, project, name)
		if err != nil {
			return "", err
		}
		for _, tg := range l {
			if tg.Tag == tag {
				return tg.BuildID, nil
			}
		}
	}
	return "", errdefs.WithCode(template.CodeNotFound, fmt.Errorf("template %q has no tag %q: %w", name, tag, errdefs.ErrNotFound))
}

// sandboxTemplate is the lizard template a create's templateID names:
// "name:tag" is name when the tag names its current build.
func (t templateRefs) sandboxTemplate(ctx context.Context, project, ref string) (string, error) {
	name, tag, ok := strings.Cut(ref, ":")
	if !ok {
		return ref, nil
	}
	build, err := t.tagged(ctx, project, name, tag)
	if err != nil {
		return "", err
	}
	cur, err := t.current(project, name)
	if err != nil {
		return "", err
	}
	if cur.Version != build {
		return "", invalid("templateID %q: the tag names build %s, an earlier build than the template's latest (%s): lizard starts sandboxes from a template's latest build; build it again or assign the tag to the latest build",
			ref, build, cur.Version)
	}
	return name, nil
}

// tagsRequest is E2B's AssignTemplateTagsRequest.
type tagsRequest struct {
	Target string   `json:"target"`
	Tags   []string `json:"tags"`
}

// assignedTags is E2B's AssignedTemplateTags.
type assignedTags struct {
	BuildID string   `json:"buildID"`
	Tags    []string `json:"tags"`
}

// tagsOf validates a request's tags.
func tagsOf(tags []string) ([]string, error) {
	if len(tags) == 0 {
		return nil, invalid("tags: at least one tag is required")
	}
	var out []string
	for i, t := range tags {
		t = strings.ToLower(strings.TrimSpace(t))
		if err := checkTag(fmt.Sprintf("tags[%d]", i), t); err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, nil
}

// assignTags serves POST /templates/tags: tags for the build target
// ("name:tag", "name" for its latest build) names.
func (s *buildRoutes) assignTags(w http.ResponseWriter, r *http.Request, p store.Project) error {
	var req tagsRequest
	if err := api.Decode(w, r, maxBody, &req); err != nil {
		return err
	}
	if req.Target == "" {
		return invalid("target: required (the template and the tag of its build, name:tag)")
	}
	name, tag, err := parseName("target", req.Target, p)
	if err != nil {
		return err
	}
	tags, err := tagsOf(req.Tags)
	if err != nil {
		return err
	}
	if s.tags == nil {
		return errdefs.WithCode("feature_unavailable", fmt.Errorf("this server's store keeps no template tags: %w", errdefs.ErrInvalid))
	}
	var build string
	if tag == "" {
		cur, err := s.refs.current(p.ID, name)
		if err != nil {
			return err
		}
		build = cur.Version
	} else if build, err = s.refs.tagged(r.Context(), p.ID, name, tag); err != nil {
		return err
	}
	if err := s.tags.AssignTemplateTags(r.Context(), p.ID, name, build, tags); err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusCreated, assignedTags{BuildID: build, Tags: tags})
	return nil
}

// removeTags serves DELETE /templates/tags.
func (s *buildRoutes) removeTags(w http.ResponseWriter, r *http.Request, p store.Project) error {
	var req struct {
		Name string   `json:"name"`
		Tags []string `json:"tags"`
	}
	if err := api.Decode(w, r, maxBody, &req); err != nil {
		return err
	}
	if req.Name == "" {
		return invalid("name: required (the template's name)")
	}
	name, tag, err := parseName("name", req.Name, p)
	if err != nil {
		return err
	}
	if tag != "" || strings.Contains(req.Name, ":") {
		return invalid("name: %q: give the template's name without a tag, and the tags in tags", req.Name)
	}
	tags, err := tagsOf(req.Tags)
	if err != nil {
		return err
	}
	for i, t := range tags {
		if t == defaultTag {
			return invalid("tags[%d]: the %q tag cannot be removed", i, defaultTag)
		}
	}
	if _, err := s.refs.current(p.ID, name); err != nil {
		return err
	}
	if s.tags != nil {
		if err := s.tags.DeleteTemplateTags(r.Context(), p.ID, name, tags); err != nil {
			return err
		}
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// templateTag is E2B's TemplateTag.
type templateTag struct {
	Tag       string `json:"tag"`
	BuildID   string `json:"buildID"`
	CreatedAt string `json:"createdAt"`
}

// listTags serves GET /templates/{templateID}/tags.
func (s *buildRoutes) listTags(w http.ResponseWriter, r *http.Request, p store.Project) error {
	name := r.PathValue("templateID")
	if _, err := s.refs.current(p.ID, name); err != nil {
		return err
	}
	out := []templateTag{}
	if s.tags != nil {
		l, err := s.tags.TemplateTags(r.Context(), p.ID, name)
		if err != nil {
			return err
		}
		for _, t := range l {
			out = append(out, templateTag{Tag: t.Tag, BuildID: t.BuildID, CreatedAt: t.CreatedAt.UTC().Format(time.RFC3339Nano)})
		}
	}
	api.WriteJSON(w, http.StatusOK, out)
	return nil
}

// deleteTemplate serves DELETE /templates/{templateID}: the project's
// template and its tags go; sandboxes and snapshots of it keep their
// version.
func (s *buildRoutes) deleteTemplate(w http.ResponseWriter, r *http.Request, p store.Project) error {
	name := r.PathValue("templateID")
	if template.IsBuiltin(name) || aliasOf(name) != "" {
		return invalid("templateID %q: a built-in template of lizard cannot be deleted", name)
	}
	if _, err := s.refs.current(p.ID, name); err != nil {
		return err
	}
	if err := s.templates.Delete(r.Context(), p.ID, name); err != nil {
		return err
	}
	if s.tags != nil {
		if err := s.tags.DeleteTemplateTags(r.Context(), p.ID, name, nil); err != nil {
			s.log.Warn("e2b template deleted; its tags were not", "template", name, "err", err)
		}
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
