package gvisor

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/network"
	"github.com/lizard-build/lizard/internal/runtime"
)

var _ runtime.EgressSetter = (*Runtime)(nil)

// SetEgress implements runtime.EgressSetter: the network enforces the new
// policy at once, and state.json keeps it for a resume and for the next
// server's attachAll. Neither needs runsc, so it does not wait for
// reconcile. When state.json cannot be written the old policy is put back.
func (r *Runtime) SetEgress(ctx context.Context, id string, e network.Egress) error {
	if r.cfg.Network == nil {
		return fmt.Errorf("this runtime has no sandboxes (no network): %w", errdefs.ErrUnavailable)
	}
	st, err := r.readState(id)
	if err != nil {
		return err
	}
	old := st.Egress
	if err := r.cfg.Network.SetEgress(id, st.Endpoint, e); err != nil {
		return fmt.Errorf("network: %w", err)
	}
	st.Egress = e
	if err := writeJSON(filepath.Join(r.dir(id), "state.json"), st); err != nil {
		return errors.Join(err, r.cfg.Network.SetEgress(id, st.Endpoint, old))
	}
	return nil
}
