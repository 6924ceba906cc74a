package api

import (
	"fmt"
	"net/http"
	"sort"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/template"
)

// Templates is what the API needs of the template registry.
type Templates interface {
	// List returns the built templates.
	List() ([]template.Template, error)
	// Builtins returns the names of the templates the server can build.
	Builtins() []string
}

// Template statuses in the listing.
const (
	templateReady    = "ready"     // built: sandboxes can boot from it
	templateNotBuilt = "not_built" // a built-in not built yet (lizard template build NAME)
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

// listTemplates answers every built template (status "ready") and every
// built-in template not built yet (status "not_built", which sandboxes
// cannot boot from until an operator builds it), sorted by name. Templates
// are the same for every project.
func (s *server) listTemplates(w http.ResponseWriter, r *http.Request, _ store.Project) error {
	if s.templates == nil {
		return fmt.Errorf("this server has no template registry: %w", errdefs.ErrUnavailable)
	}
	built, err := s.templates.List()
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
		if !seen[name] {
			out = append(out, templateInfo{Name: name, Aliases: nonNil(template.AliasesOf(name)), Status: templateNotBuilt})
		}
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

// nonNil makes a nil list a JSON [] instead of null.
func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
