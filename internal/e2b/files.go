package e2b

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"time"

	"github.com/lizard-build/lizard/internal/disk"
	"github.com/lizard-build/lizard/internal/errdefs"
)

// The files of a template's COPY steps: the SDK hashes them (the step's
// source and destination, and each file's path, mode, size and content),
// asks GET /templates/{templateID}/files/{hash} whether the server has
// them and, when not, PUTs a tar archive of them to the upload URL it got.
// lizard keeps each archive under its hash, per project, so a build whose
// files have not changed uploads nothing; the URL is lizard's own PUT
// route, signed with a key of the server's and valid for uploadTTL.

const (
	// uploadTTL is how long an upload URL is valid (E2B's: 30 minutes).
	uploadTTL = 30 * time.Minute
	// filesTTL is how long uploaded files are kept after their last use.
	filesTTL = 7 * 24 * time.Hour
)

// uploads is the project's uploaded files, under dir/<project>/<hash>.
type uploads struct {
	dir string
	key []byte // signs upload URLs
	max int64  // an upload's largest size
	// disk refuses uploads when the data dir is short of space (nil: no
	// check).
	disk *disk.Guard
}

func newUploads(dir string, max int64, guard *disk.Guard) *uploads {
	key := make([]byte, 32)
	rand.Read(key)
	return &uploads{dir: dir, key: key, max: max, disk: guard}
}

// projectRE is what a project id looks like (a path element of dir).
var projectRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

func (u *uploads) path(project, hash string) string {
	return filepath.Join(u.dir, project, hash)
}

// has reports whether project has the files of hash, and marks them used.
func (u *uploads) has(project, hash string) bool {
	p := u.path(project, hash)
	if _, err := os.Stat(p); err != nil {
		return false
	}
	now := time.Now()
	os.Chtimes(p, now, now)
	return true
}

// sign is the signature of an upload URL.
func (u *uploads) sign(project, templateID, hash string, expires int64) string {
	m := hmac.New(sha256.New, u.key)
	fmt.Fprintf(m, "PUT\n%s\n%s\n%s\n%d", project, templateID, hash, expires)
	return hex.EncodeToString(m.Sum(nil))
}

// uploadURL is where the SDK PUTs the files of hash for project's
// template: this API, as the request reached it.
func (u *uploads) uploadURL(r *http.Request, project, templateID, hash string) string {
	scheme := "http"
	if r.TLS != nil || r.Header.Get("X-Forwarded-Proto") == "https" {
		scheme = "https"
	}
	expires := time.Now().Add(uploadTTL).Unix()
	q := url.Values{"project": {project}, "expires": {strconv.FormatInt(expires, 10)}, "signature": {u.sign(project, templateID, hash, expires)}}
	return (&url.URL{Scheme: scheme, Host: r.Host, Path: "/templates/" + templateID + "/files/" + hash, RawQuery: q.Encode()}).String()
}

// errUpload is the answer to an upload URL that is not one of ours, or no
// longer valid.
var errUpload = errdefs.WithCode("invalid_signature", fmt.Errorf("the upload URL is not valid (signature) or has expired; ask for a new one: %w", errdefs.ErrPermission))

// put serves PUT /templates/{templateID}/files/{hash}: the upload URL.
// The body is stored as it comes (the SDK sends a tar archive, gzipped
// unless asked otherwise) once whole; a build unpacks it.
func (u *uploads) put(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	project, templateID, hash := q.Get("project"), r.PathValue("templateID"), r.PathValue("hash")
	expires, err := strconv.ParseInt(q.Get("expires"), 10, 64)
	if err != nil || !projectRE.MatchString(project) || !filesHashRE.MatchString(hash) ||
		!hmac.Equal([]byte(q.Get("signature")), []byte(u.sign(project, templateID, hash, expires))) || time.Now().Unix() > expires {
		return errUpload
	}
	if r.ContentLength > u.max {
		return tooLarge(u.max)
	}
	if err := u.disk.Check(); err != nil {
		return err
	}
	dir := filepath.Join(u.dir, project)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ".upload-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	n, err := io.Copy(tmp, http.MaxBytesReader(w, r.Body, u.max))
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return tooLarge(u.max)
	case err != nil:
		return disk.Classify(dir, fmt.Errorf("upload of %s: %w", hash, err))
	case n == 0:
		return invalid("body: empty; want the tar archive of the step's files")
	}
	if err := os.Rename(tmp.Name(), u.path(project, hash)); err != nil {
		return err
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

func tooLarge(max int64) error {
	return errdefs.WithCode("upload_too_large", fmt.Errorf("the files are larger than this server's limit of %d bytes (--max-build-context): %w", max, errdefs.ErrTooLarge))
}

// prune removes project's files not used for filesTTL.
func (u *uploads) prune(project string) {
	dir := filepath.Join(u.dir, project)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil || fi.Mode()&fs.ModeType != 0 {
			continue
		}
		if time.Since(fi.ModTime()) > filesTTL {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}
