// Package objstore is the contract of an object store: a flat namespace of
// keys, each naming an immutable blob of bytes, in one bucket. Backends are
// subpackages (objstore/s3); objstore/objtest is the conformance suite every
// backend passes. The sandbox service makes checkpoint images durable in it
// (through package image); nothing else talks to a backend directly.
package objstore

import (
	"context"
	"io"
	"time"
)

// Store is an object store. Keys are non-empty, '/'-separated paths without
// a leading '/'. Every method honours ctx; a call cut short leaves either the
// old object or the new one, never a part (S3's semantics).
type Store interface {
	// Put stores r's bytes under key, read until EOF, replacing any object
	// there. The length need not be known: large objects are streamed in
	// parts, never held whole in memory. A failed Put leaves no object
	// under key that was not there before (an object that was there may be
	// gone or kept).
	Put(ctx context.Context, key string, r io.Reader) (Info, error)
	// Get opens key's bytes from offset off for n bytes (n < 0: to the end).
	// A missing key is errdefs.ErrNotFound; an offset past the end,
	// errdefs.ErrInvalid. The caller closes the reader.
	Get(ctx context.Context, key string, off, n int64) (io.ReadCloser, error)
	// Stat describes key; a missing key is errdefs.ErrNotFound.
	Stat(ctx context.Context, key string) (Info, error)
	// Delete removes key; a missing key is not an error.
	Delete(ctx context.Context, key string) error
	// List calls fn for every key that starts with prefix, in lexical
	// order, until fn returns an error, which List returns.
	List(ctx context.Context, prefix string, fn func(Info) error) error
}

// Info describes a stored object.
type Info struct {
	Key      string
	Size     int64
	Modified time.Time
}
