package server

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/lizard-build/lizard/internal/agent"
)

// maxMoveBody bounds a MoveRequest.
const maxMoveBody = 64 << 10

// File handlers: for root they work in the agent itself; for any other user
// in a __fileop child running as that user (see FileOpCommand).

// fileRequest reads the path and user query parameters.
func (s *Server) fileRequest(r *http.Request) (string, *account, error) {
	q := r.URL.Query()
	p, err := cleanPath("path", q.Get("path"))
	if err != nil {
		return "", nil, err
	}
	acct, err := s.accts.lookupAccount(q.Get("user"))
	if err != nil {
		return "", nil, err
	}
	return p, acct, nil
}

// cleanPath checks that p, the parameter name, is a usable absolute path
// and cleans it.
func cleanPath(name, p string) (string, error) {
	switch {
	case p == "":
		return "", errInvalid("%s is required", name)
	case strings.IndexByte(p, 0) >= 0:
		return "", errInvalid("%s %q contains a NUL byte", name, p)
	case !filepath.IsAbs(p):
		return "", errInvalid("%s %q is not absolute", name, p)
	}
	return filepath.Clean(p), nil
}

// fileOpFor runs a data-less operation as acct.
func (s *Server) fileOpFor(acct *account, op fileOp) (fileResult, error) {
	if acct.isRoot() {
		return simpleOp(op)
	}
	return s.runFileOp(acct, op)
}

func (s *Server) statFile(w http.ResponseWriter, r *http.Request) error {
	p, acct, err := s.fileRequest(r)
	if err != nil {
		return err
	}
	res, err := s.fileOpFor(acct, fileOp{Op: opStat, Path: p})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, res.Stat)
	return nil
}

func (s *Server) listFiles(w http.ResponseWriter, r *http.Request) error {
	p, acct, err := s.fileRequest(r)
	if err != nil {
		return err
	}
	res, err := s.fileOpFor(acct, fileOp{Op: opList, Path: p})
	if err != nil {
		return err
	}
	if res.List == nil {
		res.List = []agent.FileEntry{}
	}
	writeJSON(w, http.StatusOK, res.List)
	return nil
}

func (s *Server) removeFile(w http.ResponseWriter, r *http.Request) error {
	p, acct, err := s.fileRequest(r)
	if err != nil {
		return err
	}
	if _, err := s.fileOpFor(acct, fileOp{Op: opRemove, Path: p}); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) moveFile(w http.ResponseWriter, r *http.Request) error {
	var req agent.MoveRequest
	if err := decodeJSON(w, r, maxMoveBody, &req); err != nil {
		return err
	}
	from, err := cleanPath("from", req.From)
	if err != nil {
		return err
	}
	to, err := cleanPath("to", req.To)
	if err != nil {
		return err
	}
	acct, err := s.accts.lookupAccount(req.User)
	if err != nil {
		return err
	}
	if _, err := s.fileOpFor(acct, fileOp{Op: opMove, Path: from, To: to}); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) readFile(w http.ResponseWriter, r *http.Request) error {
	p, acct, err := s.fileRequest(r)
	if err != nil {
		return err
	}
	return s.sendFile(w, acct, p)
}

// sendFile answers with the contents of p, read as acct.
func (s *Server) sendFile(w http.ResponseWriter, acct *account, p string) error {
	if !acct.isRoot() {
		return s.readFileAs(w, acct, p)
	}
	f, err := openRegular(p)
	if err != nil {
		return err
	}
	defer f.Close()
	startDownload(w)
	if _, err := io.Copy(w, f); err != nil {
		abortDownload()
	}
	return nil
}

func (s *Server) readFileAs(w http.ResponseWriter, acct *account, p string) error {
	c, err := s.startFileOp(acct, fileOp{Op: opRead, Path: p})
	if err != nil {
		return err
	}
	res, err := c.readResult()
	if err == nil {
		err = res.err()
	}
	if err != nil {
		c.stdout.Close()
		<-c.status
		return err
	}
	startDownload(w)
	_, cerr := io.Copy(w, c.stdout)
	// Closing first makes a child still writing (client gone) die of EPIPE.
	c.stdout.Close()
	ws := <-c.status
	if cerr != nil || exitCode(ws) != 0 {
		abortDownload()
	}
	return nil
}

func startDownload(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/octet-stream")
	w.WriteHeader(http.StatusOK)
}

// abortDownload cuts the connection so that the client sees a broken
// download rather than a short file that looks complete.
func abortDownload() {
	panic(http.ErrAbortHandler)
}

func (s *Server) writeFile(w http.ResponseWriter, r *http.Request) error {
	p, acct, err := s.fileRequest(r)
	if err != nil {
		return err
	}
	if err := s.putFile(acct, p, r.Body, nil); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// putFile writes body to p as acct (parents created), with the metadata
// md (envd's; nil for none).
func (s *Server) putFile(acct *account, p string, body io.Reader, md map[string]string) error {
	body = &bodyReader{r: body}
	if acct.isRoot() {
		return writeFile(p, body, md)
	}
	if os.Geteuid() == 0 {
		if err := ensureParents(p, acct); err != nil {
			return err
		}
	}
	return s.writeFileAs(acct, p, body, md)
}

// ensureParents makes p's missing parent directories as the agent (root)
// and gives each one it made to acct, as envd does: a user may write a
// file under directories that do not exist yet, wherever they are (E2B's
// tests write /<n>/file as user). What exists is left as it is, and the
// file itself is still written as acct.
func ensureParents(p string, acct *account) error {
	var missing []string
	for d := filepath.Dir(p); ; d = filepath.Dir(d) {
		_, err := os.Lstat(d)
		if err == nil {
			break
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		missing = append(missing, d)
		if d == filepath.Dir(d) {
			break
		}
	}
	var made []string
	for i := len(missing) - 1; i >= 0; i-- {
		err := os.Mkdir(missing[i], newDirMode)
		if err == nil {
			made = append(made, missing[i])
			err = os.Lchown(missing[i], int(acct.uid), int(acct.gid))
		} else if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			// Nothing half-made stays: what this call made goes, deepest
			// first.
			for j := len(made) - 1; j >= 0; j-- {
				os.Remove(made[j])
			}
			return err
		}
	}
	return nil
}

// writeFileAs streams body to a child writing p as acct.
func (s *Server) writeFileAs(acct *account, p string, body io.Reader, md map[string]string) error {
	c, err := s.startFileOp(acct, fileOp{Op: opWrite, Path: p, Metadata: md})
	if err != nil {
		return err
	}
	copied := make(chan error, 1)
	go func() {
		err := writeFrames(c.stdin, body)
		c.stdin.Close()
		copied <- err
	}()
	res, rerr := c.readResult()
	// The child is done with its stdin; closing it also unblocks a copier
	// still writing after the child failed early.
	c.stdin.Close()
	cerr := <-copied
	ws := <-c.status
	var ue *uploadError
	if errors.As(cerr, &ue) {
		return cerr
	}
	if rerr != nil {
		return fmt.Errorf("%w (child exit code %d)", rerr, exitCode(ws))
	}
	return res.err()
}

// bodyReader marks failures to read the request body as uploadError.
type bodyReader struct{ r io.Reader }

func (b *bodyReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		err = &uploadError{err: err}
	}
	return n, err
}
