package api

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/disk"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
)

// agentFor returns the agent of the request's sandbox.
func (s *server) agentFor(r *http.Request, p store.Project) (*agent.Client, error) {
	ag, _, err := s.sandboxes.Wake(r.Context(), p.ID, r.PathValue("id"))
	return ag, err
}

// pathQuery reads a required path and an optional user from the query and
// finds the agent of the request's sandbox.
func (s *server) pathQuery(r *http.Request, p store.Project) (ag *agent.Client, path, user string, err error) {
	q := r.URL.Query()
	path, user = q.Get("path"), q.Get("user")
	if err := requirePath("path", path); err != nil {
		return nil, "", "", err
	}
	ag, err = s.agentFor(r, p)
	return ag, path, user, err
}

func requirePath(field, path string) error {
	if path == "" {
		return fmt.Errorf("%s: required, an absolute path in the sandbox: %w", field, errdefs.ErrInvalid)
	}
	if strings.IndexByte(path, 0) >= 0 {
		return fmt.Errorf("%s: contains a NUL byte: %w", field, errdefs.ErrInvalid)
	}
	return nil
}

func (s *server) writeFile(w http.ResponseWriter, r *http.Request, p store.Project) error {
	req, err := decodeWrite(w, r)
	if err != nil {
		return err
	}
	if err := requirePath("path", req.Path); err != nil {
		return err
	}
	if req.Content == nil {
		return fmt.Errorf("content: required, a string: %w", errdefs.ErrInvalid)
	}
	var body io.Reader
	switch req.Encoding {
	case "", "utf8", "utf-8":
		body = bytes.NewReader(req.Content)
	case "base64":
		b := make([]byte, base64.StdEncoding.DecodedLen(len(req.Content)))
		n, err := base64.StdEncoding.Decode(b, req.Content)
		if err != nil {
			return fmt.Errorf("content: not valid base64: %v: %w", err, errdefs.ErrInvalid)
		}
		body = bytes.NewReader(b[:n])
	default:
		return fmt.Errorf("encoding %q: must be \"base64\" or absent: %w", req.Encoding, errdefs.ErrInvalid)
	}
	ag, err := s.agentFor(r, p)
	if err != nil {
		return err
	}
	if err := s.disk.Check(); err != nil {
		return err
	}
	if err := ag.WriteFile(r.Context(), req.Path, req.User, body); err != nil {
		// The agent writes a temporary file and renames it into place, and
		// removes it when the write fails: a disk that filled half-way
		// leaves no partial file and the old one as it was.
		if s.disk != nil {
			err = disk.Classify(s.disk.Dir, err)
		}
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// writeRequest is the body of a file write.
type writeRequest struct {
	Path     string
	Content  []byte // nil when absent
	Encoding string
	User     string
}

// decodeWrite reads a file write's JSON body. Bodies carry up to tens of MB
// of content, so the common shape takes a one-pass fast path (flatStrings);
// anything else goes through decode, which also names errors.
func decodeWrite(w http.ResponseWriter, r *http.Request) (writeRequest, error) {
	raw, err := readBody(w, r, maxWriteBody)
	if err != nil {
		return writeRequest{}, err
	}
	if m, ok := flatStrings(raw); ok {
		req := writeRequest{Path: string(m["path"]), Content: m["content"], Encoding: string(m["encoding"]), User: string(m["user"])}
		return req, nil
	}
	var req struct {
		Path     string  `json:"path"`
		Content  *string `json:"content"`
		Encoding string  `json:"encoding"`
		User     string  `json:"user"`
	}
	if err := unmarshal(raw, &req); err != nil {
		return writeRequest{}, err
	}
	out := writeRequest{Path: req.Path, Encoding: req.Encoding, User: req.User}
	if req.Content != nil {
		out.Content = []byte(*req.Content)
	}
	return out, nil
}

func (s *server) readFile(w http.ResponseWriter, r *http.Request, p store.Project) error {
	ag, path, user, err := s.pathQuery(r, p)
	if err != nil {
		return err
	}
	rc, err := ag.ReadFile(r.Context(), path, user)
	if err != nil {
		return err
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.WriteHeader(http.StatusOK)
	// Once bytes flow the status is sent; a failure mid-way can only cut the
	// body short, which the client sees as a broken response.
	if _, err := io.Copy(w, rc); err != nil {
		s.log.Warn("read file: copy cut short", "sandbox", r.PathValue("id"), "err", err)
	}
	return nil
}

func (s *server) removeFile(w http.ResponseWriter, r *http.Request, p store.Project) error {
	var req struct {
		Path string `json:"path"`
		User string `json:"user"`
	}
	if err := decode(w, r, maxBody, &req); err != nil {
		return err
	}
	if req.Path == "" {
		req.Path = r.URL.Query().Get("path")
	}
	if err := requirePath("path", req.Path); err != nil {
		return err
	}
	ag, err := s.agentFor(r, p)
	if err != nil {
		return err
	}
	if err := ag.Remove(r.Context(), req.Path, req.User); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *server) listFiles(w http.ResponseWriter, r *http.Request, p store.Project) error {
	ag, path, user, err := s.pathQuery(r, p)
	if err != nil {
		return err
	}
	entries, err := ag.List(r.Context(), path, user)
	if err != nil {
		return err
	}
	if entries == nil {
		entries = []agent.FileEntry{}
	}
	writeJSON(w, http.StatusOK, entries)
	return nil
}

func (s *server) statFile(w http.ResponseWriter, r *http.Request, p store.Project) error {
	ag, path, user, err := s.pathQuery(r, p)
	if err != nil {
		return err
	}
	st, err := ag.Stat(r.Context(), path, user)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, st)
	return nil
}

func (s *server) moveFile(w http.ResponseWriter, r *http.Request, p store.Project) error {
	var req agent.MoveRequest
	if err := decode(w, r, maxBody, &req); err != nil {
		return err
	}
	if err := requirePath("from", req.From); err != nil {
		return err
	}
	if err := requirePath("to", req.To); err != nil {
		return err
	}
	ag, err := s.agentFor(r, p)
	if err != nil {
		return err
	}
	if err := ag.Move(r.Context(), req.From, req.To, req.User); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
