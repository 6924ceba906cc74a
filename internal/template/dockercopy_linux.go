//go:build linux

package template

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/bzip2"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// copyOpts say how files land in the rootfs.
type copyOpts struct {
	// owner of everything copied; nil keeps the source's (tar archives)
	owner *[2]uint32
	chmod fs.FileMode // 0 keeps the source's permissions
}

// copyStep carries out a COPY or ADD into rootfs (the step's own copy of the
// previous layer) and returns the bytes of regular files written. Paths in
// the rootfs are resolved as if it were /, so symbolic links in it never
// lead out of it.
func copyStep(rootfs string, srcs []contextSource, st dfStep) (int64, error) {
	// Docker: copied files are root's unless --chown says otherwise.
	o := copyOpts{owner: &[2]uint32{0, 0}, chmod: st.Chmod}
	if st.Chown != "" {
		uid, gid, err := lookupChown(rootfs, st.Chown)
		if err != nil {
			return 0, fmt.Errorf("--chown=%s: %w", st.Chown, err)
		}
		o.owner = &[2]uint32{uid, gid}
	}
	var total int64
	destIsDir := strings.HasSuffix(st.Dest, "/")
	for _, s := range srcs {
		fi, err := os.Lstat(s.Abs)
		if err != nil {
			return total, err
		}
		switch {
		case fi.IsDir():
			// A directory's contents go into the destination directory.
			n, err := copyDirInto(rootfs, s.Abs, st.Dest, o)
			total += n
			if err != nil {
				return total, err
			}
		case st.Add && fi.Mode().IsRegular():
			kind, err := archiveKind(s.Abs)
			if err != nil {
				return total, err
			}
			if kind != "" {
				n, err := extractInto(rootfs, s.Abs, kind, st.Dest, st.Chown != "", o)
				total += n
				if err != nil {
					return total, fmt.Errorf("extract %s: %w", s.Rel, err)
				}
				continue
			}
			fallthrough
		default:
			dest := st.Dest
			if destIsDir || isDirInRoot(rootfs, dest) {
				dest = path.Join(dest, path.Base(s.Rel))
			}
			n, err := copyOne(rootfs, s.Abs, fi, dest, o)
			total += n
			if err != nil {
				return total, err
			}
		}
	}
	return total, nil
}

func isDirInRoot(rootfs, p string) bool {
	h, err := resolveInRoot(rootfs, p)
	if err != nil {
		return false
	}
	fi, err := os.Stat(h)
	return err == nil && fi.IsDir()
}

// copyDirInto copies the contents of host directory src into directory dest
// of the rootfs.
func copyDirInto(rootfs, src, dest string, o copyOpts) (int64, error) {
	if err := mkdirInRoot(rootfs, dest, o.owner); err != nil {
		return 0, err
	}
	var total int64
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == src {
			return nil
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		n, err := copyOne(rootfs, p, fi, path.Join(dest, filepath.ToSlash(rel)), o)
		total += n
		return err
	})
	return total, err
}

// copyOne copies one host file, directory (itself, not its contents) or
// symbolic link to path dest of the rootfs. An existing directory there is
// kept (a copied directory merges into it); anything else is replaced.
func copyOne(rootfs, src string, fi fs.FileInfo, dest string, o copyOpts) (int64, error) {
	parent := path.Dir(path.Clean("/" + dest))
	if err := mkdirInRoot(rootfs, parent, o.owner); err != nil {
		return 0, err
	}
	hostParent, err := resolveInRoot(rootfs, parent)
	if err != nil {
		return 0, err
	}
	target := filepath.Join(hostParent, path.Base(path.Clean("/"+dest)))
	if fi.IsDir() {
		// A symbolic link to a directory in the rootfs is followed (inside
		// it): COPY rootfs/ / merges bin/ into /usr/bin on merged-/usr
		// systems.
		if h, err := resolveInRoot(rootfs, path.Clean("/"+dest)); err == nil {
			if st, err := os.Stat(h); err == nil && st.IsDir() {
				target = h
			}
		}
	}
	old, err := os.Lstat(target)
	switch {
	case err == nil && fi.IsDir() && old.IsDir():
	case err == nil:
		if err := os.RemoveAll(target); err != nil {
			return 0, err
		}
	case !errors.Is(err, fs.ErrNotExist):
		return 0, err
	}
	mode := fi.Mode().Perm() | fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)
	if o.chmod != 0 {
		mode = o.chmod & fs.ModePerm
	}
	var n int64
	switch {
	case fi.IsDir():
		if old == nil || !old.IsDir() {
			if err := os.Mkdir(target, 0o700); err != nil {
				return 0, err
			}
		}
	case fi.Mode()&fs.ModeSymlink != 0:
		t, err := os.Readlink(src)
		if err != nil {
			return 0, err
		}
		if err := os.Symlink(t, target); err != nil {
			return 0, err
		}
	case fi.Mode().IsRegular():
		if n, err = copyFileData(src, target); err != nil {
			return n, err
		}
	default:
		return 0, fmt.Errorf("%s: unsupported file type %s: %w", src, fi.Mode().Type(), errdefs.ErrInvalid)
	}
	return n, setAttrs(target, fi, mode, o.owner)
}

// setAttrs sets owner, mode and modification time of a copied entry.
func setAttrs(target string, fi fs.FileInfo, mode fs.FileMode, owner *[2]uint32) error {
	uid, gid := -1, -1
	if owner != nil {
		uid, gid = int(owner[0]), int(owner[1])
	} else if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		uid, gid = int(st.Uid), int(st.Gid)
	}
	if err := os.Lchown(target, uid, gid); err != nil {
		return err
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		return nil
	}
	// chmod after chown: chown clears setuid bits.
	if err := os.Chmod(target, modeBits(mode)); err != nil {
		return err
	}
	return os.Chtimes(target, time.Time{}, fi.ModTime())
}

// modeBits turns Go's mode bits into the ones chmod takes.
func modeBits(m fs.FileMode) fs.FileMode {
	return m & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
}

func copyFileData(src, dst string) (int64, error) {
	in, err := os.Open(src)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return n, err
}

// ---- ADD of archives ----

// archiveKind tells a tar archive ("tar", "gzip", "bzip2") from another
// file (""), by content as Docker does.
func archiveKind(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	head := make([]byte, 512)
	n, _ := io.ReadFull(f, head)
	head = head[:n]
	switch {
	case bytes.HasPrefix(head, []byte{0x1f, 0x8b}):
		return "gzip", nil
	case bytes.HasPrefix(head, []byte("BZh")):
		return "bzip2", nil
	case bytes.HasPrefix(head, []byte{0xfd, '7', 'z', 'X', 'Z', 0}):
		return "", fmt.Errorf("%s: xz-compressed archives are not supported (use .tar, .tar.gz or .tar.bz2): %w", filepath.Base(p), errdefs.ErrInvalid)
	case len(head) >= 262 && string(head[257:262]) == "ustar":
		return "tar", nil
	}
	return "", nil
}

// extractInto unpacks a tar archive into directory dest of the rootfs: it is
// first unpacked into an empty directory beside the rootfs (where entries
// that would leave it are refused), then copied in like a COPY of a
// directory. Without --chown the archive's owners are kept.
func extractInto(rootfs, archive, kind, dest string, chown bool, o copyOpts) (int64, error) {
	tmp, err := os.MkdirTemp(filepath.Dir(rootfs), ".add-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(tmp)
	if err := untarFile(archive, kind, tmp); err != nil {
		return 0, err
	}
	if !chown {
		o.owner = nil
	}
	return copyDirInto(rootfs, tmp, dest, o)
}

// untarFile unpacks archive, a tar file of kind (see archiveKind), into
// dir (see untar).
func untarFile(archive, kind, dir string) error {
	f, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer f.Close()
	var r io.Reader = bufio.NewReader(f)
	switch kind {
	case "gzip":
		zr, err := gzip.NewReader(r)
		if err != nil {
			return fmt.Errorf("%v: %w", err, errdefs.ErrInvalid)
		}
		defer zr.Close()
		r = zr
	case "bzip2":
		r = bzip2.NewReader(r)
	}
	return untar(r, dir)
}

// ExtractArchive unpacks archive, a tar file (plain, gzip or bzip2), into
// directory dir, keeping modes and owners and refusing entries that would
// land outside dir; devices and fifos are left out. It makes a build
// context of uploaded files (internal/e2b).
func ExtractArchive(archive, dir string) error {
	kind, err := archiveKind(archive)
	if err != nil {
		return err
	}
	if kind == "" {
		return fmt.Errorf("%s: not a tar archive (plain, gzip or bzip2): %w", filepath.Base(archive), errdefs.ErrInvalid)
	}
	if err := untarFile(archive, kind, dir); err != nil {
		return fmt.Errorf("%s: %w", filepath.Base(archive), err)
	}
	return nil
}

// untar unpacks a tar stream into dir, refusing entries that would land
// outside it (.. or through a symbolic link of the archive).
func untar(r io.Reader, dir string) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		name := path.Clean("/" + h.Name)
		if name == "/" {
			continue
		}
		if strings.Contains(h.Name, "..") && path.Clean(h.Name) != strings.TrimPrefix(name, "/") {
			return fmt.Errorf("entry %q leaves the archive's directory: %w", h.Name, errdefs.ErrInvalid)
		}
		target := filepath.Join(dir, filepath.FromSlash(name))
		if err := noSymlinkParents(dir, strings.TrimPrefix(name, "/")); err != nil {
			return fmt.Errorf("entry %q: %w", h.Name, err)
		}
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		if fi, err := os.Lstat(target); err == nil && !(fi.IsDir() && h.Typeflag == tar.TypeDir) {
			if err := os.RemoveAll(target); err != nil {
				return err
			}
		}
		mode := fs.FileMode(h.Mode) & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
		if h.Mode&0o4000 != 0 {
			mode |= fs.ModeSetuid
		}
		if h.Mode&0o2000 != 0 {
			mode |= fs.ModeSetgid
		}
		if h.Mode&0o1000 != 0 {
			mode |= fs.ModeSticky
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.Mkdir(target, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
				return err
			}
		case tar.TypeReg:
			out, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return err
			}
			_, err = io.Copy(out, tr)
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := os.Symlink(h.Linkname, target); err != nil {
				return err
			}
		case tar.TypeLink:
			ln := path.Clean("/" + h.Linkname)
			if err := noSymlinkParents(dir, strings.TrimPrefix(ln, "/")); err != nil {
				return fmt.Errorf("entry %q: %w", h.Name, err)
			}
			if err := os.Link(filepath.Join(dir, filepath.FromSlash(ln)), target); err != nil {
				return err
			}
			continue
		default:
			continue // devices, fifos: not made from a build context
		}
		if err := os.Lchown(target, h.Uid, h.Gid); err != nil {
			return err
		}
		if h.Typeflag != tar.TypeSymlink {
			if err := os.Chmod(target, modeBits(mode)); err != nil {
				return err
			}
			os.Chtimes(target, time.Time{}, h.ModTime)
		}
	}
}
