// Package backup writes and restores a whole lizard data directory as one
// archive, while the server runs: a consistent copy of the database, the
// snapshot images and the volume images, with a manifest. The CLI (`lizard
// backup`, `lizard restore`) uses it.
//
// The archive is a tar stream compressed with zstd:
//
//	manifest.json          what the archive holds (first)
//	lizard.db              the database, copied in one read transaction
//	snapshots/<id>/…       the image of every snapshot the database names
//	volumes/<id>.img       every volume's filesystem image
//
// Files with holes (volume images are sparse files of the largest volume
// size) are stored as their data only, with the map of the data in the
// entry's PAX records, and restored sparse.
//
// What the copy holds is what the database copy names. Snapshot images are
// hard-linked into a staging directory before the archive is written; a
// snapshot deleted meanwhile is left out, record and image, as its image may
// be partly removed. Volume images are opened first, so a volume deleted
// meanwhile is still copied whole. What is made after the database copy is
// not in the backup.
// Sandboxes are not backed up: their state lives in the runtime, and a
// restored data directory has no sandbox running. Their records, and the
// volumes' attachments to them, are left out of the copy.
package backup

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/store/sqlite"
	"github.com/lizard-build/lizard/internal/volume"
)

// Format is the version of the archive layout.
const Format = 1

// Manifest describes an archive.
type Manifest struct {
	Format        int       `json:"format"`
	CreatedAt     time.Time `json:"createdAt"`
	SchemaVersion int       `json:"schemaVersion"`
	Projects      int       `json:"projects"`
	Snapshots     []string  `json:"snapshots"`
	Volumes       []string  `json:"volumes"`
	// Sandboxes were running (or paused) when the copy was made; they are
	// not in the archive.
	Sandboxes []string `json:"sandboxesLeftOut,omitempty"`
	Warnings  []string `json:"warnings,omitempty"`
}

const (
	manifestName = "manifest.json"
	dbName       = "lizard.db"
	// PAX records of a file stored without its holes.
	paxSize = "LIZARD.size"   // the file's length
	paxMap  = "LIZARD.extent" // offset,length,offset,length… of its data
)

// Options say what to back up.
type Options struct {
	DataDir string
	Store   *sqlite.Store // the data directory's database, open
	// Warn is told of everything that makes the copy less than whole; the
	// warnings are also in the manifest.
	Warn func(string)
}

// Create writes an archive of the data directory to w.
func Create(ctx context.Context, opts Options, w io.Writer) (Manifest, error) {
	m := Manifest{Format: Format, CreatedAt: time.Now().UTC()}
	warn := func(format string, args ...any) {
		s := fmt.Sprintf(format, args...)
		m.Warnings = append(m.Warnings, s)
		if opts.Warn != nil {
			opts.Warn(s)
		}
	}
	// The staging directory is on the data directory's filesystem, so that
	// snapshot files can be linked into it rather than copied.
	stage, err := os.MkdirTemp(opts.DataDir, ".backup-")
	if err != nil {
		return m, err
	}
	defer os.RemoveAll(stage)
	dbCopy := filepath.Join(stage, dbName)
	if err := opts.Store.CopyTo(ctx, dbCopy); err != nil {
		return m, err
	}
	cp, err := sqlite.Open(dbCopy)
	if err != nil {
		return m, err
	}
	defer cp.Close()
	if m.SchemaVersion, err = cp.SchemaVersion(ctx); err != nil {
		return m, err
	}
	ps, err := cp.Projects(ctx)
	if err != nil {
		return m, err
	}
	m.Projects = len(ps)

	sbs, err := cp.Sandboxes(ctx)
	if err != nil {
		return m, err
	}
	for _, sb := range sbs {
		m.Sandboxes = append(m.Sandboxes, sb.ID)
		if err := cp.DeleteSandbox(ctx, sb.ID); err != nil {
			return m, err
		}
	}

	snaps, err := cp.Snapshots(ctx)
	if err != nil {
		return m, err
	}
	for _, sn := range snaps {
		src := filepath.Join(opts.DataDir, "snapshots", sn.ID)
		err := linkTree(src, filepath.Join(stage, "snapshots", sn.ID))
		if errors.Is(err, fs.ErrNotExist) {
			warn("snapshot %s: image gone since the database was read (deleted); left out", sn.ID)
			if err := cp.DeleteSnapshot(ctx, sn.ID); err != nil {
				return m, err
			}
			continue
		}
		if err != nil {
			return m, fmt.Errorf("snapshot %s: %w", sn.ID, err)
		}
		m.Snapshots = append(m.Snapshots, sn.ID)
	}
	// The service deletes a snapshot's record before its files: one still
	// recorded now had its whole image when it was linked.
	live, err := opts.Store.Snapshots(ctx)
	if err != nil {
		return m, err
	}
	m.Snapshots = slices.DeleteFunc(m.Snapshots, func(id string) bool {
		if slices.ContainsFunc(live, func(sn store.Snapshot) bool { return sn.ID == id }) {
			return false
		}
		warn("snapshot %s: deleted during the backup; left out", id)
		err = errors.Join(err, cp.DeleteSnapshot(ctx, id))
		return true
	})
	if err != nil {
		return m, err
	}

	vols, err := cp.Volumes(ctx)
	if err != nil {
		return m, err
	}
	images := map[string]*os.File{}
	defer func() {
		for _, f := range images {
			f.Close()
		}
	}()
	for _, sv := range vols {
		var v volume.Volume
		if err := json.Unmarshal(sv.Spec, &v); err != nil {
			return m, fmt.Errorf("volume %s: %w", sv.ID, err)
		}
		f, err := os.Open(filepath.Join(opts.DataDir, "volumes", sv.ID+".img"))
		if errors.Is(err, fs.ErrNotExist) {
			warn("volume %s (%s): image gone since the database was read (deleted); left out", sv.ID, v.Name)
			if err := cp.DeleteVolume(ctx, sv.ID); err != nil {
				return m, err
			}
			continue
		}
		if err != nil {
			return m, err
		}
		images[sv.ID] = f
		m.Volumes = append(m.Volumes, sv.ID)
		if v.AttachedTo == "" {
			continue
		}
		// The volume is mounted and in use. Its filesystem is flushed to the
		// image first; what the sandbox writes during the copy may still be
		// torn (a file half-written), which the restore's filesystem check
		// repairs to a mountable state.
		warn("volume %s (%s) is attached to sandbox %s: copied while in use; files written during the copy may be incomplete",
			sv.ID, v.Name, v.AttachedTo)
		syncMounted(filepath.Join(opts.DataDir, "volumes", sv.ID))
		v.AttachedTo = ""
		spec, err := json.Marshal(v)
		if err != nil {
			return m, err
		}
		if err := cp.UpdateVolume(ctx, store.Volume{ID: sv.ID, Spec: spec}); err != nil {
			return m, err
		}
	}
	if err := cp.Close(); err != nil {
		return m, err
	}

	zw, err := zstd.NewWriter(w)
	if err != nil {
		return m, err
	}
	tw := tar.NewWriter(zw)
	mb, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return m, err
	}
	if err := tw.WriteHeader(&tar.Header{Name: manifestName, Mode: 0o600, Size: int64(len(mb)), ModTime: m.CreatedAt, Typeflag: tar.TypeReg}); err != nil {
		return m, err
	}
	if _, err := tw.Write(mb); err != nil {
		return m, err
	}
	if err := addFile(ctx, tw, dbName, dbCopy); err != nil {
		return m, err
	}
	for _, id := range m.Snapshots {
		if err := addTree(ctx, tw, stage, path("snapshots", id)); err != nil {
			return m, err
		}
	}
	for _, id := range m.Volumes {
		if err := addOpen(ctx, tw, path("volumes", id+".img"), images[id]); err != nil {
			return m, fmt.Errorf("volume %s: %w", id, err)
		}
	}
	if err := tw.Close(); err != nil {
		return m, err
	}
	return m, zw.Close()
}

func path(elem ...string) string { return strings.Join(elem, "/") }

// syncMounted flushes the filesystem mounted at dir to its image; a volume
// that is not mounted has nothing to flush.
func syncMounted(dir string) {
	f, err := os.Open(dir)
	if err != nil {
		return
	}
	defer f.Close()
	unix.Syncfs(int(f.Fd()))
}

// linkTree hard-links the files of the directory src into dst (copies them
// when they are on another filesystem).
func linkTree(src, dst string) error {
	if _, err := os.Stat(src); err != nil {
		return err
	}
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		target := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.MkdirAll(target, 0o700)
		case d.Type().IsRegular():
			err := os.Link(p, target)
			if errors.Is(err, unix.EXDEV) { // snapshots on a filesystem of their own
				err = copyFile(p, target)
			}
			return err
		}
		return nil // sockets, links: not part of an image
	})
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// addTree adds the directory root/rel and everything under it.
func addTree(ctx context.Context, tw *tar.Writer, root, rel string) error {
	return filepath.WalkDir(filepath.Join(root, rel), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name, _ := filepath.Rel(root, p)
		name = filepath.ToSlash(name)
		if d.IsDir() {
			return tw.WriteHeader(&tar.Header{Name: name + "/", Mode: 0o700, Typeflag: tar.TypeDir})
		}
		return addFile(ctx, tw, name, p)
	})
}

func addFile(ctx context.Context, tw *tar.Writer, name, p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	return addOpen(ctx, tw, name, f)
}

// addOpen adds the regular file f as name, its data only when it has
// holes.
func addOpen(ctx context.Context, tw *tar.Writer, name string, f *os.File) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	extents, err := dataExtents(f, size)
	if err != nil {
		return err
	}
	hdr := &tar.Header{Name: name, Mode: int64(fi.Mode().Perm()), ModTime: fi.ModTime(), Typeflag: tar.TypeReg, Format: tar.FormatPAX}
	var data int64
	for _, e := range extents {
		data += e[1]
	}
	hdr.Size = data
	if data != size {
		var m []string
		for _, e := range extents {
			m = append(m, strconv.FormatInt(e[0], 10), strconv.FormatInt(e[1], 10))
		}
		hdr.PAXRecords = map[string]string{paxSize: strconv.FormatInt(size, 10), paxMap: strings.Join(m, ",")}
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	for _, e := range extents {
		if err := ctx.Err(); err != nil {
			return err
		}
		n, err := io.Copy(tw, io.NewSectionReader(f, e[0], e[1]))
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if n != e[1] {
			return fmt.Errorf("%s: changed size while copied", name)
		}
	}
	return nil
}

// dataExtents lists the [offset, length] ranges of f that hold data, by
// SEEK_DATA and SEEK_HOLE. A filesystem that does not know holes reports
// the whole file as data.
func dataExtents(f *os.File, size int64) ([][2]int64, error) {
	var out [][2]int64
	fd := int(f.Fd())
	for off := int64(0); off < size; {
		start, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole from off to the end
		}
		if err != nil {
			return nil, fmt.Errorf("%s: seek data: %w", f.Name(), err)
		}
		end, err := unix.Seek(fd, start, unix.SEEK_HOLE)
		if err != nil {
			return nil, fmt.Errorf("%s: seek hole: %w", f.Name(), err)
		}
		end = min(end, size)
		out = append(out, [2]int64{start, end - start})
		off = end
	}
	return out, nil
}

// Restore unpacks the archive r into dataDir, which must be empty or not
// exist. A database newer than this binary is refused before anything is
// written. On failure, what was unpacked is removed.
func Restore(ctx context.Context, r io.Reader, dataDir string) (m Manifest, err error) {
	ents, err := os.ReadDir(dataDir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := os.MkdirAll(dataDir, 0o700); err != nil {
			return m, err
		}
		defer func() {
			if err != nil {
				os.RemoveAll(dataDir)
			}
		}()
	case err != nil:
		return m, err
	case len(ents) > 0:
		return m, fmt.Errorf("restore into %s: not empty (restore into a new data directory): %w", dataDir, errdefs.ErrConflict)
	default:
		defer func() {
			if err != nil {
				ents, _ := os.ReadDir(dataDir)
				for _, e := range ents {
					os.RemoveAll(filepath.Join(dataDir, e.Name()))
				}
			}
		}()
	}
	zr, err := zstd.NewReader(r)
	if err != nil {
		return m, err
	}
	defer zr.Close()
	tr := tar.NewReader(zr)
	hdr, err := tr.Next()
	if err != nil || hdr.Name != manifestName {
		return m, fmt.Errorf("not a lizard backup (no %s first): %w", manifestName, errdefs.ErrInvalid)
	}
	if err := json.NewDecoder(tr).Decode(&m); err != nil {
		return m, fmt.Errorf("%s: %w", manifestName, err)
	}
	if m.Format != Format {
		return m, fmt.Errorf("backup format %d, this lizard reads %d: %w", m.Format, Format, errdefs.ErrInvalid)
	}
	if m.SchemaVersion > sqlite.SchemaVersion() {
		return m, fmt.Errorf("backup of schema version %d, this lizard knows up to %d (restore with a newer lizard): %w",
			m.SchemaVersion, sqlite.SchemaVersion(), store.ErrSchemaNewer)
	}
	for {
		if err := ctx.Err(); err != nil {
			return m, err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return m, err
		}
		name := strings.TrimSuffix(hdr.Name, "/")
		if !filepath.IsLocal(name) || !(name == dbName || strings.HasPrefix(name, "snapshots/") || strings.HasPrefix(name, "volumes/")) {
			return m, fmt.Errorf("backup entry %q: not one lizard writes: %w", hdr.Name, errdefs.ErrInvalid)
		}
		target := filepath.Join(dataDir, filepath.FromSlash(name))
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o700); err != nil {
				return m, err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(target), 0o700); err != nil {
				return m, err
			}
			if err := extract(tr, hdr, target); err != nil {
				return m, fmt.Errorf("%s: %w", hdr.Name, err)
			}
		default:
			return m, fmt.Errorf("backup entry %q: type %c: %w", hdr.Name, hdr.Typeflag, errdefs.ErrInvalid)
		}
	}
	// The database is opened once, which brings an older schema up to date
	// and checks that it is whole.
	st, err := sqlite.Open(filepath.Join(dataDir, dbName))
	if err != nil {
		return m, err
	}
	return m, st.Close()
}

// extract writes the entry hdr to target, with its holes.
func extract(tr *tar.Reader, hdr *tar.Header, target string) error {
	f, err := os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, os.FileMode(hdr.Mode).Perm())
	if err != nil {
		return err
	}
	defer f.Close()
	extents := [][2]int64{{0, hdr.Size}}
	size := hdr.Size
	if s, ok := hdr.PAXRecords[paxSize]; ok {
		if size, err = strconv.ParseInt(s, 10, 64); err != nil {
			return fmt.Errorf("%s %q: %w", paxSize, s, errdefs.ErrInvalid)
		}
		if extents, err = parseExtents(hdr.PAXRecords[paxMap], hdr.Size, size); err != nil {
			return err
		}
	}
	if err := f.Truncate(size); err != nil {
		return err
	}
	for _, e := range extents {
		if _, err := io.Copy(io.NewOffsetWriter(f, e[0]), io.LimitReader(tr, e[1])); err != nil {
			return err
		}
	}
	if err := f.Sync(); err != nil {
		return err
	}
	return f.Close()
}

// parseExtents reads a data map and checks that it fits: ranges in order
// within size whose lengths add up to the entry's data.
func parseExtents(s string, data, size int64) ([][2]int64, error) {
	bad := fmt.Errorf("%s %q: %w", paxMap, s, errdefs.ErrInvalid)
	var nums []int64
	if s != "" {
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.ParseInt(f, 10, 64)
			if err != nil || n < 0 {
				return nil, bad
			}
			nums = append(nums, n)
		}
	}
	if len(nums)%2 != 0 {
		return nil, bad
	}
	var out [][2]int64
	var end, sum int64
	for c := range slices.Chunk(nums, 2) {
		if c[0] < end || c[0]+c[1] > size {
			return nil, bad
		}
		out = append(out, [2]int64{c[0], c[1]})
		end, sum = c[0]+c[1], sum+c[1]
	}
	if sum != data {
		return nil, bad
	}
	return out, nil
}
