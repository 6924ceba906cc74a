package server

import (
	"compress/gzip"
	"crypto/subtle"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/lizard-build/lizard/internal/agent"
)

// envdEntry is one written file in POST /files's answer, with the
// metadata it kept.
type envdEntry struct {
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Path     string            `json:"path"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// fileTarget resolves GET and POST /files's user and path, and checks the
// signature of a signed URL (operation "read" or "write"). raw is the path
// parameter as given ("" allowed for multipart uploads naming their files).
func (s *Server) fileTarget(r *http.Request, operation string) (raw string, acct *account, err error) {
	q := r.URL.Query()
	raw = q.Get("path")
	if err := s.envd.checkSignature(r, raw, operation); err != nil {
		return "", nil, err
	}
	acct, err = s.envd.account(r.Header, q.Get("username"))
	return raw, acct, err
}

// checkSignature verifies E2B's signed URLs when the request carries a
// signature and no access token: "v1_" and the unpadded standard base64 of
// sha256("path:operation:user:token[:expiration]"), with path and user as
// the query gives them. An expired signature is refused.
func (e *envd) checkSignature(r *http.Request, path, operation string) error {
	q := r.URL.Query()
	if !q.Has("signature") || r.Header.Get("X-Access-Token") != "" {
		return nil
	}
	e.mu.RLock()
	secure, token := e.secure, e.token
	e.mu.RUnlock()
	if !secure {
		return nil
	}
	exp := q.Get("signature_expiration")
	if exp != "" {
		n, err := strconv.ParseInt(exp, 10, 64)
		if err != nil {
			return &apiError{http.StatusBadRequest, codeInvalid, "signature_expiration is not a unix time in seconds"}
		}
		if time.Now().Unix() > n {
			// E2B envd's words, which its SDK's tests match.
			return &apiError{http.StatusUnauthorized, codeUnauthenticated, "signature is already expired"}
		}
	}
	want := agent.FileSignature(path, operation, q.Get("username"), token, exp)
	if subtle.ConstantTimeCompare([]byte(q.Get("signature")), []byte(want)) != 1 {
		return &apiError{http.StatusUnauthorized, codeUnauthenticated, "invalid signature for " + operation + " of " + path}
	}
	return nil
}

func (s *Server) envdGetFile(w http.ResponseWriter, r *http.Request) error {
	raw, acct, err := s.fileTarget(r, "read")
	if err != nil {
		return err
	}
	p, err := resolvePath("path", raw, acct)
	if err != nil {
		return err
	}
	return s.sendFile(w, acct, p)
}

// maxMultipartHeader bounds a multipart part's headers.
const maxMultipartHeader = 64 << 10

func (s *Server) envdPostFiles(w http.ResponseWriter, r *http.Request) error {
	raw, acct, err := s.fileTarget(r, "write")
	if err != nil {
		return err
	}
	md, err := metadataFromHeader(r.Header)
	if err != nil {
		return err
	}
	body := io.Reader(r.Body)
	switch strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))) {
	case "", "identity":
	case "gzip":
		zr, err := gzip.NewReader(&bodyReader{r: r.Body})
		if err != nil {
			return errInvalid("the body is not gzip: %v", err)
		}
		defer zr.Close()
		body = zr
	default:
		return &apiError{http.StatusUnsupportedMediaType, codeInvalid, "Content-Encoding must be gzip or none"}
	}
	ctype, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil {
		ctype = "application/octet-stream"
	}
	var written []envdEntry
	put := func(name string, data io.Reader) error {
		p, err := resolvePath("path", name, acct)
		if err != nil {
			return err
		}
		if err := s.putFile(acct, p, data, md); err != nil {
			return err
		}
		e := envdEntry{Name: filepath.Base(p), Type: "file", Path: p}
		if len(md) > 0 {
			// What the file system kept (none without extended attributes).
			res, err := s.fileOpFor(acct, fileOp{Op: opEntry, Path: p})
			if err != nil {
				return err
			}
			e.Metadata = res.Entry.Metadata
		}
		written = append(written, e)
		return nil
	}
	if ctype == "multipart/form-data" {
		if params["boundary"] == "" {
			return errInvalid("multipart body without a boundary")
		}
		mr := multipart.NewReader(body, params["boundary"])
		for {
			part, err := mr.NextPart()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return errInvalid("reading multipart body: %v", err)
			}
			if part.FormName() != "file" {
				continue
			}
			name := raw
			if name == "" {
				// The raw filename: Part.FileName keeps only its base.
				_, dp, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
				name = dp["filename"]
			}
			if name == "" {
				return errInvalid("a file part names no path (no path parameter, no filename)")
			}
			if err := put(name, part); err != nil {
				return err
			}
		}
		if len(written) == 0 {
			return errInvalid("the multipart body has no part named file")
		}
	} else {
		if raw == "" {
			return errInvalid("path is required for an octet-stream upload")
		}
		if err := put(raw, body); err != nil {
			return err
		}
	}
	writeJSON(w, http.StatusOK, written)
	return nil
}
