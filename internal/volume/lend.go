package volume

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// lending is a volume lent to callers of Lend: mounted on the host, held
// from sandboxes, until the last of them is done (guarded by Manager.mu).
type lending struct {
	n       int  // calls in progress
	changed bool // one of them wrote
	done    chan struct{}
}

// Token returns the volume with its content token (Volume.Token), making
// one first for a volume that has none (made by an older server).
func (m *Manager) Token(ctx context.Context, projectID, ref string) (Volume, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, err := m.findLocked(ctx, projectID, ref)
	if err != nil || v.Token != "" {
		return v, err
	}
	v.Token = newToken()
	if err := m.saveLocked(ctx, v); err != nil {
		return Volume{}, err
	}
	return v, nil
}

func newToken() string {
	var b [32]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Lend runs fn over the data directory of the project's volume ref (an id
// or a name) when no sandbox holds it: mounted on the host for the call,
// with no sandbox able to attach it, nor a resize, delete or sync to run,
// until fn returns; calls of Lend on one volume run together. write says
// fn may change the volume: it is synced again afterwards. A volume a
// sandbox holds is not lent: Lend returns the holder's id and does not
// call fn (the caller goes through the holder). A volume of another node
// is ErrUnavailable.
func (m *Manager) Lend(ctx context.Context, projectID, ref string, write bool, fn func(dir string) error) (holder string, err error) {
	m.mu.Lock()
	v, local, err := m.findAnyLocked(ctx, projectID, ref)
	if err == nil && !local {
		err = errdefs.WithCode("volume_elsewhere", fmt.Errorf("volume %q is on node %s: %w", v.Name, v.Node, errdefs.ErrUnavailable))
	}
	if err != nil || v.AttachedTo != "" {
		m.mu.Unlock()
		return v.AttachedTo, err
	}
	l := m.lent[v.ID]
	if l == nil {
		m.quiesceLocked(v.ID) // its image changes under a sync otherwise
		if err := m.mountLocked(ctx, v.ID); err != nil {
			m.mu.Unlock()
			return "", err
		}
		l = &lending{done: make(chan struct{})}
		m.lent[v.ID] = l
	}
	l.n++
	m.mu.Unlock()

	err = fn(m.DataDir(v.ID))

	m.mu.Lock()
	defer m.mu.Unlock()
	l.changed = l.changed || write
	if l.n--; l.n > 0 {
		return "", err
	}
	delete(m.lent, v.ID)
	defer close(l.done)
	if uerr := m.unmount(context.WithoutCancel(ctx), v.ID); uerr != nil {
		m.cfg.Logger.Warn("volume lent to the file API stays mounted", "volume", v.ID, "err", uerr)
		return "", err
	}
	if !l.changed || m.cfg.Images == nil {
		return "", err
	}
	// Changed while detached, as a resize: synced again.
	cur, ferr := m.findLocked(context.WithoutCancel(ctx), projectID, v.ID)
	if ferr != nil {
		return "", err
	}
	cur.Version++
	if serr := m.saveLocked(context.WithoutCancel(ctx), cur); serr != nil {
		m.cfg.Logger.Warn("volume changed through the file API; its next sync is not recorded", "volume", v.ID, "err", serr)
		return "", err
	}
	m.startSyncLocked(cur)
	return "", err
}

// waitLentLocked waits, m.mu released meanwhile, until volume id is lent
// to no call of Lend; ctx bounds the wait. The caller finds the volume
// again afterwards: it may have changed.
func (m *Manager) waitLentLocked(ctx context.Context, id string) error {
	for {
		l := m.lent[id]
		if l == nil {
			return nil
		}
		m.mu.Unlock()
		select {
		case <-l.done:
		case <-ctx.Done():
		}
		m.mu.Lock()
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("volume %s is in use by its file API: %w: %w", id, err, errdefs.ErrTimeout)
		}
	}
}
