//go:build !linux

package template

import (
	"context"
	"fmt"
	"io"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// BuildDockerfile builds template name from a Dockerfile; it needs Linux
// (gVisor runs RUN steps).
func (r *Registry) BuildDockerfile(ctx context.Context, name string, opts DockerfileOptions, progress io.Writer) (Template, error) {
	return Template{}, fmt.Errorf("build template %q: Dockerfile builds need Linux: %w", name, errdefs.ErrUnavailable)
}

// BuildSteps builds template name from steps; it needs Linux (gVisor runs
// RUN steps).
func (r *Registry) BuildSteps(ctx context.Context, name string, steps Steps, opts DockerfileOptions, progress io.Writer) (Template, error) {
	return Template{}, fmt.Errorf("build template %q: builds need Linux: %w", name, errdefs.ErrUnavailable)
}

// ExtractArchive unpacks a tar archive into dir; it needs Linux.
func ExtractArchive(archive, dir string) error {
	return fmt.Errorf("extract %s: needs Linux: %w", archive, errdefs.ErrUnavailable)
}
