package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/lizard-build/lizard/internal/durable"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/runtime"
)

// Images is what the service needs of the object store's durable images
// (durable.Images): pause images and snapshots are uploaded in the
// background after they are written, and downloaded when the local copy is
// missing.
type Images interface {
	Upload(ctx context.Context, name, dir string) (durable.Manifest, error)
	Materialize(ctx context.Context, name, dir string) (durable.Manifest, error)
	Stat(ctx context.Context, name string) (durable.Manifest, error)
	Delete(ctx context.Context, name string) error
	Sweep(ctx context.Context) error
}

// The names of the images in the object store. Another node resumes
// sandbox X by materializing PauseImageName(X) into its runtime's
// PauseImage(X), and restores snapshot S from SnapshotImageName(S).
func PauseImageName(id string) string    { return "sandboxes/" + id }
func SnapshotImageName(id string) string { return "snapshots/" + id }

// imageJob is background work on one image in the object store: an upload
// or a removal. The jobs of one image run one at a time, in order, so that
// the removal of an old upload never deletes a newer one's manifest.
type imageJob struct {
	upload bool
	cancel context.CancelFunc
	done   chan struct{}
}

// Backoff of a failing upload: from uploadRetryMin, doubling, to
// uploadRetryMax between attempts, until it succeeds or is stopped.
const (
	uploadRetryMin = time.Second
	uploadRetryMax = time.Minute
)

// startJob runs fn on name in the background after name's earlier jobs.
// It does nothing once the service is closed, or when skip says so of the
// last job (called under s.mu).
func (s *Service) startJob(name string, upload bool, skip func(last *imageJob) bool, fn func(ctx context.Context)) {
	s.mu.Lock()
	prev := s.imageJobs[name]
	if s.closed || skip(prev) {
		s.mu.Unlock()
		return
	}
	ctx, cancel := context.WithCancel(s.bgCtx)
	j := &imageJob{upload: upload, cancel: cancel, done: make(chan struct{})}
	s.imageJobs[name] = j
	s.bg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.bg.Done()
		defer close(j.done)
		defer cancel()
		defer func() {
			s.mu.Lock()
			if s.imageJobs[name] == j {
				delete(s.imageJobs, name)
			}
			s.mu.Unlock()
		}()
		if prev != nil {
			<-prev.done
		}
		fn(ctx)
	}()
}

// makeDurable uploads the image in dir as name in the background, retrying
// with backoff while the object store fails, and calls durable with the
// time it became durable. It does nothing without an object store, or when
// name is being uploaded already.
func (s *Service) makeDurable(name, dir string, durable func(at time.Time)) {
	if s.cfg.Images == nil {
		return
	}
	uploading := func(last *imageJob) bool { return last != nil && last.upload }
	s.startJob(name, true, uploading, func(ctx context.Context) {
		wait := uploadRetryMin
		for attempt := 1; ; attempt++ {
			start := time.Now()
			m, err := s.cfg.Images.Upload(ctx, name, dir)
			if err == nil {
				stored, size := m.Stored()
				s.log.Info("image durable", "image", name, "bytes", size, "stored", stored, "took", time.Since(start), "attempt", attempt)
				durable(time.Now().UTC())
				return
			}
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, os.ErrNotExist) {
				s.log.Warn("image gone before it was durable", "image", name, "err", err)
				return
			}
			s.log.Warn("upload image; retrying", "image", name, "attempt", attempt, "in", wait, "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			wait = min(2*wait, uploadRetryMax)
		}
	})
}

// stopUpload cancels the upload of name, if one runs, and waits for it:
// then the local image may change or go.
func (s *Service) stopUpload(name string) {
	s.mu.Lock()
	j := s.imageJobs[name]
	s.mu.Unlock()
	if j != nil && j.upload {
		j.cancel()
		<-j.done
	}
}

// dropDurable stops name's upload and removes its objects from the store
// in the background (the image's manifest, then the blobs no other image
// uses): the sandbox resumed or went, or the snapshot was deleted.
func (s *Service) dropDurable(name string) {
	if s.cfg.Images == nil {
		return
	}
	s.stopUpload(name)
	never := func(*imageJob) bool { return false }
	s.startJob(name, false, never, func(ctx context.Context) {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		_, err := s.cfg.Images.Stat(ctx, name)
		if errors.Is(err, errdefs.ErrNotFound) {
			return // never made durable (a cut upload's blobs go at the next sweep)
		}
		if err == nil {
			err = s.cfg.Images.Delete(ctx, name)
		}
		if err != nil {
			s.log.Warn("remove durable image; its objects stay until a later delete sweeps them", "image", name, "err", err)
			return
		}
		s.log.Info("durable image removed", "image", name)
	})
}

// materialize makes sure the image dir of name is on this node: when it is
// missing it is downloaded from the object store, every digest checked. A
// missing image that is not durable is a conflict; a corrupt object, a
// conflict with code corrupt_object naming it (the download is discarded).
func (s *Service) materialize(ctx context.Context, name, dir string) error {
	if _, err := os.Stat(dir); err == nil || s.cfg.Images == nil {
		return nil // local, or nowhere else to look: the runtime reports it
	}
	s.matMu.Lock()
	defer s.matMu.Unlock()
	if _, err := os.Stat(dir); err == nil {
		return nil // another call brought it meanwhile
	}
	start := time.Now()
	m, err := s.cfg.Images.Materialize(ctx, name, dir)
	if errors.Is(err, errdefs.ErrNotFound) {
		return errdefs.WithCode("image_lost", fmt.Errorf("image %s is not on this node and was never made durable: %w", name, errdefs.ErrConflict))
	}
	if err != nil {
		return err
	}
	stored, size := m.Stored()
	s.log.Info("image downloaded from the object store", "image", name, "bytes", size, "stored", stored, "took", time.Since(start))
	return nil
}

// pauseImage is where the runtime keeps sandbox id's pause image; "" when
// it does not say (then nothing is made durable).
func (s *Service) pauseImage(id string) string {
	if pi, ok := s.cfg.Runtime.(runtime.PauseImager); ok {
		return pi.PauseImage(id)
	}
	return ""
}

// resumeFailed puts e back to paused after a resume that did not happen,
// and uploads its image again if an upload was stopped for the resume.
func (s *Service) resumeFailed(e *entry, id string) {
	s.setStatus(e, StatusPaused, "")
	s.mu.Lock()
	durable := e.rec.DurableAt != nil
	s.mu.Unlock()
	if !durable {
		s.makePauseDurable(e, id)
	}
}

// makePauseDurable uploads paused sandbox e's image in the background and
// records when it is durable.
func (s *Service) makePauseDurable(e *entry, id string) {
	dir := s.pauseImage(id)
	if dir == "" {
		return
	}
	s.makeDurable(PauseImageName(id), dir, func(at time.Time) {
		s.mu.Lock()
		if e.gone || e.rec.Status != StatusPaused {
			s.mu.Unlock()
			return
		}
		e.rec.DurableAt = &at
		rec := e.rec
		s.mu.Unlock()
		s.logs.event(id, "durable")
		if err := s.persist(context.Background(), rec); err != nil {
			s.log.Error("persist sandbox", "sandbox", id, "err", err)
		}
	})
}

// makeSnapshotDurable uploads snapshot se's image in the background and
// records when it is durable.
func (s *Service) makeSnapshotDurable(se *snapEntry) {
	s.mu.Lock()
	id := se.snap.ID
	s.mu.Unlock()
	s.makeDurable(SnapshotImageName(id), s.snapshotDir(id), func(at time.Time) {
		s.mu.Lock()
		if se.gone {
			s.mu.Unlock()
			return
		}
		se.snap.DurableAt = &at
		snap := se.snap
		s.mu.Unlock()
		if err := s.putSnapshot(context.Background(), snap); err != nil {
			s.log.Error("persist snapshot", "snapshot", id, "err", err)
		}
	})
}
