package durable

import (
	"errors"
	"fmt"
	"os"
	"runtime/debug"

	"golang.org/x/sys/unix"
)

// Extent is a run of a file's data, [Off, End); what lies between extents
// is a hole, read as zeros and stored nowhere.
type Extent struct{ Off, End int64 }

// DataExtents returns the data runs of f, whose size is size, in order,
// found with lseek SEEK_DATA/SEEK_HOLE, so that a sparse file's holes are
// never read. A filesystem that cannot tell holes reports the whole file as
// data.
func DataExtents(f *os.File, size int64) ([]Extent, error) {
	fd := int(f.Fd())
	var out []Extent
	for off := int64(0); off < size; {
		start, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // a hole up to the end
		}
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) {
			return []Extent{{0, size}}, nil
		}
		if err != nil {
			return nil, &os.PathError{Op: "lseek SEEK_DATA", Path: f.Name(), Err: err}
		}
		if start >= size {
			break
		}
		end, err := unix.Seek(fd, start, unix.SEEK_HOLE)
		if err != nil {
			return nil, &os.PathError{Op: "lseek SEEK_HOLE", Path: f.Name(), Err: err}
		}
		end = min(end, size)
		out = append(out, Extent{start, end})
		off = end
	}
	return out, nil
}

// mapFile maps the size bytes of f read-only, for sequential reading
// (nil when size is 0); unmap ends the mapping. Reading a hole gives
// zeros; reading past the end of a file that shrank meanwhile faults
// (SIGBUS): read it under guard.
func mapFile(f *os.File, size int64) (b []byte, unmap func(), err error) {
	if size == 0 {
		return nil, func() {}, nil
	}
	b, err = unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, nil, &os.PathError{Op: "mmap", Path: f.Name(), Err: err}
	}
	unix.Madvise(b, unix.MADV_SEQUENTIAL)
	return b, func() { unix.Munmap(b) }, nil
}

// guard runs fn, which reads a mapping of mapFile: a fault there (the file
// shrank while mapped) is an error, not a crash.
func guard(fn func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(interface{ Addr() uintptr }); !ok {
				panic(r)
			}
			err = fmt.Errorf("the file changed while it was read: %v", r)
		}
	}()
	return fn()
}
