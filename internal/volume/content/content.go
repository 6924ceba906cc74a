// Package content is a volume's files by path, confined to the volume's
// root: what E2B's volume content API does (stat, list to a depth, make a
// directory, read, write, change owner and mode, remove). The same code
// runs in two places: on the host, over the data directory of a volume no
// sandbox holds (internal/volume lends it), and inside the sandbox that
// holds a volume, over its mount point, as `lizard volume-content` run
// through the sandbox's agent (Main; Request and Reply are what travels).
// Every path is resolved with an os.Root, so a symbolic link cannot lead
// out of the volume. internal/e2b and cmd/lizard use it.
package content

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// Entry is a file, directory or symbolic link of a volume, as E2B's
// VolumeEntryStat: Path is absolute in the volume ("/" its root), Mode the
// permission bits (0o7777), Target a link's target.
type Entry struct {
	Name   string    `json:"name"`
	Type   string    `json:"type"` // file, directory, symlink or unknown
	Path   string    `json:"path"`
	Size   int64     `json:"size"`
	Mode   uint32    `json:"mode"`
	UID    uint32    `json:"uid"`
	GID    uint32    `json:"gid"`
	Atime  time.Time `json:"atime"`
	Mtime  time.Time `json:"mtime"`
	Ctime  time.Time `json:"ctime"`
	Target string    `json:"target,omitempty"`
}

// Attrs are an entry's owner and mode as a request sets them; nil fields
// are left as they are (on a new entry: DefaultUID, DefaultGID and
// DefaultFileMode or DefaultDirMode).
type Attrs struct {
	UID  *uint32 `json:"uid,omitempty"`
	GID  *uint32 `json:"gid,omitempty"`
	Mode *uint32 `json:"mode,omitempty"`
}

// What a new entry gets when the request does not say: the owner of a
// volume's root, the user sandboxes run commands as (uid 1000), so that
// what the API writes the sandbox's user may change.
const (
	DefaultUID      = 1000
	DefaultGID      = 1000
	DefaultFileMode = 0o644
	DefaultDirMode  = 0o755
)

// Limits of a listing.
const (
	MaxDepth   = 64
	MaxEntries = 10000
)

// UploadPrefix begins the name of a file being written (in the target's
// directory, renamed over the target when complete): a write is all or
// nothing.
const UploadPrefix = ".lizard-upload-"

// FS is a volume's files under its root directory.
type FS struct {
	root *os.Root
}

// Open opens the volume whose root is dir.
func Open(dir string) (*FS, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("open the volume's root: %w", err)
	}
	return &FS{root: root}, nil
}

// Close releases the root.
func (f *FS) Close() error { return f.root.Close() }

// Clean turns a path of the API ("/a/b", "a/b/", "/") into its absolute
// form in the volume ("/a/b", "/"); it never leads above the root.
func Clean(p string) (string, error) {
	if p == "" {
		return "", invalid("path: required (\"/\" is the volume's root)")
	}
	if strings.ContainsRune(p, 0) {
		return "", invalid("path %q: contains a NUL byte", p)
	}
	return path.Clean("/" + p), nil
}

// rel is p (absolute in the volume) as os.Root names it.
func rel(p string) string {
	if p == "/" {
		return "."
	}
	return strings.TrimPrefix(p, "/")
}

// Stat describes p; a symbolic link itself, not its target.
func (f *FS) Stat(p string) (Entry, error) {
	p, err := Clean(p)
	if err != nil {
		return Entry{}, err
	}
	fi, err := f.root.Lstat(rel(p))
	if err != nil {
		return Entry{}, pathError(p, err)
	}
	return f.entry(p, fi), nil
}

// entry describes p, whose Lstat is fi.
func (f *FS) entry(p string, fi fs.FileInfo) Entry {
	e := Entry{Name: path.Base(p), Path: p, Size: fi.Size(), Mode: uint32(fi.Mode().Perm()), Type: "unknown"}
	if p == "/" {
		e.Name = "/"
	}
	switch {
	case fi.Mode().IsRegular():
		e.Type = "file"
	case fi.IsDir():
		e.Type = "directory"
	case fi.Mode()&fs.ModeSymlink != 0:
		e.Type = "symlink"
		e.Target, _ = f.root.Readlink(rel(p))
	}
	e.Mtime = fi.ModTime().UTC()
	e.Atime, e.Ctime = e.Mtime, e.Mtime
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.Mode = st.Mode & 0o7777 // with the set-id and sticky bits
		e.UID, e.GID = st.Uid, st.Gid
		e.Atime = time.Unix(st.Atim.Unix()).UTC()
		e.Ctime = time.Unix(st.Ctim.Unix()).UTC()
	}
	return e
}

// fileMode is the fs.FileMode of chmod(2) bits u.
func fileMode(u uint32) fs.FileMode {
	m := fs.FileMode(u & 0o777)
	if u&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if u&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if u&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m
}

// List lists the directory p: its entries, and theirs down to depth levels
// (1: the directory's own), sorted by path. Links are not followed.
func (f *FS) List(p string, depth int) ([]Entry, error) {
	p, err := Clean(p)
	if err != nil {
		return nil, err
	}
	if depth < 1 || depth > MaxDepth {
		return nil, invalid("depth %d: must be 1 to %d", depth, MaxDepth)
	}
	fi, err := f.root.Stat(rel(p))
	if err != nil {
		return nil, pathError(p, err)
	}
	if !fi.IsDir() {
		return nil, errdefs.WithCode("not_a_directory", fmt.Errorf("path %q is not a directory: %w", p, errdefs.ErrNotFound))
	}
	out := []Entry{}
	var walk func(dir string, level int) error
	walk = func(dir string, level int) error {
		d, err := f.root.Open(rel(dir))
		if err != nil {
			return pathError(dir, err)
		}
		names, err := d.Readdirnames(-1)
		d.Close()
		if err != nil {
			return pathError(dir, err)
		}
		slices.Sort(names)
		for _, name := range names {
			child := path.Join(dir, name)
			fi, err := f.root.Lstat(rel(child))
			if errors.Is(err, fs.ErrNotExist) {
				continue // removed meanwhile
			}
			if err != nil {
				return pathError(child, err)
			}
			if len(out) == MaxEntries {
				return errdefs.WithCode("too_many_entries", fmt.Errorf("path %q holds more than %d entries within depth %d: list a directory below it or a smaller depth: %w", p, MaxEntries, depth, errdefs.ErrTooLarge))
			}
			out = append(out, f.entry(child, fi))
			if fi.IsDir() && level < depth {
				if err := walk(child, level+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	if err := walk(p, 1); err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b Entry) int { return strings.Compare(a.Path, b.Path) })
	return out, nil
}

// MakeDir makes the directory p with attrs. Without force its parent must
// exist and p must not; with force the missing parents are made too (with
// the same attrs) and an existing directory is answered as it is.
func (f *FS) MakeDir(p string, a Attrs, force bool) (Entry, error) {
	p, err := Clean(p)
	if err != nil {
		return Entry{}, err
	}
	if err := a.check(); err != nil {
		return Entry{}, err
	}
	if p == "/" {
		if force {
			return f.Stat(p)
		}
		return Entry{}, exists(p)
	}
	if fi, err := f.root.Lstat(rel(p)); err == nil {
		if force && fi.IsDir() {
			return f.entry(p, fi), nil
		}
		return Entry{}, exists(p)
	}
	parent := path.Dir(p)
	pfi, err := f.root.Stat(rel(parent))
	switch {
	case errors.Is(err, fs.ErrNotExist) && force:
		if _, err := f.MakeDir(parent, a, true); err != nil {
			return Entry{}, err
		}
	case err != nil:
		return Entry{}, pathError(parent, err)
	case !pfi.IsDir():
		return Entry{}, errdefs.WithCode("not_a_directory", fmt.Errorf("path %q is not a directory: %w", parent, errdefs.ErrConflict))
	}
	if err := f.root.Mkdir(rel(p), 0o700); err != nil {
		if force && errors.Is(err, fs.ErrExist) {
			return f.MakeDir(p, a, true) // made meanwhile
		}
		return Entry{}, pathError(p, err)
	}
	return f.apply(p, a.orDefault(DefaultDirMode))
}

// check refuses a mode beyond chmod's bits.
func (a Attrs) check() error {
	if a.Mode != nil && *a.Mode > 0o7777 {
		return invalid("mode %#o: must be at most 0o7777 (permission, set-id and sticky bits)", *a.Mode)
	}
	return nil
}

// orDefault is a with a new entry's defaults where it says nothing.
func (a Attrs) orDefault(mode uint32) Attrs {
	uid, gid := uint32(DefaultUID), uint32(DefaultGID)
	if a.UID == nil {
		a.UID = &uid
	}
	if a.GID == nil {
		a.GID = &gid
	}
	if a.Mode == nil {
		a.Mode = &mode
	}
	return a
}

// SetAttrs changes p's owner and mode (a symbolic link's own owner; its
// mode does not change) and describes it.
func (f *FS) SetAttrs(p string, a Attrs) (Entry, error) {
	p, err := Clean(p)
	if err != nil {
		return Entry{}, err
	}
	if err := a.check(); err != nil {
		return Entry{}, err
	}
	if _, err := f.root.Lstat(rel(p)); err != nil {
		return Entry{}, pathError(p, err)
	}
	return f.apply(p, a)
}

// apply sets p's owner and mode as a says and describes it.
func (f *FS) apply(p string, a Attrs) (Entry, error) {
	fi, err := f.root.Lstat(rel(p))
	if err != nil {
		return Entry{}, pathError(p, err)
	}
	link := fi.Mode()&fs.ModeSymlink != 0
	if a.UID != nil || a.GID != nil {
		uid, gid := -1, -1
		if a.UID != nil {
			uid = int(*a.UID)
		}
		if a.GID != nil {
			gid = int(*a.GID)
		}
		if err := f.root.Lchown(rel(p), uid, gid); err != nil {
			return Entry{}, pathError(p, err)
		}
	}
	if a.Mode != nil && !link {
		if err := f.root.Chmod(rel(p), fileMode(*a.Mode)); err != nil {
			return Entry{}, pathError(p, err)
		}
	}
	return f.Stat(p)
}

// Remove removes p, a directory with everything in it. The root stays.
func (f *FS) Remove(p string) error {
	p, err := Clean(p)
	if err != nil {
		return err
	}
	if p == "/" {
		return invalid("path \"/\": the volume's root cannot be removed (remove what is in it)")
	}
	if _, err := f.root.Lstat(rel(p)); err != nil {
		return pathError(p, err)
	}
	if err := f.root.RemoveAll(rel(p)); err != nil {
		return pathError(p, err)
	}
	return nil
}

// CheckRead describes p, which must be a file (links within the volume
// followed): what a read reads.
func (f *FS) CheckRead(p string) (Entry, error) {
	p, err := Clean(p)
	if err != nil {
		return Entry{}, err
	}
	fi, err := f.root.Stat(rel(p))
	if err != nil {
		return Entry{}, pathError(p, err)
	}
	if !fi.Mode().IsRegular() {
		return Entry{}, errdefs.WithCode("not_a_file", fmt.Errorf("path %q is not a file: %w", p, errdefs.ErrNotFound))
	}
	return f.entry(p, fi), nil
}

// OpenRead opens the file p for reading.
func (f *FS) OpenRead(p string) (*os.File, Entry, error) {
	e, err := f.CheckRead(p)
	if err != nil {
		return nil, Entry{}, err
	}
	file, err := f.root.Open(rel(e.Path))
	if err != nil {
		return nil, Entry{}, pathError(e.Path, err)
	}
	return file, e, nil
}

// CheckWrite checks that p may be written: its parent is a directory and
// p is not there, or (with force) is a file. It returns the path of a new
// upload file beside p, for Commit.
func (f *FS) CheckWrite(p string, force bool) (string, error) {
	p, err := Clean(p)
	if err != nil {
		return "", err
	}
	if p == "/" {
		return "", errdefs.WithCode("is_a_directory", fmt.Errorf("path \"/\" is the volume's root, a directory: %w", errdefs.ErrConflict))
	}
	parent := path.Dir(p)
	pfi, err := f.root.Stat(rel(parent))
	if err != nil {
		return "", pathError(parent, err)
	}
	if !pfi.IsDir() {
		return "", errdefs.WithCode("not_a_directory", fmt.Errorf("path %q is not a directory: %w", parent, errdefs.ErrNotFound))
	}
	if fi, err := f.root.Lstat(rel(p)); err == nil {
		if fi.IsDir() {
			return "", errdefs.WithCode("is_a_directory", fmt.Errorf("path %q is a directory: %w", p, errdefs.ErrConflict))
		}
		if !force {
			return "", exists(p)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", pathError(p, err)
	}
	var b [8]byte
	rand.Read(b[:])
	return path.Join(parent, UploadPrefix+hex.EncodeToString(b[:])), nil
}

// Write writes what r gives to the file p, with attrs: through an upload
// file beside it, renamed over p when complete (a failed write leaves p
// as it was).
func (f *FS) Write(p string, r io.Reader, a Attrs, force bool) (Entry, error) {
	if err := a.check(); err != nil {
		return Entry{}, err
	}
	upload, err := f.CheckWrite(p, force)
	if err != nil {
		return Entry{}, err
	}
	file, err := f.root.OpenFile(rel(upload), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return Entry{}, pathError(upload, err)
	}
	src := &source{r: r}
	_, err = io.Copy(file, src)
	if cerr := file.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		f.root.Remove(rel(upload))
		if src.err != nil {
			return Entry{}, errdefs.WithCause(errdefs.ErrInvalid, fmt.Sprintf("write %q: the content could not be read to its end", p), src.err)
		}
		return Entry{}, pathError(p, err)
	}
	return f.Commit(upload, p, a, force)
}

// source is a reader that keeps its error: a write's failure on the
// writer's side, not the volume's.
type source struct {
	r   io.Reader
	err error
}

func (s *source) Read(b []byte) (int, error) {
	n, err := s.r.Read(b)
	if err != nil && err != io.EOF {
		s.err = err
	}
	return n, err
}

// Commit puts the complete upload file in p's place, with attrs (a new
// file's defaults where they say nothing): over a file p only with force,
// never over a directory. The upload is removed when it fails.
func (f *FS) Commit(upload, p string, a Attrs, force bool) (_ Entry, err error) {
	if p, err = Clean(p); err != nil {
		return Entry{}, err
	}
	if upload, err = Clean(upload); err != nil {
		return Entry{}, err
	}
	if path.Dir(upload) != path.Dir(p) || !strings.HasPrefix(path.Base(upload), UploadPrefix) {
		return Entry{}, invalid("upload %q: not an upload file beside %q", upload, p)
	}
	if err := a.check(); err != nil {
		return Entry{}, err
	}
	defer func() {
		if err != nil {
			f.root.Remove(rel(upload))
		}
	}()
	if _, err := f.apply(upload, a.orDefault(DefaultFileMode)); err != nil {
		return Entry{}, err
	}
	if force {
		if fi, err := f.root.Lstat(rel(p)); err == nil && fi.IsDir() {
			return Entry{}, errdefs.WithCode("is_a_directory", fmt.Errorf("path %q is a directory: %w", p, errdefs.ErrConflict))
		}
		if err := f.root.Rename(rel(upload), rel(p)); err != nil {
			return Entry{}, pathError(p, err)
		}
		return f.Stat(p)
	}
	// Without force, p must not exist: a link fails if it does, atomically.
	if err := f.root.Link(rel(upload), rel(p)); err != nil {
		return Entry{}, pathError(p, err)
	}
	f.root.Remove(rel(upload))
	return f.Stat(p)
}

func invalid(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, errdefs.ErrInvalid)...)
}

func exists(p string) error {
	return errdefs.WithCode("path_exists", fmt.Errorf("path %q exists: %w", p, errdefs.ErrConflict))
}

// pathError classes a filesystem error of p, naming p as the volume has
// it (never a host path).
func pathError(p string, err error) error {
	var errno syscall.Errno
	errors.As(err, &errno)
	// os.Root's refusal of a path that leads out of the root is a
	// PathError of no errno (its sentinel is not exported).
	var pe *fs.PathError
	escapes := errors.As(err, &pe) && !errors.As(pe.Err, new(syscall.Errno))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return errdefs.WithCode("path_not_found", fmt.Errorf("path %q: not found: %w", p, errdefs.ErrNotFound))
	case errors.Is(err, fs.ErrExist):
		return exists(p)
	case errno == syscall.ENOTDIR:
		return errdefs.WithCode("not_a_directory", fmt.Errorf("path %q: a part of it is not a directory: %w", p, errdefs.ErrNotFound))
	case errno == syscall.EISDIR:
		return errdefs.WithCode("is_a_directory", fmt.Errorf("path %q is a directory: %w", p, errdefs.ErrConflict))
	case errno == syscall.ENOSPC:
		return errdefs.WithCode("volume_full", fmt.Errorf("path %q: no space left on device (the volume is full): %w", p, errdefs.ErrNoSpace))
	case errno == syscall.ELOOP || escapes:
		return errdefs.WithCode("path_escapes", fmt.Errorf("path %q leads out of the volume (through a symbolic link that is absolute or climbs above its root): %w", p, errdefs.ErrPermission))
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("path %q: permission denied: %w", p, errdefs.ErrPermission)
	}
	return errdefs.WithCause(errdefs.ErrUnavailable, fmt.Sprintf("path %q: the volume's filesystem failed", p), err)
}
