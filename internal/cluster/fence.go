package cluster

import (
	"errors"
	"fmt"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
)

// classes are the errdefs classes a store error may already carry; those
// go to the caller as they are.
var classes = []error{errdefs.ErrInvalid, errdefs.ErrNotFound, errdefs.ErrConflict, errdefs.ErrQuota,
	errdefs.ErrCapacity, errdefs.ErrLimit, errdefs.ErrUnavailable}

// storeError classifies an error of a write this node made under fence f:
// ErrFenced tells the member (which registers again) and, like a database
// that does not answer, is a retryable ErrUnavailable to the caller, so
// that creates and lifecycle changes answer 503 while running sandboxes
// keep serving.
func (m *Member) storeError(f store.Fence, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, store.ErrFenced):
		m.noteFenced(f)
		return fmt.Errorf("this node's membership is being renewed (%v); retry: %w", err, errdefs.ErrUnavailable)
	}
	return Unavailable(err)
}

// Unavailable is err as it is when it carries an errdefs class, else (the
// database did not answer, or failed) a retryable ErrUnavailable: in
// cluster mode the database is a dependency every node shares, and its
// outage must not read as a server error.
func Unavailable(err error) error {
	if err == nil {
		return nil
	}
	for _, c := range classes {
		if errors.Is(err, c) {
			return err
		}
	}
	// The database's error may name its host: for the log only.
	return errdefs.WithCause(errdefs.ErrUnavailable, "the cluster database cannot serve this now; retry shortly", errors.New(err.Error()))
}

// unhealthy is the refusal of a write while this node's own lease has
// lapsed.
func (m *Member) unhealthy() error {
	return fmt.Errorf("node %s has lost touch with the cluster database; retry: %w", m.name, errdefs.ErrUnavailable)
}
