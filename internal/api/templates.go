package api

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/template"
	"github.com/lizard-build/lizard/internal/tmplqueue"
)

// Templates is what the API needs of the template registry.
type Templates interface {
	// ListFor returns the built templates project sees: the built-in ones
	// and its own.
	ListFor(project string) ([]template.Template, error)
	// Builtins returns the names of the templates the server can build.
	Builtins() []string
	// Delete removes project's template name (not a built-in one); its
	// versions stay while sandboxes or snapshots use them.
	Delete(ctx context.Context, project, name string) error
}

// Template statuses in the listing.
const (
	templateReady    = "ready"     // built: sandboxes can boot from it
	templateNotBuilt = "not_built" // a built-in not built yet (lizard template build NAME)
	// A built-in the server builds in the background (--build-templates)
	// is tmplqueue.Queued, Building or Failed instead.
)

// templateInfo is one entry of GET /api/templates.
type templateInfo struct {
	Name    string   `json:"name"`
	Aliases []string `json:"aliases"`
	// Version identifies the build ("" when not built); Versions are the
	// versions of the software in it ("python", "node", "debian", ...).
	Version   string            `json:"version"`
	Versions  map[string]string `json:"versions"`
	SizeBytes int64             `json:"sizeBytes"`
	BuiltAt   *string           `json:"builtAt"`
	Status    string            `json:"status"`
	// StartCommand runs in every sandbox of the template from its ready
	// state; ReadyCommand says when it is ready (omitted when none).
	StartCommand []string `json:"startCommand,omitempty"`
	ReadyCommand []string `json:"readyCommand,omitempty"`
	// Progress is the last line of a background build (status building)
	// or its error (build_failed).
	Progress string `json:"progress,omitempty"`
}

// templateOf is a built template's entry.
func templateOf(t template.Template) templateInfo {
	at := t.BuiltAt.UTC().Format(time.RFC3339)
	info := templateInfo{
		Name: t.Name, Aliases: nonNil(t.Aliases), Version: t.Version, Versions: t.Versions,
		SizeBytes: t.SizeBytes, BuiltAt: &at, Status: templateReady,
		StartCommand: t.StartCommand, ReadyCommand: t.ReadyCommand,
	}
	if info.Versions == nil {
		info.Versions = map[string]string{}
	}
	return info
}

// templateRoutes serve GET /api/templates and DELETE /api/templates/{name}.
type templateRoutes struct {
	templates Templates
	// builds is the background builds' state of a template (nil: none).
	builds func(name string) (tmplqueue.Status, bool)
}

// listTemplates answers every built template (status "ready") and every
// built-in template not built yet (status "not_built", which sandboxes
// cannot boot from until an operator builds it), sorted by name: the
// built-in templates and the caller's project's own.
func (s templateRoutes) listTemplates(w http.ResponseWriter, r *http.Request, p store.Project) error {
	if s.templates == nil {
		return fmt.Errorf("this server has no template registry: %w", errdefs.ErrUnavailable)
	}
	built, err := s.templates.ListFor(p.ID)
	if err != nil {
		return err
	}
	out := []templateInfo{}
	seen := map[string]bool{}
	for _, t := range built {
		out = append(out, templateOf(t))
		seen[t.Name] = true
	}
	for _, name := range s.templates.Builtins() {
		if seen[name] {
			continue
		}
		info := templateInfo{Name: name, Aliases: nonNil(template.AliasesOf(name)), Status: templateNotBuilt}
		if s.builds != nil {
			if st, ok := s.builds(name); ok {
				info.Status, info.Progress = st.State, st.Progress
			}
		}
		out = append(out, info)
	}
	for i := range out {
		if out[i].Versions == nil {
			out[i].Versions = map[string]string{}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	writeJSON(w, http.StatusOK, out)
	return nil
}

// deleteTemplate removes one of the caller's templates. Sandboxes and
// snapshots of it keep running on the version they started with.
func (s templateRoutes) deleteTemplate(w http.ResponseWriter, r *http.Request, p store.Project) error {
	if s.templates == nil {
		return fmt.Errorf("this server has no template registry: %w", errdefs.ErrUnavailable)
	}
	if err := s.templates.Delete(r.Context(), p.ID, r.PathValue("name")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// nonNil makes a nil list a JSON [] instead of null.
func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
