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
