package durable

import (
	"errors"
	"os"

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

// readSpan reads [off, off+len(buf)) of f into buf, zeroed first, reading
// only where exts (in order) hold data; it returns the bytes read from f.
func readSpan(f *os.File, exts []Extent, off int64, buf []byte) (int64, error) {
	clear(buf)
	end := off + int64(len(buf))
	var read int64
	for _, e := range overlapping(exts, off, end) {
		s, t := max(e.Off, off), min(e.End, end)
		n, err := f.ReadAt(buf[s-off:t-off], s)
		read += int64(n)
		if err != nil {
			return read, err
		}
	}
	return read, nil
}

// overlapping is the extents of exts (in order) that meet [off, end).
func overlapping(exts []Extent, off, end int64) []Extent {
	lo, hi := 0, len(exts)
	// The first extent ending after off.
	for lo < hi {
		mid := (lo + hi) / 2
		if exts[mid].End <= off {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	n := lo
	for n < len(exts) && exts[n].Off < end {
		n++
	}
	return exts[lo:n]
}
