package images

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/durable"
	"github.com/lizard-build/lizard/internal/errdefs"
)

// fakeImages is an in-process stand-in for durable.Images (unit tests
// only; the real one is tested against versitygw) that records the order
// of calls and can hold Delete and Retire until released.
type fakeImages struct {
	mu      sync.Mutex
	calls   []string
	durable map[string]bool
	hold    chan struct{} // Delete and Retire wait on it when not nil
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
	f.note("stat " + name)
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.durable[name] {
		return durable.Manifest{}, errdefs.ErrNotFound
	}
	return durable.Manifest{Name: name}, nil
}

func (f *fakeImages) Delete(ctx context.Context, name string) error { return f.end("delete", name) }
func (f *fakeImages) Retire(ctx context.Context, name string) error { return f.end("retire", name) }

// end is a Delete or Retire (op) of name: not durable any more.
func (f *fakeImages) end(op, name string) error {
	if f.hold != nil {
		<-f.hold
	}
	f.note(op + " " + name)
	f.mu.Lock()
	delete(f.durable, name)
	f.mu.Unlock()
	return nil
}

func (f *fakeImages) Sweep(ctx context.Context) error { return nil }

// TestImageJobsInOrder: the removal (or retirement) of an image's old
// objects and the next upload of the same name never overlap, so the
// removal cannot delete the newer manifest.
func TestImageJobsInOrder(t *testing.T) {
	for _, c := range []struct {
		name string
		drop func(j *Jobs, name string)
	}{
		{"delete", (*Jobs).Drop},
		{"retire", (*Jobs).Retire},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := &fakeImages{durable: map[string]bool{"sandboxes/x": true}, hold: make(chan struct{})}
			s := New(f, nil)
			defer s.Close()
			durableAt := make(chan time.Time, 1)
			c.drop(s, "sandboxes/x") // held
			s.MakeDurable("sandboxes/x", t.TempDir(), func(at time.Time) { durableAt <- at })
			time.Sleep(50 * time.Millisecond) // give a wrong order the chance to show
			close(f.hold)
			select {
			case <-durableAt:
			case <-time.After(10 * time.Second):
				t.Fatal("the upload queued behind the removal never ran")
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			want := []string{c.name + " sandboxes/x", "upload sandboxes/x"}
			if !slices.Equal(f.calls, want) {
				t.Fatalf("calls %v, want %v", f.calls, want)
			}
			if !f.durable["sandboxes/x"] {
				t.Fatal("the new upload's image was deleted")
			}
		})
	}
}

// failing is a store whose uploads always fail.
type failing struct{ fakeImages }

func (f *failing) Upload(ctx context.Context, name, dir string) (durable.Manifest, error) {
	f.note("upload " + name)
	return durable.Manifest{}, errors.New("store down")
}

// TestMaterializeAndClose: a local image is not downloaded; a missing one
// that was never durable is image_lost; without a store nothing is done;
// Close ends an upload that retries against a failing store, and later
// calls start no job.
func TestMaterializeAndClose(t *testing.T) {
	f := &fakeImages{durable: map[string]bool{}}
	j := New(f, nil)
	local := t.TempDir()
	if err := j.Materialize(context.Background(), "snapshots/here", local); err != nil {
		t.Fatalf("a local image: %v", err)
	}
	missing := filepath.Join(t.TempDir(), "gone")
	err := j.Materialize(context.Background(), "snapshots/gone", missing)
	if !errors.Is(err, errdefs.ErrConflict) || errdefs.Code(err) != "image_lost" {
		t.Fatalf("a missing image never made durable: %v, want image_lost", err)
	}
	j.Close()
	if err := New(nil, nil).Materialize(context.Background(), "snapshots/gone", missing); err != nil {
		t.Fatalf("without a store: %v, want nil (the runtime reports it)", err)
	}

	down := &failing{fakeImages{durable: map[string]bool{}}}
	j = New(down, nil)
	j.MakeDurable("sandboxes/y", t.TempDir(), func(time.Time) { t.Error("an upload that failed was called durable") })
	eventually := time.Now().Add(10 * time.Second)
	for {
		down.mu.Lock()
		n := len(down.calls)
		down.mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(eventually) {
			t.Fatal("the upload never ran")
		}
		time.Sleep(10 * time.Millisecond)
	}
	closed := make(chan struct{})
	go func() { j.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end a retrying upload")
	}
	j.MakeDurable("sandboxes/z", t.TempDir(), func(time.Time) {})
	j.Drop("sandboxes/z")
	j.mu.Lock()
	defer j.mu.Unlock()
	if len(j.jobs) != 0 {
		t.Fatalf("jobs started after Close: %d", len(j.jobs))
	}
}
