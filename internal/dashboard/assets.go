// Package dashboard is lizard's web dashboard: a small single-page app
// (plain JavaScript, no build step; xterm.js vendored under static/vendor)
// embedded in the binary, and the in-memory sessions a sign-in with an API
// key starts. The page calls the same HTTP API as the SDKs; internal/api
// serves it (through an http.Handler and a narrow Sessions interface),
// accepts a session cookie in place of an API key, and owns the sign-in
// routes. Only cmd/lizard imports it.
package dashboard

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"
	"sync"
	"time"
)

//go:embed static
var static embed.FS

// asset is one file of the app, with its gzip form and an ETag.
type asset struct {
	name   string
	body   []byte
	etag   string
	ct     string
	gzOnce sync.Once
	gz     []byte // set by gzipped
}

// gzipped is the file compressed, made on first use: compressing every
// file at start costs a busy host's server seconds before it can listen.
func (f *asset) gzipped() []byte {
	f.gzOnce.Do(func() {
		var gz bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&gz, gzip.BestCompression)
		zw.Write(f.body)
		zw.Close()
		f.gz = gz.Bytes()
	})
	return f.gz
}

// Assets serves the app: "/" is index.html, "/dashboard/static/NAME" the
// other files. Files are revalidated by ETag (names carry no hash) and
// sent gzipped to clients that accept it. The page's Content-Security-Policy
// admits nothing from another origin.
type Assets struct {
	files map[string]*asset
}

// NewAssets loads the embedded files (each is compressed when first sent).
func NewAssets() (*Assets, error) {
	a := &Assets{files: map[string]*asset{}}
	err := fs.WalkDir(static, "static", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := static.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		ct := mime.TypeByExtension(path.Ext(p))
		if ct == "" {
			ct = "application/octet-stream"
		}
		name := strings.TrimPrefix(p, "static/")
		a.files[name] = &asset{name: name, body: b, etag: `"` + hex.EncodeToString(sum[:12]) + `"`, ct: ct}
		return nil
	})
	return a, err
}

// CompressedSize is the sum of the gzipped files: what a first visit
// downloads at most.
func (a *Assets) CompressedSize() int {
	n := 0
	for _, f := range a.files {
		n += len(f.gzipped())
	}
	return n
}

const csp = "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; " +
	"connect-src 'self'; frame-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"

func (a *Assets) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	name := "index.html"
	if r.URL.Path != "/" {
		name = strings.TrimPrefix(r.URL.Path, "/dashboard/static/")
	}
	f, ok := a.files[name]
	if !ok || name == "" {
		http.NotFound(w, r)
		return
	}
	h := w.Header()
	h.Set("Content-Type", f.ct)
	h.Set("Cache-Control", "no-cache")
	h.Set("ETag", f.etag)
	h.Set("Vary", "Accept-Encoding")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	if name == "index.html" {
		h.Set("Content-Security-Policy", csp)
		h.Set("X-Frame-Options", "DENY")
	}
	body := f.body
	if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
		h.Set("Content-Encoding", "gzip")
		body = f.gzipped()
	}
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(body))
}
