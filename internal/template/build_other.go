//go:build !linux

package template

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
)

func (r *Registry) build(ctx context.Context, name string, progress io.Writer, ifMissing bool) (Template, error) {
	return Template{}, fmt.Errorf("build template %q: template builds need Linux: %w", name, errdefs.ErrUnavailable)
}

// Prune removes the template versions nothing uses; template builds, and
// so versions, need Linux.
func (r *Registry) Prune(inUse func(rootfs string) bool) (removed []string, err error) {
	return nil, fmt.Errorf("prune templates: template builds need Linux: %w", errdefs.ErrUnavailable)
}

// PruneLayers removes unused Dockerfile layers; Dockerfile builds need
// Linux.
func (r *Registry) PruneLayers(unusedFor time.Duration) (removed int, busy bool, err error) {
	return 0, false, fmt.Errorf("prune layers: template builds need Linux: %w", errdefs.ErrUnavailable)
}

// Migrate moves templates of the older layout under .v; template builds,
// and so versions, need Linux.
func (r *Registry) Migrate() (migrated []string, err error) {
	return nil, fmt.Errorf("migrate templates: template builds need Linux: %w", errdefs.ErrUnavailable)
}

// Remove removes a project's template; template builds need Linux.
func (r *Registry) Remove(ctx context.Context, name string) error {
	return fmt.Errorf("remove template %q: template builds need Linux: %w", name, errdefs.ErrUnavailable)
}

// MigrateCustom gives a project the templates of no project; template
// builds, and so versions, need Linux.
func (r *Registry) MigrateCustom(project string) (migrated []string, err error) {
	return nil, fmt.Errorf("migrate custom templates: template builds need Linux: %w", errdefs.ErrUnavailable)
}

// AdoptVersion needs Linux, as builds do.
func (r *Registry) AdoptVersion(ctx context.Context, name, digest string, populate func(dir string) error) (Template, error) {
	return Template{}, fmt.Errorf("adopt template %q: template versions need Linux: %w", name, errdefs.ErrUnavailable)
}

// AddVersion needs Linux, as builds do.
func (r *Registry) AddVersion(ctx context.Context, name, digest string, populate func(dir string) error) (Template, error) {
	return Template{}, fmt.Errorf("add a version of template %q: template versions need Linux: %w", name, errdefs.ErrUnavailable)
}

// Evict needs Linux, as builds do.
func (r *Registry) Evict(name, vdir string, inUse func(rootfs string) bool) (bool, error) {
	return false, fmt.Errorf("evict template %q: template versions need Linux: %w", name, errdefs.ErrUnavailable)
}
