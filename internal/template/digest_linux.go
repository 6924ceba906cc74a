//go:build linux

package template

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	goruntime "runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// manifestOf lists the tree rootfs in the manifest format (see
// manifestFile): one line per entry, in lexical order of the paths, with
// its type, permission bits, owner, size, the SHA-256 of a regular file's
// bytes, a link's target, a device's numbers and the extended attributes.
// Times are left out: two builds that make the same files at different
// times make the same manifest. Files are hashed by as many goroutines as
// there are CPUs, and a hard-linked file once.
func manifestOf(rootfs string) ([]byte, error) {
	type entry struct {
		rel  string
		fi   fs.FileInfo
		sum  string // regular files: filled in by the hashers
		line string
	}
	var entries []*entry
	err := filepath.WalkDir(rootfs, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(rootfs, p)
		if err != nil {
			return err
		}
		entries = append(entries, &entry{rel: rel, fi: fi})
		return nil
	})
	if err != nil {
		return nil, err
	}

	// Hash the regular files: each inode once.
	type inode struct{ dev, ino uint64 }
	byInode := map[inode][]*entry{}
	var inodes []inode
	for _, e := range entries {
		if !e.fi.Mode().IsRegular() {
			continue
		}
		st := e.fi.Sys().(*syscall.Stat_t)
		k := inode{uint64(st.Dev), st.Ino}
		if _, ok := byInode[k]; !ok {
			inodes = append(inodes, k)
		}
		byInode[k] = append(byInode[k], e)
	}
	work := make(chan inode)
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for range max(1, goruntime.NumCPU()) {
		wg.Go(func() {
			buf := make([]byte, 256<<10)
			for k := range work {
				es := byInode[k]
				sum, err := hashFile(filepath.Join(rootfs, es[0].rel), buf)
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				}
				for _, e := range es {
					e.sum = sum
				}
				mu.Unlock()
			}
		})
	}
	for _, k := range inodes {
		work <- k
	}
	close(work)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}

	sort.Slice(entries, func(i, j int) bool { return entries[i].rel < entries[j].rel })
	var out bytes.Buffer
	out.WriteString(manifestHeader + "\n")
	for _, e := range entries {
		line, err := manifestLine(filepath.Join(rootfs, e.rel), e.rel, e.fi, e.sum)
		if err != nil {
			return nil, err
		}
		out.WriteString(line)
		out.WriteByte('\n')
	}
	return out.Bytes(), nil
}

// manifestHeader is the first line of every manifest; a new format gets a
// new header.
const manifestHeader = "lizard-manifest v1"

// manifestLine is one entry of a manifest:
//
//	<type> <perm> <uid> <gid> <what> <xattrs> <path>
//
// type is d, f, l, c, b, p or s; perm the octal permission bits with
// setuid, setgid and sticky; what the size and SHA-256 of a file
// ("<size>:<hex>"), the target of a link, a device's "<major>,<minor>", "-"
// otherwise; xattrs "-" or "name=hex,..." sorted; targets and paths quoted
// as Go strings.
func manifestLine(abs, rel string, fi fs.FileInfo, sum string) (string, error) {
	st := fi.Sys().(*syscall.Stat_t)
	mode := fi.Mode()
	perm := uint32(mode.Perm())
	if mode&fs.ModeSetuid != 0 {
		perm |= 0o4000
	}
	if mode&fs.ModeSetgid != 0 {
		perm |= 0o2000
	}
	if mode&fs.ModeSticky != 0 {
		perm |= 0o1000
	}
	var typ, what string
	switch {
	case mode.IsRegular():
		typ, what = "f", strconv.FormatInt(fi.Size(), 10)+":"+sum
	case mode.IsDir():
		typ, what = "d", "-"
	case mode&fs.ModeSymlink != 0:
		target, err := os.Readlink(abs)
		if err != nil {
			return "", err
		}
		typ, what = "l", strconv.Quote(target)
		perm = 0 // not meaningful on Linux, and not kept by every copy
	case mode&fs.ModeCharDevice != 0:
		typ, what = "c", fmt.Sprintf("%d,%d", unix.Major(uint64(st.Rdev)), unix.Minor(uint64(st.Rdev)))
	case mode&fs.ModeDevice != 0:
		typ, what = "b", fmt.Sprintf("%d,%d", unix.Major(uint64(st.Rdev)), unix.Minor(uint64(st.Rdev)))
	case mode&fs.ModeNamedPipe != 0:
		typ, what = "p", "-"
	case mode&fs.ModeSocket != 0:
		typ, what = "s", "-"
	default:
		return "", fmt.Errorf("%s: unknown file type %v", abs, mode.Type())
	}
	xa, err := xattrsOf(abs)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s %04o %d %d %s %s %s", typ, perm, st.Uid, st.Gid, what, xa, strconv.Quote(rel)), nil
}

// xattrsOf renders the extended attributes of path (not followed) for a
// manifest: "-" when there are none. security.selinux is left out: it is
// the host's label, not the template's.
func xattrsOf(path string) (string, error) {
	size, err := unix.Llistxattr(path, nil)
	if err != nil {
		if errors.Is(err, unix.ENOTSUP) {
			return "-", nil
		}
		return "", fmt.Errorf("list xattrs of %s: %w", path, err)
	}
	if size == 0 {
		return "-", nil
	}
	buf := make([]byte, size)
	n, err := unix.Llistxattr(path, buf)
	if err != nil {
		return "", fmt.Errorf("list xattrs of %s: %w", path, err)
	}
	var names []string
	for _, name := range strings.Split(string(buf[:n]), "\x00") {
		if name != "" && name != "security.selinux" {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return "-", nil
	}
	sort.Strings(names)
	parts := make([]string, 0, len(names))
	for _, name := range names {
		vsize, err := unix.Lgetxattr(path, name, nil)
		if err != nil {
			return "", fmt.Errorf("xattr %s of %s: %w", name, path, err)
		}
		val := make([]byte, vsize)
		vn, err := unix.Lgetxattr(path, name, val)
		if err != nil {
			return "", fmt.Errorf("xattr %s of %s: %w", name, path, err)
		}
		parts = append(parts, name+"="+hex.EncodeToString(val[:vn]))
	}
	return strings.Join(parts, ","), nil
}

// hashFile is the hex SHA-256 of the file at path.
func hashFile(path string, buf []byte) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.CopyBuffer(h, f, buf); err != nil {
		return "", fmt.Errorf("hash %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// writeManifest writes the manifest of vdir's rootfs into vdir and returns
// it.
func writeManifest(vdir string) ([]byte, error) {
	man, err := manifestOf(filepath.Join(vdir, rootfsDir))
	if err != nil {
		return nil, fmt.Errorf("manifest of the rootfs: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(vdir, manifestFile), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	w := bufio.NewWriter(f)
	if _, err := w.Write(man); err != nil {
		f.Close()
		return nil, err
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return nil, err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return nil, err
	}
	return man, f.Close()
}

// seal gives the finished build dir (its rootfs and template.json of
// template name) its digest: it writes the rootfs's manifest beside them
// and the digest into template.json, and returns the digest.
func seal(name, dir string) (string, error) {
	m, err := readMetadata(name, dir)
	if err != nil {
		return "", err
	}
	man, err := writeManifest(dir)
	if err != nil {
		return "", err
	}
	m.Digest = digestOf(man, m)
	if err := writeMetadata(dir, m); err != nil {
		return "", err
	}
	return m.Digest, nil
}

// VerifyVersion checks that the version directory dir (a copy from another
// node, say) is whole: its rootfs matches its manifest line for line, and
// the manifest and template.json give the digest its metadata and its
// directory name state. A mismatch is errdefs.ErrInvalid naming the first
// difference; a version made before digests cannot be verified
// (errdefs.ErrInvalid too).
func VerifyVersion(dir string) (Version, error) {
	v, err := readVersion(dir)
	if err != nil {
		return Version{}, err
	}
	if v.Digest == "" {
		return v, fmt.Errorf("version %s has no digest (made before digests): %w", dir, errdefs.ErrInvalid)
	}
	m, err := readMetadata(v.Name, dir)
	if err != nil {
		return v, err
	}
	stored, err := os.ReadFile(filepath.Join(dir, manifestFile))
	if err != nil {
		return v, fmt.Errorf("version %s: %v: %w", dir, err, errdefs.ErrInvalid)
	}
	if d := digestOf(stored, m); d != v.Digest {
		return v, fmt.Errorf("version %s: its manifest and metadata give digest %s, not %s: %w", dir, d, v.Digest, errdefs.ErrInvalid)
	}
	if want := v.Name + "@" + dirDigest(v.Digest); filepath.Base(dir) != want {
		return v, fmt.Errorf("version %s: its digest names it %s: %w", dir, want, errdefs.ErrInvalid)
	}
	return v, verifyRootfs(dir, stored)
}

// verifyRootfs checks that the rootfs of version directory dir matches the
// manifest stored (errdefs.ErrInvalid naming the first difference).
func verifyRootfs(dir string, stored []byte) error {
	got, err := manifestOf(filepath.Join(dir, rootfsDir))
	if err != nil {
		return fmt.Errorf("version %s: %w", dir, err)
	}
	if !bytes.Equal(got, stored) {
		return fmt.Errorf("version %s: rootfs differs from its manifest at %s: %w", dir, firstDiff(stored, got), errdefs.ErrInvalid)
	}
	return nil
}

// firstDiff describes the first line where manifests want and got differ.
func firstDiff(want, got []byte) string {
	w := strings.Split(string(want), "\n")
	g := strings.Split(string(got), "\n")
	for i := range max(len(w), len(g)) {
		var a, b string
		if i < len(w) {
			a = w[i]
		}
		if i < len(g) {
			b = g[i]
		}
		if a != b {
			return fmt.Sprintf("line %d (manifest: %s; rootfs: %s)", i+1, a, b)
		}
	}
	return "no line"
}
