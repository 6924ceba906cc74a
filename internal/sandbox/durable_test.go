package sandbox

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/durable"
	"github.com/lizard-build/lizard/internal/errdefs"
)

// fakeImages is an in-process stand-in for durable.Images (unit tests
// only; the real one is tested against versitygw) that records the order
// of calls and can hold Stat until released.
type fakeImages struct {
	mu       sync.Mutex
	calls    []string
	durable  map[string]bool
	holdStat chan struct{} // Stat waits on it when not nil
}

func (f *fakeImages) note(c string) {
	f.mu.Lock()
	f.calls = append(f.calls, c)
	f.mu.Unlock()
}

func (f *fakeImages) Upload(ctx context.Context, name, dir string) (durable.Manifest, error) {
	f.note("upload " + name)
	f.mu.Lock()
	f.durable[name] = true
	f.mu.Unlock()
	return durable.Manifest{Name: name}, nil
}

func (f *fakeImages) Materialize(ctx context.Context, name, dir string) (durable.Manifest, error) {
	return durable.Manifest{}, fmt.Errorf("not here: %w", errdefs.ErrNotFound)
}

func (f *fakeImages) Stat(ctx context.Context, name string) (durable.Manifest, error) {
	if f.holdStat != nil {
		<-f.holdStat
	}
	f.note("stat " + name)
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.durable[name] {
		return durable.Manifest{}, errdefs.ErrNotFound
	}
	return durable.Manifest{Name: name}, nil
}

func (f *fakeImages) Delete(ctx context.Context, name string) error {
	f.note("delete " + name)
	f.mu.Lock()
	delete(f.durable, name)
	f.mu.Unlock()
	return nil
}

func (f *fakeImages) Sweep(ctx context.Context) error { return nil }

// TestImageJobsInOrder: the removal of an image's old objects and the next
// upload of the same name never overlap, so the removal cannot delete the
// newer manifest.
func TestImageJobsInOrder(t *testing.T) {
	f := &fakeImages{durable: map[string]bool{"sandboxes/x": true}, holdStat: make(chan struct{})}
	s := New(Config{Images: f})
	defer s.Close()
	durableAt := make(chan time.Time, 1)
	s.dropDurable("sandboxes/x") // held in Stat
	s.makeDurable("sandboxes/x", t.TempDir(), func(at time.Time) { durableAt <- at })
	time.Sleep(50 * time.Millisecond) // give a wrong order the chance to show
	close(f.holdStat)
	select {
	case <-durableAt:
	case <-time.After(10 * time.Second):
		t.Fatal("the upload queued behind the removal never ran")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	want := []string{"stat sandboxes/x", "delete sandboxes/x", "upload sandboxes/x"}
	if !slices.Equal(f.calls, want) {
		t.Fatalf("calls %v, want %v", f.calls, want)
	}
	if !f.durable["sandboxes/x"] {
		t.Fatal("the new upload's image was deleted")
	}
}
