// Package tmplqueue builds built-in templates in the background of a
// server that already serves (lizard serve --build-templates): a fresh
// machine serves sandboxes of base as soon as base is built, while the
// other templates are built one after another. Until a template is built a
// create of it answers 503 template_building with Retry-After (Lookup), and
// the listings show it as queued or building with the build's last
// progress line (Status; the API, the dashboard and, through the status
// file, `lizard template ls`).
package tmplqueue

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/template"
)

// States of a queued template.
const (
	Queued   = "queued"   // waits for the builds before it
	Building = "building" // being built now
	Failed   = "build_failed"
)

// Status is a queued template's state, as the listings show it.
type Status struct {
	Name  string `json:"name"`
	State string `json:"state"`
	// Progress is the build's last progress line (building), or the
	// error (build_failed).
	Progress string    `json:"progress,omitempty"`
	Since    time.Time `json:"since"`
}

// Builder builds a built-in template unless it is built (template.Registry).
type Builder interface {
	EnsureBuilt(ctx context.Context, name string, progress io.Writer) (template.Template, error)
}

// Templates is what the sandbox service looks templates up in
// (sandbox.Templates); Queue wraps it.
type Templates interface {
	Lookup(project, name string) (template.Template, error)
	LookupVersion(project, name, digest string) (template.Template, error)
}

// Config wires a Queue.
type Config struct {
	Builder Builder
	// Templates is what Lookup asks first.
	Templates Templates
	// Names are the built-in templates to build (aliases resolved),
	// in order.
	Names []string
	// StatusFile is where the states are written for `lizard template
	// ls` ("": nowhere); it is removed once every build ended well.
	StatusFile string
	// Built is called with each template built (a ready state, a
	// publish); may be nil.
	Built  func(ctx context.Context, t template.Template)
	Logger *slog.Logger
}

// Queue builds its templates in order; it is safe for concurrent use.
type Queue struct {
	cfg Config
	log *slog.Logger

	mu     sync.Mutex
	states map[string]*Status
	wrote  time.Time
}

// New makes a Queue of cfg.Names, every one queued until Run builds it.
func New(cfg Config) *Queue {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	names := make([]string, len(cfg.Names))
	now := time.Now().UTC()
	states := map[string]*Status{}
	for i, n := range cfg.Names {
		names[i] = template.Resolve(n)
		states[names[i]] = &Status{Name: names[i], State: Queued, Since: now}
	}
	cfg.Names = names
	return &Queue{cfg: cfg, log: cfg.Logger, states: states}
}

// RetryAfter is the Retry-After (seconds) of a create of a template being
// built.
const RetryAfter = 30

// ErrBuilding is the code of a create refused because its template is
// being built.
const ErrBuilding = "template_building"

// Run builds the queued templates one after another until each ended
// (built, already built, or failed: logged, shown, and not retried until
// the next start) or ctx is done.
func (q *Queue) Run(ctx context.Context) {
	for _, name := range q.cfg.Names {
		if ctx.Err() != nil {
			return
		}
		q.set(name, Building, "starting")
		start := time.Now()
		q.log.Info("template build in the background", "template", name)
		t, err := q.cfg.Builder.EnsureBuilt(ctx, name, &progress{q: q, name: name})
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			q.log.Error("background template build failed; `lizard template build` retries it, as does the next start", "template", name, "err", err)
			q.set(name, Failed, err.Error())
			continue
		}
		q.log.Info("template built in the background", "template", name, "version", t.Version, "took", time.Since(start).Round(time.Second))
		if q.cfg.Built != nil {
			q.cfg.Built(ctx, t)
		}
		q.done(name)
	}
}

// Status returns name's state while it is queued, building or failed.
func (q *Queue) Status(name string) (Status, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	s, ok := q.states[template.Resolve(name)]
	if !ok {
		return Status{}, false
	}
	return *s, true
}

// Lookup implements sandbox.Templates over cfg's: a template not built
// yet that waits or is being built is a 503 template_building naming its
// state, instead of not found.
func (q *Queue) Lookup(project, name string) (template.Template, error) {
	t, err := q.cfg.Templates.Lookup(project, name)
	return t, q.refine(name, err)
}

// LookupVersion implements sandbox.Templates.
func (q *Queue) LookupVersion(project, name, digest string) (template.Template, error) {
	t, err := q.cfg.Templates.LookupVersion(project, name, digest)
	return t, q.refine(name, err)
}

func (q *Queue) refine(name string, err error) error {
	if !errors.Is(err, errdefs.ErrNotFound) || !template.IsBuiltin(name) {
		return err
	}
	s, ok := q.Status(name)
	if !ok || s.State == Failed {
		return err
	}
	what := "waits to be built, after the templates before it"
	if s.State == Building {
		what = "is being built (" + s.Progress + ")"
	}
	return errdefs.WithCode(ErrBuilding, fmt.Errorf("template %q %s; retry in a minute: %w", template.Resolve(name), what, errdefs.ErrUnavailable))
}

// set records name's state and writes the status file (progress lines at
// most once a second).
func (q *Queue) set(name, state, line string) {
	q.mu.Lock()
	s := q.states[name]
	if s.State != state {
		s.Since = time.Now().UTC()
	}
	s.State, s.Progress = state, line
	write := state != Building || time.Since(q.wrote) >= time.Second
	if write {
		q.wrote = time.Now()
	}
	q.mu.Unlock()
	if write {
		q.writeStatus()
	}
}

// done forgets name: it is built, and the registry lists it.
func (q *Queue) done(name string) {
	q.mu.Lock()
	delete(q.states, name)
	q.mu.Unlock()
	q.writeStatus()
}

// writeStatus writes the states for `lizard template ls`, or removes the
// file when none is left.
func (q *Queue) writeStatus() {
	if q.cfg.StatusFile == "" {
		return
	}
	q.mu.Lock()
	list := make([]Status, 0, len(q.states))
	for _, n := range q.cfg.Names {
		if s, ok := q.states[n]; ok {
			list = append(list, *s)
		}
	}
	q.mu.Unlock()
	if len(list) == 0 {
		os.Remove(q.cfg.StatusFile)
		return
	}
	b, _ := json.MarshalIndent(list, "", "  ")
	tmp := q.cfg.StatusFile + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err == nil {
		err = os.Rename(tmp, q.cfg.StatusFile)
		if err != nil {
			q.log.Warn("template build status file", "err", err)
		}
	}
}

// ReadStatus reads the states a server's queue wrote in file (none when
// it has none).
func ReadStatus(file string) ([]Status, error) {
	b, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var list []Status
	if err := json.Unmarshal(b, &list); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Base(file), err)
	}
	return list, nil
}

// progress keeps a build's last line as its template's progress.
type progress struct {
	q    *Queue
	name string
	buf  bytes.Buffer
}

func (p *progress) Write(b []byte) (int, error) {
	p.buf.Write(b)
	for {
		line, err := p.buf.ReadString('\n')
		if err != nil {
			// An unfinished line waits for the rest.
			rest := line
			p.buf.Reset()
			p.buf.WriteString(rest)
			return len(b), nil
		}
		if line = strings.TrimSpace(line); line != "" {
			if len(line) > 200 {
				line = line[:200] + "…"
			}
			p.q.set(p.name, Building, line)
		}
	}
}
