//go:build linux

package template

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
)

// tryFlock opens (creating) the lock file path and takes how
// (syscall.LOCK_EX or LOCK_SH) on it without waiting: ok is false while
// another holder has a conflicting lock. The lock is the returned file's,
// released by closing it.
func tryFlock(path string, how int) (f *os.File, ok bool, err error) {
	f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, false, err
	}
	err = syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB)
	if err == nil {
		return f, true, nil
	}
	f.Close()
	if errors.Is(err, syscall.EWOULDBLOCK) || errors.Is(err, syscall.EINTR) {
		return nil, false, nil
	}
	return nil, false, fmt.Errorf("lock %s: %w", path, err)
}

// flock is tryFlock that waits: it tries every 250 ms until it gets the
// lock or ctx ends, calling waiting (may be nil) before the first wait.
func flock(ctx context.Context, path string, how int, waiting func()) (*os.File, error) {
	for first := true; ; first = false {
		f, ok, err := tryFlock(path, how)
		if ok || err != nil {
			return f, err
		}
		if first && waiting != nil {
			waiting()
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}
