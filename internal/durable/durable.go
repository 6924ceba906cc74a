// Package durable makes checkpoint images (a paused sandbox's image, a
// snapshot) durable in an object store and brings them back: Upload
// compresses each file of an image directory in chunks (zstd, streamed) into
// content-addressed blobs and writes the image's manifest last; Materialize
// downloads an image into a local directory, verifying every digest, so
// that nothing corrupt or truncated is ever restored. The sandbox service
// uses it; in cluster mode a node calls Materialize to resume or restore
// what another node made durable.
//
// Layout in the store:
//
//	images/<name>/manifest.json   the Manifest; its presence is durability
//	bases/<name>/manifest.json    a retired image's Manifest (Retire): no
//	                              longer an image, the chunks the next
//	                              upload of name compares its own with
//	blobs/sha256/<hex>            zstd of one chunk; hex is the SHA-256 of
//	                              these stored bytes
//
// Blobs are shared by every image whose chunks compress to the same bytes
// (runs of zero pages do), so Delete removes only blobs that no manifest
// still references.
package durable

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/zeebo/xxh3"
	"golang.org/x/sync/errgroup"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/objstore"
	"github.com/lizard-build/lizard/internal/tracing"
)

// maxStoredChunk bounds the uncompressed size of a chunk Materialize
// accepts: images uploaded before content-defined chunks (cdc.go) hold
// chunks of 16 MiB.
const maxStoredChunk = 16 << 20

// workers is how many chunks are digested, compressed and stored at a
// time: uploads run in the background beside the sandboxes, on a few
// cores. fetchers is how many are downloaded at a time (a chunk is
// small: a download waits more on the store than on the CPU).
const (
	workers  = 2
	fetchers = 8
)

// CheckpointFile is the runtime's checkpoint manifest (runsc build, CPU
// features) in an image; Upload copies it into the image's Manifest.
const CheckpointFile = "lizard-checkpoint.json"

// Manifest describes a durable image.
type Manifest struct {
	// Version is 2 (Upload writes); 1 is still read: a version 1 File
	// that is not Sparse has the digest of its whole bytes.
	Version   int       `json:"version"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"createdAt"`
	// Checkpoint is the image's CheckpointFile (runsc build and the CPU
	// features it needs), so that a node can tell whether it can restore
	// the image before it downloads it.
	Checkpoint json.RawMessage `json:"checkpoint,omitempty"`
	// MatchSeed keys the chunks' Match: random for an image's first
	// upload, then carried to every upload of the name that compares with
	// it. It never leaves the host's side: a sandbox cannot choose bytes
	// whose Match equals an older chunk's.
	MatchSeed uint64 `json:"matchSeed,omitempty"`
	Files     []File `json:"files"`
}

// File is one regular file of the image, as a list of chunks.
type File struct {
	Path   string      `json:"path"` // slash-separated, relative to the image
	Mode   fs.FileMode `json:"mode"`
	Size   int64       `json:"size"`
	SHA256 string      `json:"sha256"` // of its chunk list (chunksDigest)
	// Sparse says some chunks are holes (neither Upload nor Materialize
	// reads them).
	Sparse bool    `json:"sparse,omitempty"`
	Chunks []Chunk `json:"chunks"`
}

// Chunk is a run of a file's bytes, cut where its content says (cdc.go:
// MinChunk to MaxChunk bytes), stored compressed as blob StoredSHA256; a
// Hole is zeros, in no blob (a sparse file's hole of at least minHole
// bytes: Upload reads data extents only, Materialize leaves the hole).
type Chunk struct {
	Size   int64  `json:"size"`
	Hole   bool   `json:"hole,omitempty"`
	SHA256 string `json:"sha256"` // of the uncompressed bytes
	// Match is XXH3-128, seeded with the manifest's MatchSeed, of the
	// uncompressed bytes: how the next upload of the image tells an
	// unchanged chunk without digesting it (30 times faster than SHA-256;
	// a restore still checks SHA256).
	Match        string `json:"match,omitempty"`
	StoredSize   int64  `json:"storedSize"`
	StoredSHA256 string `json:"storedSha256"`
}

// Stored is the total of the stored (compressed) sizes of m's chunks.
func (m Manifest) Stored() (stored, size int64) {
	for _, f := range m.Files {
		size += f.Size
		for _, c := range f.Chunks {
			stored += c.StoredSize
		}
	}
	return stored, size
}

// Images is the durable images of one object store.
type Images struct {
	obj objstore.Store
	log *slog.Logger
	// gc keeps an upload from reusing a blob that a concurrent Delete is
	// about to remove (uploads take it shared, Delete's sweep exclusive).
	// It guards one server; nodes of a cluster sweeping at once are a
	// known gap (see Delete).
	gc sync.RWMutex
	// read and uploaded count bytes (see Stats).
	read, uploaded atomic.Int64
}

// New returns the images kept in obj.
func New(obj objstore.Store, log *slog.Logger) *Images {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Images{obj: obj, log: log}
}

func manifestKey(name string) string { return "images/" + name + "/manifest.json" }
func baseKey(name string) string     { return "bases/" + name + "/manifest.json" }
func blobKey(sum string) string      { return "blobs/sha256/" + sum }

const blobPrefix = "blobs/sha256/"

// ValidName reports whether name can name an image: slash-separated
// segments of letters, digits, '-', '_' and '.', none of them "." or "..".
func ValidName(name string) bool {
	if name == "" {
		return false
	}
	for _, seg := range strings.Split(name, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return false
		}
		for _, r := range seg {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
				return false
			}
		}
	}
	return true
}

// Upload makes the image in dir durable as name: every regular file in
// chunks, each compressed and stored unless a blob of the same bytes is
// there, then the manifest. dir must not change meanwhile. Upload again
// replaces the manifest. A failed or canceled Upload leaves no manifest
// (blobs it stored are swept by a later Delete).
func (im *Images) Upload(ctx context.Context, name, dir string) (_ Manifest, err error) {
	ctx, span := tracing.Start(ctx, "durable upload", tracing.Image.String(name))
	defer func() { tracing.End(span, err) }()
	if !ValidName(name) {
		return Manifest{}, fmt.Errorf("image name %q: %w", name, errdefs.ErrInvalid)
	}
	m := Manifest{Version: 2, Name: name, CreatedAt: time.Now().UTC()}
	if b, err := os.ReadFile(filepath.Join(dir, CheckpointFile)); err == nil && json.Valid(b) {
		m.Checkpoint = json.RawMessage(b)
	}
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		m.Files = append(m.Files, File{Path: filepath.ToSlash(rel), Mode: info.Mode().Perm(), Size: info.Size()})
		return nil
	})
	if err != nil {
		return Manifest{}, fmt.Errorf("upload image %s: %w", name, err)
	}
	if len(m.Files) == 0 {
		return Manifest{}, fmt.Errorf("upload image %s: %s holds no files: %w", name, dir, errdefs.ErrInvalid)
	}
	// The chunks of the image's previous upload, or of its base, if any
	// (of its seed): unchanged ones are not digested, compressed or
	// uploaded again.
	var olds []Manifest
	for _, key := range []string{baseKey(name), manifestKey(name)} {
		if old, err := im.manifest(ctx, key, name); err == nil && old.MatchSeed != 0 {
			olds = append(olds, old)
		}
	}
	m.MatchSeed = rand.Uint64() | 1
	if len(olds) > 0 {
		m.MatchSeed = olds[0].MatchSeed
	}
	prev := map[string]Chunk{}
	for _, old := range olds {
		if old.MatchSeed != m.MatchSeed {
			continue
		}
		for _, f := range old.Files {
			for _, c := range f.Chunks {
				if !c.Hole && c.Match != "" {
					prev[c.Match] = c
				}
			}
		}
	}
	im.gc.RLock()
	defer im.gc.RUnlock()
	for i := range m.Files {
		if err := im.uploadFile(ctx, filepath.Join(dir, filepath.FromSlash(m.Files[i].Path)), &m.Files[i], m.MatchSeed, prev); err != nil {
			return Manifest{}, fmt.Errorf("upload image %s: %s: %w", name, m.Files[i].Path, err)
		}
	}
	b, err := json.MarshalIndent(m, "", " ")
	if err != nil {
		return Manifest{}, err
	}
	if _, err := im.obj.Put(ctx, manifestKey(name), bytes.NewReader(b)); err != nil {
		return Manifest{}, fmt.Errorf("upload image %s: manifest: %w", name, err)
	}
	// The base served; what only it kept goes at the next sweep.
	if err := im.obj.Delete(ctx, baseKey(name)); err != nil {
		im.log.Warn("durable: remove the base of an uploaded image", "image", name, "err", err)
	}
	return m, nil
}

// Retire keeps image name's chunks for its next upload only: its manifest
// becomes name's base (name is durable no more: Stat and Materialize say
// not found), so that the next Upload of name (a sandbox paused again
// after its resume, on this node or another) stores only the chunks that
// changed. Delete removes the base with the image. An image that is not
// there is not an error.
func (im *Images) Retire(ctx context.Context, name string) error {
	if !ValidName(name) {
		return fmt.Errorf("image name %q: %w", name, errdefs.ErrInvalid)
	}
	rc, err := im.obj.Get(ctx, manifestKey(name), 0, -1)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("retire image %s: %w", name, err)
	}
	b, err := io.ReadAll(io.LimitReader(rc, maxManifest))
	rc.Close()
	if err != nil {
		return fmt.Errorf("retire image %s: %w", name, errors.Join(err, errdefs.ErrUnavailable))
	}
	if _, err := im.obj.Put(ctx, baseKey(name), bytes.NewReader(b)); err != nil {
		return fmt.Errorf("retire image %s: %w", name, err)
	}
	if err := im.obj.Delete(ctx, manifestKey(name)); err != nil {
		return fmt.Errorf("retire image %s: %w", name, err)
	}
	return nil
}

var encoders = sync.Pool{New: func() any {
	e, _ := zstd.NewWriter(nil, zstd.WithEncoderConcurrency(1), zstd.WithEncoderLevel(zstd.SpeedDefault))
	return e
}}

func (im *Images) uploadFile(ctx context.Context, p string, f *File, seed uint64, prev map[string]Chunk) error {
	fh, err := os.Open(p)
	if err != nil {
		return err
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return err
	}
	if st.Size() != f.Size {
		return fmt.Errorf("changed while uploading (%d bytes, then %d)", f.Size, st.Size())
	}
	exts, err := DataExtents(fh, f.Size)
	if err != nil {
		return err
	}
	// The file is mapped, not read: cuts finds the chunks of each run of
	// data in the mapping (on every core), then workers digest, compress
	// and store them from it, with no copy. Each chunk is a slot of its
	// own, filled when its worker is done.
	data, unmap, err := mapFile(fh, f.Size)
	if err != nil {
		return err
	}
	defer unmap()
	var slots []*Chunk
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(workers)
	add := func(c Chunk) *Chunk {
		slots = append(slots, &c)
		return &c
	}
	var off int64
	for _, r := range dataRuns(exts) {
		if r.Off > off {
			add(Chunk{Size: r.Off - off, Hole: true})
			f.Sparse = true
		}
		run := data[r.Off:r.End]
		ends, err := cuts(run, runtime.GOMAXPROCS(0))
		if err != nil {
			g.Wait()
			return err
		}
		im.read.Add(int64(len(run)))
		start := 0
		for _, end := range ends {
			b, at := run[start:end], r.Off+int64(start)
			start = end
			slot := add(Chunk{Size: int64(len(b))})
			if err := gctx.Err(); err != nil {
				// A worker failed, or ctx ended: no more chunks.
				return cmp.Or(g.Wait(), err)
			}
			g.Go(func() error {
				return guard(func() error {
					c, err := im.uploadChunk(gctx, b, seed, prev)
					if err != nil {
						return fmt.Errorf("chunk at %d: %w", at, err)
					}
					*slot = c
					return nil
				})
			})
		}
		off = r.End
	}
	if off < f.Size {
		add(Chunk{Size: f.Size - off, Hole: true})
		f.Sparse = true
	}
	if err := g.Wait(); err != nil {
		return err
	}
	f.Chunks = make([]Chunk, len(slots))
	for i, c := range slots {
		f.Chunks[i] = *c
	}
	// The file's digest is its chunk list's: every chunk's bytes are
	// digested already (a digest of the whole file would read it again,
	// holes included).
	f.SHA256 = chunksDigest(f.Chunks)
	return nil
}

// minHole is the shortest hole kept as a hole chunk: a shorter one between
// two data extents is read (as zeros) with them, so that a file of many
// small extents is not cut into as many small chunks.
const minHole = 1 << 20

// dataRuns merges exts (in order) into the runs of a file that are
// stored: extents closer than minHole are one run.
func dataRuns(exts []Extent) []Extent {
	var runs []Extent
	for _, e := range exts {
		if n := len(runs); n > 0 && e.Off-runs[n-1].End < minHole {
			runs[n-1].End = e.End
			continue
		}
		runs = append(runs, e)
	}
	return runs
}

// chunksDigest is the SHA-256 of a file's chunk list: each chunk's size
// and uncompressed digest ("hole" for a hole), a line each.
func chunksDigest(chunks []Chunk) string {
	h := sha256.New()
	for _, c := range chunks {
		sum := c.SHA256
		if c.Hole {
			sum = "hole"
		}
		fmt.Fprintf(h, "%d %s\n", c.Size, sum)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// uploadChunk stores chunk b compressed, unless a blob of it is there: the
// previous manifest of the image or its base (prev, by Match with the
// same seed) names the blob an unchanged chunk was stored as, so it is
// neither digested, compressed nor uploaded again (nor looked up: a blob
// a manifest references is never swept, and the image's jobs run one at a
// time, so that manifest stays until this upload's replaces it); a chunk
// that compresses to a blob already stored is not uploaded either.
func (im *Images) uploadChunk(ctx context.Context, b []byte, seed uint64, prev map[string]Chunk) (Chunk, error) {
	x := xxh3.Hash128Seed(b, seed).Bytes()
	match := hex.EncodeToString(x[:])
	if c, ok := prev[match]; ok && c.Size == int64(len(b)) {
		return c, nil
	}
	sum := sha256.Sum256(b)
	raw := hex.EncodeToString(sum[:])
	var buf bytes.Buffer
	stored := sha256.New()
	enc := encoders.Get().(*zstd.Encoder)
	defer encoders.Put(enc)
	enc.Reset(io.MultiWriter(&buf, stored))
	_, err := enc.Write(b)
	if err == nil {
		err = enc.Close()
	}
	if err != nil {
		return Chunk{}, err
	}
	c := Chunk{Size: int64(len(b)), SHA256: raw, Match: match, StoredSize: int64(buf.Len()), StoredSHA256: hex.EncodeToString(stored.Sum(nil))}
	if info, err := im.obj.Stat(ctx, blobKey(c.StoredSHA256)); err == nil && info.Size == c.StoredSize {
		return c, nil
	}
	if _, err := im.obj.Put(ctx, blobKey(c.StoredSHA256), &buf); err != nil {
		return Chunk{}, err
	}
	im.uploaded.Add(c.StoredSize)
	return c, nil
}

// Stats is what Upload did since New: bytes read from image files and
// (compressed) bytes stored as new blobs.
type Stats struct{ Read, Uploaded int64 }

// Stats returns the counts so far.
func (im *Images) Stats() Stats {
	return Stats{Read: im.read.Load(), Uploaded: im.uploaded.Load()}
}

// Stat reads name's manifest: errdefs.ErrNotFound when name is not durable.
func (im *Images) Stat(ctx context.Context, name string) (Manifest, error) {
	if !ValidName(name) {
		return Manifest{}, fmt.Errorf("image name %q: %w", name, errdefs.ErrInvalid)
	}
	return im.manifest(ctx, manifestKey(name), name)
}

// maxManifest bounds a manifest's size.
const maxManifest = 64 << 20

// manifest reads the manifest at key, of image name.
func (im *Images) manifest(ctx context.Context, key, name string) (Manifest, error) {
	var m Manifest
	rc, err := im.obj.Get(ctx, key, 0, -1)
	if err != nil {
		return m, fmt.Errorf("image %s: %w", name, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, maxManifest))
	if err != nil {
		return m, fmt.Errorf("image %s: read manifest: %w", name, errors.Join(err, errdefs.ErrUnavailable))
	}
	if err := json.Unmarshal(b, &m); err != nil || m.Version != 1 && m.Version != 2 {
		return m, corrupt(key, name, fmt.Sprintf("not a version 1 or 2 manifest (%v)", err))
	}
	for _, f := range m.Files {
		if p := path.Clean(f.Path); p != f.Path || !fs.ValidPath(p) || p == "." {
			return m, corrupt(key, name, fmt.Sprintf("file path %q", f.Path))
		}
	}
	return m, nil
}

// corrupt is the error for an object whose bytes are not what the manifest
// says: 409 corrupt_object naming it.
func corrupt(key, name, why string) error {
	return errdefs.WithCode("corrupt_object", fmt.Errorf("object %s of image %s is corrupt: %s; the image is not restored: %w", key, name, why, errdefs.ErrConflict))
}

// Materialize downloads image name into dir, which must not exist: into
// dir+".tmp" first, renamed once every file's size and every chunk's
// digests (stored and uncompressed) and every file's digest matched the
// manifest. A missing, corrupt or truncated object is an errdefs.ErrConflict
// with code corrupt_object naming the object, and leaves no dir; a store
// that does not answer, errdefs.ErrUnavailable; no such image,
// errdefs.ErrNotFound.
func (im *Images) Materialize(ctx context.Context, name, dir string) (_ Manifest, err error) {
	ctx, span := tracing.Start(ctx, "durable materialize", tracing.Image.String(name))
	defer func() { tracing.End(span, err) }()
	m, err := im.Stat(ctx, name)
	if err != nil {
		return m, err
	}
	if _, err := os.Stat(dir); err == nil {
		return m, fmt.Errorf("materialize image %s: %s exists: %w", name, dir, errdefs.ErrConflict)
	}
	tmp := dir + ".tmp"
	os.RemoveAll(tmp)
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return m, err
	}
	for _, f := range m.Files {
		if err := im.downloadFile(ctx, name, filepath.Join(tmp, filepath.FromSlash(f.Path)), f, m.Version); err != nil {
			os.RemoveAll(tmp)
			return m, fmt.Errorf("materialize image %s: %w", name, err)
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		os.RemoveAll(tmp)
		return m, err
	}
	return m, nil
}

func (im *Images) downloadFile(ctx context.Context, name, p string, f File, version int) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	fh, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_RDWR, f.Mode|0o600)
	if err != nil {
		return err
	}
	defer fh.Close()
	whole, err := checkList(name, version, f)
	if err != nil {
		return err
	}
	if err := fh.Truncate(f.Size); err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(fetchers)
	var off int64
	for _, c := range f.Chunks {
		w := holeWriter{io.NewOffsetWriter(fh, off)}
		off += c.Size
		if c.Hole {
			continue // zeros already: the file was truncated to its size
		}
		g.Go(func() error { return im.downloadChunk(gctx, name, w, c) })
	}
	if err := g.Wait(); err != nil {
		return err
	}
	if whole {
		h := sha256.New()
		if _, err := io.Copy(h, io.NewSectionReader(fh, 0, f.Size)); err != nil {
			return err
		}
		if err := checkWhole(name, f, h); err != nil {
			return err
		}
	}
	return fh.Sync()
}

// checkList checks the chunk list of file f of image name (a manifest of
// version) against the file's size and, unless f's digest is of its bytes
// (whole: version 1, not sparse; checkWhole once they are read), against
// that digest.
func checkList(name string, version int, f File) (whole bool, err error) {
	var total int64
	for _, c := range f.Chunks {
		total += c.Size
	}
	if total != f.Size {
		return false, corrupt(manifestKey(name), name, fmt.Sprintf("%s: chunks hold %d bytes, the file %d", f.Path, total, f.Size))
	}
	if version < 2 && !f.Sparse {
		return true, nil
	}
	if got := chunksDigest(f.Chunks); got != f.SHA256 {
		return false, corrupt(manifestKey(name), name, fmt.Sprintf("%s: SHA-256 of the chunk list %s, the manifest says %s", f.Path, got, f.SHA256))
	}
	return false, nil
}

// checkWhole checks h, a digest of all the bytes of f, against f's.
func checkWhole(name string, f File, h hash.Hash) error {
	if got := hex.EncodeToString(h.Sum(nil)); got != f.SHA256 {
		return corrupt(manifestKey(name), name, fmt.Sprintf("%s: SHA-256 %s, the manifest says %s", f.Path, got, f.SHA256))
	}
	return nil
}

var decoders = sync.Pool{New: func() any {
	d, _ := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(2*maxStoredChunk))
	return d
}}

// downloadChunk writes chunk c at w, checking the stored bytes' size and
// digest and the uncompressed bytes'.
func (im *Images) downloadChunk(ctx context.Context, name string, w io.Writer, c Chunk) error {
	key := blobKey(c.StoredSHA256)
	rc, err := im.obj.Get(ctx, key, 0, -1)
	if errors.Is(err, errdefs.ErrNotFound) {
		return corrupt(key, name, "missing")
	}
	if err != nil {
		return err
	}
	defer rc.Close()
	stored := &countHash{h: sha256.New()}
	dec := decoders.Get().(*zstd.Decoder)
	defer decoders.Put(dec)
	// One byte past the stored size tells a longer object from a whole one.
	if err := dec.Reset(io.TeeReader(io.LimitReader(rc, c.StoredSize+1), stored)); err != nil {
		return err
	}
	raw := &countHash{h: sha256.New()}
	_, err = io.Copy(io.MultiWriter(w, raw), io.LimitReader(dec, c.Size+1))
	// Whatever the decoder did not need still counts for the stored digest.
	io.Copy(stored, io.LimitReader(rc, c.StoredSize+1-stored.n))
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case stored.n != c.StoredSize:
		return corrupt(key, name, fmt.Sprintf("%d bytes stored, the manifest says %d (truncated or replaced)", stored.n, c.StoredSize))
	case stored.sum() != c.StoredSHA256:
		return corrupt(key, name, fmt.Sprintf("SHA-256 of the stored bytes is %s", stored.sum()))
	case err != nil:
		return corrupt(key, name, fmt.Sprintf("does not decompress: %v", err))
	case raw.n != c.Size || raw.sum() != c.SHA256:
		return corrupt(key, name, fmt.Sprintf("decompresses to %d bytes with SHA-256 %s, the manifest says %d bytes with %s", raw.n, raw.sum(), c.Size, c.SHA256))
	}
	return nil
}

// holeWriter writes into a file truncated to its size: runs of zeros are
// left as holes (already zero), so a sparse file stays sparse.
type holeWriter struct{ w *io.OffsetWriter }

var zeros [64 << 10]byte

func (h holeWriter) Write(p []byte) (int, error) {
	total := len(p)
	for len(p) > 0 {
		n := min(len(p), len(zeros))
		if !bytes.Equal(p[:n], zeros[:n]) {
			if _, err := h.w.Write(p[:n]); err != nil {
				return 0, err
			}
		} else if _, err := h.w.Seek(int64(n), io.SeekCurrent); err != nil {
			return 0, err
		}
		p = p[n:]
	}
	return total, nil
}

type countHash struct {
	h hash.Hash
	n int64
}

func (c *countHash) Write(p []byte) (int, error) { c.n += int64(len(p)); return c.h.Write(p) }
func (c *countHash) sum() string                 { return hex.EncodeToString(c.h.Sum(nil)) }

// Delete removes image name's manifest and its base (Retire), then, when
// either was there, every blob that no remaining manifest references. A
// missing image is not an error. Blobs stored by an upload of this server
// still in flight are kept (the sweep waits for it); two servers of a
// cluster, one sweeping while the other uploads a blob that already
// existed, could lose that blob: the other's Materialize then reports it
// missing (corrupt_object), never restores wrong bytes.
func (im *Images) Delete(ctx context.Context, name string) error {
	if !ValidName(name) {
		return fmt.Errorf("image name %q: %w", name, errdefs.ErrInvalid)
	}
	found := false
	for _, key := range []string{manifestKey(name), baseKey(name)} {
		_, err := im.obj.Stat(ctx, key)
		if errors.Is(err, errdefs.ErrNotFound) {
			continue
		}
		if err == nil {
			err = im.obj.Delete(ctx, key)
		}
		if err != nil {
			return fmt.Errorf("delete image %s: %w", name, err)
		}
		found = true
	}
	if !found {
		return nil
	}
	return im.Sweep(ctx)
}

// List calls fn with the name of every image whose name starts with
// prefix, and when its manifest was written.
func (im *Images) List(ctx context.Context, prefix string, fn func(name string, written time.Time) error) error {
	return im.obj.List(ctx, "images/"+prefix, func(i objstore.Info) error {
		name, ok := strings.CutSuffix(strings.TrimPrefix(i.Key, "images/"), "/manifest.json")
		if !ok {
			return nil
		}
		return fn(name, i.Modified)
	})
}

// Sweep removes the blobs no manifest references.
func (im *Images) Sweep(ctx context.Context) error {
	im.gc.Lock()
	defer im.gc.Unlock()
	used := map[string]bool{}
	for _, prefix := range []string{"images/", "bases/"} {
		err := im.obj.List(ctx, prefix, func(i objstore.Info) error {
			if !strings.HasSuffix(i.Key, "/manifest.json") {
				return nil
			}
			name := strings.TrimSuffix(strings.TrimPrefix(i.Key, prefix), "/manifest.json")
			m, err := im.manifest(ctx, i.Key, name)
			if errors.Is(err, errdefs.ErrNotFound) {
				return nil // deleted meanwhile
			}
			if err != nil {
				// A manifest that cannot be read may still reference blobs.
				return fmt.Errorf("sweep: %w", err)
			}
			for _, f := range m.Files {
				for _, c := range f.Chunks {
					used[c.StoredSHA256] = true
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	var unused []string
	err := im.obj.List(ctx, blobPrefix, func(i objstore.Info) error {
		if !used[strings.TrimPrefix(i.Key, blobPrefix)] {
			unused = append(unused, i.Key)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, k := range unused {
		if err := im.obj.Delete(ctx, k); err != nil {
			return err
		}
	}
	if len(unused) > 0 {
		im.log.Debug("durable: swept unreferenced blobs", "count", len(unused))
	}
	return nil
}
