package server

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/lizard-build/lizard/internal/agent"
)

// The file operations below run either in the agent (for root) or in the
// __fileop child that runs as the sandbox user, so the kernel's own
// permission checks decide. They take clean absolute paths.

const (
	// newFileMode is the mode of files PUT creates.
	newFileMode = 0o644
	// newDirMode is the mode of parent directories PUT and move create.
	newDirMode = 0o755
	// maxTempBase bounds the part of a file name reused in its temp name,
	// keeping that within NAME_MAX.
	maxTempBase = 64
)

// openRegular opens p for reading; it must be a regular file.
func openRegular(p string) (*os.File, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return nil, err
	}
	if fi.IsDir() {
		return nil, &fs.PathError{Op: "read", Path: p, Err: syscall.EISDIR}
	}
	if !fi.Mode().IsRegular() {
		return nil, errInvalid("read %s: not a regular file", p)
	}
	return os.Open(p)
}

// writeFile replaces the file at p with the bytes of src, atomically: it
// writes a temp file in the same directory and renames it over p. Missing
// parents are created. An existing file keeps its mode (and, when root
// writes, its owner); a new one gets newFileMode. A symlink is written
// through to its target. The file's metadata (envd_metadata.go) is md
// alone: a replaced file's does not carry over.
func writeFile(p string, src io.Reader, md map[string]string) error {
	target, existing, err := writeTarget(p)
	if err != nil {
		return err
	}
	dir := filepath.Dir(target)
	if err := os.MkdirAll(dir, newDirMode); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, tempPattern(target))
	if err != nil {
		return err
	}
	committed := false
	defer func() {
		if !committed {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err := io.Copy(tmp, src); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	if err := keepAttrs(tmp, existing); err != nil {
		return err
	}
	if err := writeMetadata(tmp, md); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), target); err != nil {
		return err
	}
	committed = true
	return nil
}

// writeTarget resolves the file PUT replaces and returns what is there now
// (nil when nothing is).
func writeTarget(p string) (string, os.FileInfo, error) {
	fi, err := os.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return p, nil, nil
	}
	if err != nil {
		return "", nil, err
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		real, err := filepath.EvalSymlinks(p)
		if errors.Is(err, fs.ErrNotExist) {
			// A dangling link is replaced by the file.
			return p, nil, nil
		}
		if err != nil {
			return "", nil, err
		}
		return writeTarget(real)
	}
	if fi.IsDir() {
		return "", nil, &fs.PathError{Op: "write", Path: p, Err: syscall.EISDIR}
	}
	if !fi.Mode().IsRegular() {
		return "", nil, errInvalid("write %s: not a regular file", p)
	}
	return p, fi, nil
}

func tempPattern(target string) string {
	base := filepath.Base(target)
	if len(base) > maxTempBase {
		base = base[:maxTempBase]
	}
	return "." + base + ".lizard-*.tmp"
}

// isTempName says whether name is one of writeFile's temp files, made from
// tempPattern; watchers hide them.
func isTempName(name string) bool {
	inner, ok := strings.CutPrefix(name, ".")
	if !ok {
		return false
	}
	if inner, ok = strings.CutSuffix(inner, ".tmp"); !ok {
		return false
	}
	i := strings.LastIndex(inner, ".lizard-")
	if i <= 0 {
		return false
	}
	random := inner[i+len(".lizard-"):]
	return random != "" && strings.Trim(random, "0123456789") == ""
}

// keepAttrs gives the temp file the mode (and for root the owner) of the
// file it replaces. chown comes first because it clears setuid bits.
func keepAttrs(tmp *os.File, existing os.FileInfo) error {
	mode := uint32(newFileMode)
	if existing != nil {
		st := existing.Sys().(*syscall.Stat_t)
		mode = st.Mode & 0o7777
		if os.Geteuid() == 0 {
			if err := tmp.Chown(int(st.Uid), int(st.Gid)); err != nil {
				return err
			}
		}
	}
	if err := syscall.Fchmod(int(tmp.Fd()), mode); err != nil {
		return &fs.PathError{Op: "chmod", Path: tmp.Name(), Err: err}
	}
	return nil
}

// checkReadable fails unless this process may read p, a directory (list
// it: read and search) or anything else (read it). access(2) checks the
// real ids, which in the __fileop child are the user's.
func checkReadable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	mode := uint32(unix.R_OK)
	if fi.IsDir() {
		mode |= unix.X_OK
	}
	if err := unix.Access(p, mode); err != nil {
		return &fs.PathError{Op: "access", Path: p, Err: err}
	}
	return nil
}

// removePath removes p, recursively for directories.
func removePath(p string) error {
	if p == "/" {
		return errInvalid("refusing to remove /")
	}
	if _, err := os.Lstat(p); err != nil {
		return err
	}
	return os.RemoveAll(p)
}

// movePath renames from to to, creating to's parents. Across file systems
// regular files are copied and the source removed; directories are not.
func movePath(from, to string) error {
	if _, err := os.Lstat(from); err != nil {
		return err
	}
	if from == to {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(to), newDirMode); err != nil {
		return err
	}
	err := os.Rename(from, to)
	if errors.Is(err, syscall.EXDEV) {
		return copyThenRemove(from, to, err)
	}
	return err
}

func copyThenRemove(from, to string, renameErr error) error {
	fi, err := os.Lstat(from)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return renameErr
	}
	src, err := os.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	if err := writeFile(to, src, readMetadata(from)); err != nil {
		return err
	}
	if err := os.Chmod(to, fi.Mode()); err != nil {
		return err
	}
	return os.Remove(from)
}

// listDir lists the directory p (symlinks to directories are followed);
// never nil.
func listDir(p string) ([]agent.FileEntry, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return nil, &fs.PathError{Op: "list", Path: p, Err: syscall.ENOTDIR}
	}
	ents, err := os.ReadDir(p)
	if err != nil {
		return nil, err
	}
	out := make([]agent.FileEntry, 0, len(ents))
	for _, e := range ents {
		info, err := e.Info()
		if err != nil {
			continue // removed since ReadDir
		}
		out = append(out, agent.FileEntry{
			Name: e.Name(),
			Path: filepath.Join(p, e.Name()),
			Type: fileType(info.Mode()),
			Size: info.Size(),
		})
	}
	return out, nil
}

// statPath describes p without following a final symlink.
func statPath(p string) (agent.FileStat, error) {
	fi, err := os.Lstat(p)
	if err != nil {
		return agent.FileStat{}, err
	}
	st := fi.Sys().(*syscall.Stat_t)
	out := agent.FileStat{
		Name:        fi.Name(),
		Path:        p,
		Type:        fileType(fi.Mode()),
		Size:        fi.Size(),
		Mode:        st.Mode & 0o7777,
		Permissions: permString(st.Mode),
		Owner:       userName(st.Uid),
		Group:       groupName(st.Gid),
		ModTime:     fi.ModTime().UnixMilli(),
		ModifiedAt:  fi.ModTime().UnixMilli(),
	}
	if out.Type == "symlink" {
		if out.SymlinkTarget, err = os.Readlink(p); err != nil {
			return agent.FileStat{}, err
		}
	}
	return out, nil
}

// fileType maps a mode to the protocol's three types; devices, pipes and
// sockets count as files.
func fileType(m fs.FileMode) string {
	switch {
	case m&fs.ModeSymlink != 0:
		return "symlink"
	case m.IsDir():
		return "dir"
	}
	return "file"
}

// permString renders st_mode like ls -l: "-rw-r--r--", "drwxrwxrwt".
func permString(mode uint32) string {
	b := []byte("----------")
	switch mode & syscall.S_IFMT {
	case syscall.S_IFDIR:
		b[0] = 'd'
	case syscall.S_IFLNK:
		b[0] = 'l'
	case syscall.S_IFIFO:
		b[0] = 'p'
	case syscall.S_IFSOCK:
		b[0] = 's'
	case syscall.S_IFCHR:
		b[0] = 'c'
	case syscall.S_IFBLK:
		b[0] = 'b'
	}
	const rwx = "rwxrwxrwx"
	for i := range 9 {
		if mode&(1<<(8-i)) != 0 {
			b[i+1] = rwx[i]
		}
	}
	special(b, 3, mode&syscall.S_ISUID != 0, 's')
	special(b, 6, mode&syscall.S_ISGID != 0, 's')
	special(b, 9, mode&syscall.S_ISVTX != 0, 't')
	return string(b)
}

// special marks a setuid, setgid or sticky bit in the execute slot at i:
// lower case when execute is also set, upper case when not.
func special(b []byte, i int, set bool, c byte) {
	if !set {
		return
	}
	if b[i] == 'x' {
		b[i] = c
	} else {
		b[i] = c - 'a' + 'A'
	}
}

func userName(uid uint32) string {
	id := strconv.FormatUint(uint64(uid), 10)
	if u, err := user.LookupId(id); err == nil {
		return u.Username
	}
	return id
}

func groupName(gid uint32) string {
	id := strconv.FormatUint(uint64(gid), 10)
	if g, err := user.LookupGroupId(id); err == nil {
		return g.Name
	}
	return id
}
