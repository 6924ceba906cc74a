//go:build !linux

package template

import (
	"context"
	"fmt"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// npmGlobal needs a chroot: Linux only.
func npmGlobal(pkgs ...string) postStep {
	return postStep{"npm install", func(context.Context, string, RunFunc) error {
		return fmt.Errorf("npm install in a chroot needs Linux: %w", errdefs.ErrUnavailable)
	}}
}
