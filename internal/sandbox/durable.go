package sandbox

import (
	"context"
	"time"

	"github.com/lizard-build/lizard/internal/runtime"
	"github.com/lizard-build/lizard/internal/sandbox/images"
)

// Images is what the service needs of the object store's durable images
// (durable.Images): internal/sandbox/images uploads pause images and
// snapshots in the background and downloads them where they are missing.
type Images = images.Store

// The names of the images in the object store (images.PauseImageName,
// SnapshotImageName).
var (
	PauseImageName    = images.PauseImageName
	SnapshotImageName = images.SnapshotImageName
)

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
// records when it is durable: in the store first, then in the sandbox the
// API shows, so that a durableAt a caller sees is one the cluster's store
// has too (a node lost after it leaves the sandbox to the others, not
// lost with it). A resume waits for this (images.StopUpload) before it
// writes the row again.
func (s *Service) makePauseDurable(e *entry, id string) {
	dir := s.pauseImage(id)
	if dir == "" {
		return
	}
	s.images.MakeDurable(PauseImageName(id), dir, func(at time.Time) {
		s.mu.Lock()
		if e.gone || e.rec.Status != StatusPaused {
			s.mu.Unlock()
			return
		}
		rec := e.rec
		s.mu.Unlock()
		rec.DurableAt = &at
		if err := s.persist(context.Background(), rec); err != nil {
			s.log.Error("persist sandbox", "sandbox", id, "err", err)
			return
		}
		s.mu.Lock()
		if !e.gone && e.rec.Status == StatusPaused {
			e.rec.DurableAt = &at
		}
		s.mu.Unlock()
		s.logs.event(id, "durable")
	})
}
