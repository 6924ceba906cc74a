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

// upload is a background upload of one image.
type upload struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// Backoff of a failing upload: from uploadRetryMin, doubling, to
// uploadRetryMax between attempts, until it succeeds or is stopped.
const (
	uploadRetryMin = time.Second
	uploadRetryMax = time.Minute
)

// makeDurable uploads the image in dir as name in the background, retrying
// with backoff while the object store fails, and calls durable with the
// time it became durable. It does nothing without an object store, or when
// name is being uploaded already.
func (s *Service) makeDurable(name, dir string, durable func(at time.Time)) {
	if s.cfg.Images == nil {
		return
	}
	s.mu.Lock()
	if _, ok := s.uploads[name]; ok || s.closed {
		s.mu.Unlock()
		return
	}
	ctx, cancel := context.WithCancel(s.bgCtx)
	u := &upload{cancel: cancel, done: make(chan struct{})}
	s.uploads[name] = u
	s.bg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.bg.Done()
		defer close(u.done)
		defer cancel()
		defer func() {
			s.mu.Lock()
			delete(s.uploads, name)
			s.mu.Unlock()
		}()
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
	}()
}

// stopUpload cancels the upload of name, if one runs, and waits for it:
// then the local image may change or go.
func (s *Service) stopUpload(name string) {
	s.mu.Lock()
	u := s.uploads[name]
	s.mu.Unlock()
	if u != nil {
		u.cancel()
		<-u.done
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
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.bg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.bg.Done()
		ctx, cancel := context.WithTimeout(s.bgCtx, 5*time.Minute)
		defer cancel()
		if _, err := s.cfg.Images.Stat(ctx, name); errors.Is(err, errdefs.ErrNotFound) {
			return // never made durable (a cut upload's blobs go at the next sweep)
		}
		if err := s.cfg.Images.Delete(ctx, name); err != nil {
			s.log.Warn("remove durable image; its objects stay until a later delete sweeps them", "image", name, "err", err)
			return
		}
		s.log.Info("durable image removed", "image", name)
	}()
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
