// Package disk guards the disk that holds the server's state: below a
// watermark of free space, work that writes much (new sandboxes, pauses,
// snapshots, volumes, file uploads) is refused with errdefs.ErrNoSpace
// before it starts, instead of failing half-way and leaving partial files.
package disk

import (
	"errors"
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// FullBelow is the free space under which a write that failed is taken as
// one that ran out of space: the writer (runsc, the agent) reports ENOSPC
// only as text, and its partial output is removed before anyone looks.
const FullBelow = 64 << 20

// Guard checks the free space of the file system holding Dir. A nil Guard
// admits everything.
type Guard struct {
	Dir string
	// MinFree is the fraction of the file system (0 to 1) that must stay
	// free; 0 checks nothing.
	MinFree float64
}

// Usage is the state of the file system holding a directory.
type Usage struct {
	Total, Avail uint64 // bytes; Avail is what an unprivileged writer may use
}

// Free is the fraction of the file system that is free.
func (u Usage) Free() float64 {
	if u.Total == 0 {
		return 1
	}
	return float64(u.Avail) / float64(u.Total)
}

// Stat returns the usage of the file system holding dir.
func Stat(dir string) (Usage, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return Usage{}, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return Usage{Total: st.Blocks * uint64(st.Bsize), Avail: st.Bavail * uint64(st.Bsize)}, nil
}

// Check returns ErrNoSpace (code insufficient_storage) when the free space
// is below the watermark. An unreadable file system is not a refusal: the
// write itself then fails with a clearer error.
func (g *Guard) Check() error {
	if g == nil || g.MinFree <= 0 {
		return nil
	}
	u, err := Stat(g.Dir)
	if err != nil || u.Free() >= g.MinFree {
		return nil
	}
	return noSpace(errdefs.WithCause(errdefs.ErrNoSpace, fmt.Sprintf("the data directory has %.1f%% free (%d MiB), below the %.1f%% watermark: free some space (delete snapshots, volumes or sandboxes)",
		u.Free()*100, u.Avail>>20, g.MinFree*100), fmt.Errorf("data directory %s", g.Dir)))
}

// Classify turns err, a failed write under dir, into ErrNoSpace when it
// ran out of space: ENOSPC, or (for writers that report it only as text)
// a file system left with less than FullBelow free. Other errors pass as
// they are.
func Classify(dir string, err error) error {
	if err == nil || errors.Is(err, errdefs.ErrNoSpace) {
		return err
	}
	if errors.Is(err, syscall.ENOSPC) {
		return noSpace(errdefs.WithCause(errdefs.ErrNoSpace, "no space left on device: the server's disk is full", errors.New(err.Error())))
	}
	if u, serr := Stat(dir); serr == nil && u.Avail < FullBelow {
		return noSpace(errdefs.WithCause(errdefs.ErrNoSpace, fmt.Sprintf("no space left on device: the server's disk is full (%d MiB free)", u.Avail>>20), fmt.Errorf("%v (the disk of %s)", err, dir)))
	}
	return err
}

func noSpace(err error) error { return errdefs.WithCode("insufficient_storage", err) }
