package durable

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"hash"
	"io"
	"sync"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/tracing"
)

// Stream writes file path of image name to w, in order, with no copy on
// disk: chunks are downloaded fetchers at a time ahead of the writing, and
// each is checked (both digests) before it is written; the file's digest
// is checked after its last chunk. What was written before a corrupt or
// missing chunk (409 corrupt_object naming it) must be thrown away by the
// caller. A path that is not in the image is errdefs.ErrNotFound.
func (im *Images) Stream(ctx context.Context, name, path string, w io.Writer) (err error) {
	ctx, span := tracing.Start(ctx, "durable stream", tracing.Image.String(name))
	defer func() { tracing.End(span, err) }()
	m, err := im.Stat(ctx, name)
	if err != nil {
		return err
	}
	var f *File
	for i := range m.Files {
		if m.Files[i].Path == path {
			f = &m.Files[i]
		}
	}
	if f == nil {
		return fmt.Errorf("image %s holds no file %s: %w", name, path, errdefs.ErrNotFound)
	}
	whole, err := checkList(name, m.Version, *f)
	if err != nil {
		return err
	}

	// Fetches in flight end (canceled) before Stream returns.
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type fetched struct {
		buf  *bytes.Buffer
		err  error
		done chan struct{}
	}
	slots := make([]*fetched, len(f.Chunks))
	for i := range slots {
		slots[i] = &fetched{done: make(chan struct{})}
	}
	// The fetches run at most fetchers ahead of the writing: a slot is
	// given back when its chunk is written.
	ahead := make(chan struct{}, fetchers)
	wg.Go(func() {
		for i, c := range f.Chunks {
			s := slots[i]
			if c.Hole {
				close(s.done)
				continue
			}
			select {
			case ahead <- struct{}{}:
			case <-ctx.Done():
				return
			}
			wg.Go(func() {
				defer close(s.done)
				s.buf = chunkBufs.Get().(*bytes.Buffer)
				s.buf.Reset()
				s.buf.Grow(int(c.Size))
				s.err = im.downloadChunk(ctx, name, s.buf, c)
			})
		}
	})

	var h hash.Hash
	if whole {
		h = sha256.New()
		w = io.MultiWriter(w, h)
	}
	for i, c := range f.Chunks {
		s := slots[i]
		select {
		case <-s.done:
		case <-ctx.Done():
			return ctx.Err()
		}
		if c.Hole {
			if err := writeZeros(w, c.Size); err != nil {
				return err
			}
			continue
		}
		if s.err != nil {
			return s.err
		}
		_, err := w.Write(s.buf.Bytes())
		chunkBufs.Put(s.buf)
		s.buf = nil
		<-ahead
		if err != nil {
			return err
		}
	}
	if whole {
		return checkWhole(name, *f, h)
	}
	return nil
}

// chunkBufs are the buffers Stream downloads chunks into: kept for the
// next chunk rather than allocated (and zeroed) for each.
var chunkBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// writeZeros writes n zero bytes to w.
func writeZeros(w io.Writer, n int64) error {
	for n > 0 {
		k := min(n, int64(len(zeros)))
		if _, err := w.Write(zeros[:k]); err != nil {
			return err
		}
		n -= k
	}
	return nil
}
