package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// TemplateVersion records which version of a template is current
// cluster-wide: the version a node built and published to the object store
// (package tmpldist), which other nodes fetch on first use.
type TemplateVersion struct {
	// ProjectID is the project the template belongs to; "" for a built-in
	// template.
	ProjectID string
	Name      string
	// Digest is the version's content digest ("sha256:<hex>"), which names
	// it in the object store and on every node.
	Digest string
	// Info is the template's metadata as a node lists it (JSON), so that
	// any node lists a template it does not hold.
	Info json.RawMessage
	// Node is the node that published it.
	Node      string
	UpdatedAt time.Time
}

// TemplateVersions is the part of the store that records published
// template versions; both backends implement it.
type TemplateVersions interface {
	// PutTemplateVersion records v as the current version of its name,
	// replacing the record there.
	PutTemplateVersion(ctx context.Context, v TemplateVersion) error
	// TemplateVersion returns the record of project's template name;
	// none is ErrNotFound.
	TemplateVersion(ctx context.Context, projectID, name string) (TemplateVersion, error)
	// TemplateVersions lists the records of project's templates, by name.
	TemplateVersions(ctx context.Context, projectID string) ([]TemplateVersion, error)
	// DeleteTemplateVersion removes a record; a missing one is not an
	// error.
	DeleteTemplateVersion(ctx context.Context, projectID, name string) error
}

// TemplateVersionNotFound is the error for a template without a record.
func TemplateVersionNotFound(projectID, name string) error {
	return fmt.Errorf("template %q of project %q has no published version: %w", name, projectID, errdefs.ErrNotFound)
}

// InfoOrEmpty is info, or an empty JSON object for none (what backends
// store).
func InfoOrEmpty(info json.RawMessage) json.RawMessage {
	if len(info) == 0 {
		return json.RawMessage(`{}`)
	}
	return info
}

// TemplateTag is one tag of a template: a name for one of its builds, as
// E2B's API gives them (internal/e2b: "name:tag").
type TemplateTag struct {
	ProjectID string
	Template  string
	Tag       string
	// BuildID is the build the tag names (the template version's name).
	BuildID   string
	CreatedAt time.Time
}

// TemplateTags is the part of the store that keeps templates' tags; both
// backends implement it.
type TemplateTags interface {
	// AssignTemplateTags makes each of tags of project's template name
	// buildID, replacing what it named; its CreatedAt is now.
	AssignTemplateTags(ctx context.Context, projectID, template, buildID string, tags []string) error
	// TemplateTags lists the tags of project's template, by tag ([] for
	// none).
	TemplateTags(ctx context.Context, projectID, template string) ([]TemplateTag, error)
	// DeleteTemplateTags removes tags of project's template, every tag of
	// it when tags is nil; a tag that is not there is not an error.
	DeleteTemplateTags(ctx context.Context, projectID, template string, tags []string) error
}

// TemplatePool is a project's warm pool setting for one of the templates
// it sees (a built-in one or its own) at one sandbox size: every node keeps
// Size sandboxes of it booted for the project's creates.
type TemplatePool struct {
	ProjectID   string
	Template    string
	SandboxSize string // a size name ("small", ...); "" is not stored: callers pass the resolved name
	Size        int
	UpdatedAt   time.Time
}

// TemplatePools is the part of the store that keeps the warm pool
// settings; both backends implement it.
type TemplatePools interface {
	// SetTemplatePool records p, replacing the setting of its project,
	// template and sandbox size; a Size of 0 removes it (a missing one is
	// not an error). A negative Size, or an empty ProjectID, Template or
	// SandboxSize, is ErrInvalid. The record's UpdatedAt is now (p's is
	// ignored).
	SetTemplatePool(ctx context.Context, p TemplatePool) error
	// TemplatePools lists every project's settings, ordered by project,
	// template, sandbox size ([] for none).
	TemplatePools(ctx context.Context) ([]TemplatePool, error)
}

// CheckTemplatePool is the check both backends make before they record p:
// ErrInvalid naming the field for a negative Size or an empty ProjectID,
// Template or SandboxSize.
func CheckTemplatePool(p TemplatePool) error {
	switch {
	case p.ProjectID == "":
		return fmt.Errorf("template pool: project id is empty: %w", errdefs.ErrInvalid)
	case p.Template == "":
		return fmt.Errorf("template pool: template is empty: %w", errdefs.ErrInvalid)
	case p.SandboxSize == "":
		return fmt.Errorf("template pool of %q: sandbox size is empty (pass the resolved size name): %w", p.Template, errdefs.ErrInvalid)
	case p.Size < 0:
		return fmt.Errorf("template pool of %q: size %d: must be 0 (no pool) or more: %w", p.Template, p.Size, errdefs.ErrInvalid)
	}
	return nil
}
