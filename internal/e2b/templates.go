package e2b

import (
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/lizard-build/lizard/internal/api"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/template"
)

// templateInfo is E2B's Template.
type templateInfo struct {
	TemplateID    string   `json:"templateID"`
	BuildID       string   `json:"buildID"`
	CPUCount      int      `json:"cpuCount"`
	MemoryMB      int64    `json:"memoryMB"`
	DiskSizeMB    int64    `json:"diskSizeMB"`
	Public        bool     `json:"public"`
	Aliases       []string `json:"aliases"`
	Names         []string `json:"names"`
	CreatedAt     string   `json:"createdAt"`
	UpdatedAt     string   `json:"updatedAt"`
	CreatedBy     *string  `json:"createdBy"`
	LastSpawnedAt *string  `json:"lastSpawnedAt"`
	SpawnCount    int64    `json:"spawnCount"`
	BuildCount    int      `json:"buildCount"`
	EnvdVersion   string   `json:"envdVersion"`
	BuildStatus   string   `json:"buildStatus"`
}

// listTemplates answers the built templates the project sees; E2B's names of lizard's
// templates (code-interpreter-v1) are among their aliases.
func (s *server) listTemplates(w http.ResponseWriter, r *http.Request, p store.Project) error {
	ts, err := s.templates.ListFor(p.ID)
	if err != nil {
		return fmt.Errorf("list templates: %w", err)
	}
	size, err := sandbox.LookupSize(sandboxSize)
	if err != nil {
		return err
	}
	out := []templateInfo{}
	for _, t := range ts {
		names := namesOf(t)
		at := t.BuiltAt.UTC().Format(time.RFC3339)
		out = append(out, templateInfo{
			TemplateID: t.Name, BuildID: t.Version, CPUCount: int(size.CPUs + 0.999), MemoryMB: size.MemoryMB,
			DiskSizeMB: t.SizeBytes >> 20, Public: true, Aliases: names, Names: names, CreatedAt: at, UpdatedAt: at,
			BuildCount: 1, EnvdVersion: EnvdVersion, BuildStatus: "ready",
		})
	}
	api.WriteJSON(w, http.StatusOK, out)
	return nil
}

// namesOf are the names a template answers to here: its own, its lizard
// aliases (python312) and its E2B name, when it has one.
func namesOf(t template.Template) []string {
	names := append([]string{t.Name}, t.Aliases...)
	if a := aliasOf(t.Name); a != "" {
		names = append(names, a)
	}
	return names
}

// aliasInfo is E2B's TemplateAliasResponse.
type aliasInfo struct {
	TemplateID string `json:"templateID"`
	Public     bool   `json:"public"`
}

// templateAlias answers GET /templates/aliases/{alias}, what the SDKs'
// Template.exists asks: 200 for a built template the project can create
// sandboxes from (a built-in one, public, or its own), 404 otherwise. E2B
// answers 403 for another team's template, which the SDK counts as
// existing; here another project's templates are not to be seen at all.
func (s *server) templateAlias(w http.ResponseWriter, r *http.Request, p store.Project) error {
	alias := r.PathValue("alias")
	ts, err := s.templates.ListFor(p.ID)
	if err != nil {
		return fmt.Errorf("list templates: %w", err)
	}
	for _, t := range ts {
		if slices.Contains(namesOf(t), alias) {
			api.WriteJSON(w, http.StatusOK, aliasInfo{TemplateID: t.Name, Public: t.Project == ""})
			return nil
		}
	}
	return fmt.Errorf("template %q: no template of that name or alias is built for this project: %w", alias, errdefs.ErrNotFound)
}

// templateNamed is the built template the project sees that answers to
// name (namesOf).
func templateNamed(ts Templates, projectID, name string) (template.Template, bool, error) {
	all, err := ts.ListFor(projectID)
	if err != nil {
		return template.Template{}, false, fmt.Errorf("list templates: %w", err)
	}
	for _, t := range all {
		if slices.Contains(namesOf(t), name) {
			return t, true, nil
		}
	}
	return template.Template{}, false, nil
}
