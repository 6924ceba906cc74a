// Package images keeps the sandbox service's checkpoint images durable in
// an object store: it uploads a pause image or a snapshot in the background
// after it is written (retrying with backoff while the store fails),
// removes an image's objects when it is no longer needed, and downloads an
// image a node does not have. The jobs of one image run one at a time, in
// order, so that the removal of an old upload never deletes a newer one's
// manifest. It has its own lock and background work; the service's core
// calls it (Config.Images in internal/sandbox), and knows nothing of jobs.
package images

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/lizard-build/lizard/internal/durable"
	"github.com/lizard-build/lizard/internal/errdefs"
)

// Store is what the jobs need of the object store's durable images
// (durable.Images).
type Store interface {
	Upload(ctx context.Context, name, dir string) (durable.Manifest, error)
	Materialize(ctx context.Context, name, dir string) (durable.Manifest, error)
	Stat(ctx context.Context, name string) (durable.Manifest, error)
	Delete(ctx context.Context, name string) error
	Retire(ctx context.Context, name string) error
	Sweep(ctx context.Context) error
}

// The names of the images in the object store. Another node resumes
// sandbox X by materializing PauseImageName(X) into its runtime's
// PauseImage(X), and restores snapshot S from SnapshotImageName(S).
func PauseImageName(id string) string    { return "sandboxes/" + id }
func SnapshotImageName(id string) string { return "snapshots/" + id }

// Backoff of a failing upload: from retryMin, doubling, to retryMax
// between attempts, until it succeeds or is stopped.
const (
	retryMin = time.Second
	retryMax = time.Minute
)

// job is background work on one image: an upload or a removal.
type job struct {
	upload bool
	cancel context.CancelFunc
	done   chan struct{}
}

// Jobs runs the background work on images. With a nil Store every call is
// a no-op (images live only on this node's disk). It is safe for
// concurrent use.
type Jobs struct {
	store  Store
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelFunc
	bg     sync.WaitGroup

	mu     sync.Mutex
	jobs   map[string]*job // the last job on each image, by name
	closed bool
	// matMu serializes downloads.
	matMu sync.Mutex
}

// New returns the jobs on store's images; store may be nil.
func New(store Store, log *slog.Logger) *Jobs {
	if log == nil {
		log = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Jobs{store: store, log: log, ctx: ctx, cancel: cancel, jobs: map[string]*job{}}
}

// Close cancels the jobs that run and waits for them; later calls start
// none.
func (j *Jobs) Close() {
	j.mu.Lock()
	j.closed = true
	j.mu.Unlock()
	j.cancel()
	j.bg.Wait()
}

// start runs fn on name in the background after name's earlier jobs. It
// does nothing once closed, or when skip says so of the last job (called
// under j.mu).
func (j *Jobs) start(name string, upload bool, skip func(last *job) bool, fn func(ctx context.Context)) {
	j.mu.Lock()
	prev := j.jobs[name]
	if j.closed || skip(prev) {
		j.mu.Unlock()
		return
	}
	ctx, cancel := context.WithCancel(j.ctx)
	jb := &job{upload: upload, cancel: cancel, done: make(chan struct{})}
	j.jobs[name] = jb
	j.bg.Add(1)
	j.mu.Unlock()
	go func() {
		defer j.bg.Done()
		defer close(jb.done)
		defer cancel()
		defer func() {
			j.mu.Lock()
			if j.jobs[name] == jb {
				delete(j.jobs, name)
			}
			j.mu.Unlock()
		}()
		if prev != nil {
			<-prev.done
		}
		fn(ctx)
	}()
}

// MakeDurable uploads the image in dir as name in the background, retrying
// with backoff while the object store fails, and calls durable with the
// time it became durable. It does nothing without a store, or when name is
// being uploaded already.
func (j *Jobs) MakeDurable(name, dir string, durable func(at time.Time)) {
	if j.store == nil {
		return
	}
	uploading := func(last *job) bool { return last != nil && last.upload }
	j.start(name, true, uploading, func(ctx context.Context) {
		wait := retryMin
		for attempt := 1; ; attempt++ {
			start := time.Now()
			m, err := j.store.Upload(ctx, name, dir)
			if err == nil {
				stored, size := m.Stored()
				j.log.Info("image durable", "image", name, "bytes", size, "stored", stored, "took", time.Since(start), "attempt", attempt)
				durable(time.Now().UTC())
				return
			}
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, os.ErrNotExist) {
				j.log.Warn("image gone before it was durable", "image", name, "err", err)
				return
			}
			j.log.Warn("upload image; retrying", "image", name, "attempt", attempt, "in", wait, "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			wait = min(2*wait, retryMax)
		}
	})
}

// StopUpload cancels the upload of name, if one runs, and waits for it:
// then the local image may change or go.
func (j *Jobs) StopUpload(name string) {
	j.mu.Lock()
	jb := j.jobs[name]
	j.mu.Unlock()
	if jb != nil && jb.upload {
		jb.cancel()
		<-jb.done
	}
}

// Drop stops name's upload and removes its objects from the store in the
// background (the image's manifest and its base, then the blobs no other
// image uses): the sandbox went, or the snapshot was deleted.
func (j *Jobs) Drop(name string) {
	j.after(name, "remove durable image", func(ctx context.Context) error { return j.store.Delete(ctx, name) })
}

// Retire stops name's upload and, in the background, keeps the image's
// chunks only as the base of its next upload (durable.Images.Retire): the
// sandbox resumed, so its image is stale, but its next pause shares most
// of its chunks.
func (j *Jobs) Retire(name string) {
	j.after(name, "retire durable image", func(ctx context.Context) error { return j.store.Retire(ctx, name) })
}

// after stops name's upload and runs fn on name after its other jobs,
// logging its failure as what.
func (j *Jobs) after(name, what string, fn func(ctx context.Context) error) {
	if j.store == nil {
		return
	}
	j.StopUpload(name)
	never := func(*job) bool { return false }
	j.start(name, false, never, func(ctx context.Context) {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		if err := fn(ctx); err != nil {
			j.log.Warn(what+"; its objects stay until a later delete sweeps them", "image", name, "err", err)
		}
	})
}

// Materialize makes sure the image dir of name is on this node: when it is
// missing it is downloaded from the object store, every digest checked. A
// missing image that is not durable is a conflict (code image_lost); a
// corrupt object, a conflict with code corrupt_object naming it (the
// download is discarded). Without a store it does nothing: the runtime
// reports a missing image.
func (j *Jobs) Materialize(ctx context.Context, name, dir string) error {
	if _, err := os.Stat(dir); err == nil || j.store == nil {
		return nil
	}
	j.matMu.Lock()
	defer j.matMu.Unlock()
	if _, err := os.Stat(dir); err == nil {
		return nil // another call brought it meanwhile
	}
	start := time.Now()
	m, err := j.store.Materialize(ctx, name, dir)
	if errors.Is(err, errdefs.ErrNotFound) {
		return errdefs.WithCode("image_lost", fmt.Errorf("image %s is not on this node and was never made durable: %w", name, errdefs.ErrConflict))
	}
	if err != nil {
		return err
	}
	stored, size := m.Stored()
	j.log.Info("image downloaded from the object store", "image", name, "bytes", size, "stored", stored, "took", time.Since(start))
	return nil
}
