package api

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/template"
)

// TemplateBuilder builds a template from a Dockerfile and a context
// directory, writing progress lines to progress.
type TemplateBuilder interface {
	// BuildDockerfile builds project's template name.
	BuildDockerfile(ctx context.Context, project, name string, opts BuildOptions, progress io.Writer) (template.Template, error)
}

// BuildOptions is what a build request asks for.
type BuildOptions struct {
	Dockerfile []byte
	ContextDir string
	BuildArgs  map[string]string
	// ReadyCommand, a shell command, replaces the Dockerfile's HEALTHCHECK.
	ReadyCommand string
}

// buildRequest is the body of POST /api/templates: the Dockerfile's text,
// the build context's files (relative path → base64 content), and
// optionally the command telling when the start command is ready.
type buildRequest struct {
	Name       string            `json:"name"`
	Dockerfile string            `json:"dockerfile"`
	Files      map[string]string `json:"files"`
	BuildArgs  map[string]string `json:"buildArgs"`
	ReadyCmd   string            `json:"readyCmd"`
}

// buildRoutes serve POST /api/templates.
type buildRoutes struct {
	builder  TemplateBuilder
	maxBuild int64
}

// buildTemplate builds a template from a Dockerfile, as `lizard template
// build -f` does. With Accept: text/event-stream the build's progress
// streams as events ({"line"}), then {"template"} or {"error"}; otherwise
// the answer is the template once built.
func (s buildRoutes) buildTemplate(w http.ResponseWriter, r *http.Request, p store.Project) error {
	if s.builder == nil {
		return errdefs.WithCode("feature_unavailable", fmt.Errorf("this server cannot build templates: %w", errdefs.ErrInvalid))
	}
	var req buildRequest
	if err := decode(w, r, s.maxBuild, &req); err != nil {
		if errors.Is(err, errdefs.ErrTooLarge) {
			return errdefs.WithCode("build_context_too_large", fmt.Errorf(
				"build context: the request (dockerfile and files, base64) is larger than this server's limit of %d bytes (--max-build-context): %w",
				s.maxBuild, errdefs.ErrTooLarge))
		}
		return err
	}
	if req.Name == "" || strings.TrimSpace(req.Dockerfile) == "" {
		return fmt.Errorf("name and dockerfile: required: %w", errdefs.ErrInvalid)
	}
	if template.IsBuiltin(req.Name) {
		return fmt.Errorf("name: %q is a built-in template, which API keys cannot build over; choose another name: %w", req.Name, errdefs.ErrConflict)
	}
	dir, err := os.MkdirTemp("", "lizard-build-context-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := writeContext(dir, req.Files); err != nil {
		return err
	}
	opts := BuildOptions{Dockerfile: []byte(req.Dockerfile), ContextDir: dir, BuildArgs: req.BuildArgs, ReadyCommand: req.ReadyCmd}
	if !strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
		t, err := s.builder.BuildDockerfile(r.Context(), p.ID, req.Name, opts, io.Discard)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusCreated, templateOf(t))
		return nil
	}
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	send := func(v any) {
		b, _ := json.Marshal(v)
		fmt.Fprintf(w, "data: %s\n\n", b)
		rc.Flush()
	}
	t, err := s.builder.BuildDockerfile(r.Context(), p.ID, req.Name, opts, &eventLines{send: send})
	if err != nil {
		_, code, msg := statusOf(err)
		send(map[string]string{"error": msg, "code": code})
		return nil
	}
	send(map[string]any{"template": templateOf(t)})
	return nil
}

// writeContext writes the build context's files under dir; a path that
// would leave it is refused.
func writeContext(dir string, files map[string]string) error {
	for p, content := range files {
		clean := filepath.Clean(p)
		if p == "" || filepath.IsAbs(p) || clean == ".." || strings.HasPrefix(clean, "../") {
			return fmt.Errorf("files: %q must be a relative path inside the context: %w", p, errdefs.ErrInvalid)
		}
		b, err := base64.StdEncoding.DecodeString(content)
		if err != nil {
			return fmt.Errorf("files: %q: not base64: %w", p, errdefs.ErrInvalid)
		}
		full := filepath.Join(dir, clean)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(full, b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// eventLines turns progress writes into one event per line.
type eventLines struct {
	send func(any)
	buf  []byte
}

func (e *eventLines) Write(p []byte) (int, error) {
	e.buf = append(e.buf, p...)
	for {
		i := strings.IndexByte(string(e.buf), '\n')
		if i < 0 {
			return len(p), nil
		}
		e.send(map[string]string{"line": string(e.buf[:i])})
		e.buf = e.buf[i+1:]
	}
}
