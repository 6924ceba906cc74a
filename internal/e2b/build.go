package e2b

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lizard-build/lizard/internal/api"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/template"
)

// E2B's template builds (the SDK's Template.build): POST /v3/templates
// requests a build of a name (a build id, status "waiting"); the SDK then
// uploads the files of its COPY steps (files.go) and sends the steps to
// POST /v2/templates/{templateID}/builds/{buildID}, which starts the build
// in the background; it polls GET .../status with logsOffset for the
// build's log lines until the status is "ready" or "error". A template is
// a lizard template of the key's project named by the E2B name (its
// templateID), built by the Dockerfile builder from the translated steps
// (buildsteps.go), its start command's ready state made before it
// switches, published like any other; its version is named by the build
// id. Builds live in this server's memory: a restart forgets them (the
// templates they built stay).

// Builder builds templates from steps (cmd/lizard's: the template
// registry with the node's runtime, the ready state of a start command
// made before the template switches to the new version, then published).
type Builder interface {
	// BuildSteps builds project's template name from steps, COPY sources
	// read from contextDir, the ready state of its start command made for
	// sandboxes of size, writing progress lines to progress. Its errors
	// name the step that failed (template.FailedStep).
	BuildSteps(ctx context.Context, project, name string, steps template.Steps, contextDir, size string, progress io.Writer) (template.Template, error)
}

// Build statuses, as E2B names them.
const (
	buildWaiting  = "waiting" // requested; the steps have not come
	buildBuilding = "building"
	buildReady    = "ready"
	buildError    = "error"
)

const (
	// maxRunning is how many builds of a project may run at once.
	maxRunning = 2
	// maxWaiting is how many requested builds a project may have waiting
	// for their steps, for waitingTTL at most.
	maxWaiting = 16
	waitingTTL = time.Hour
	// finishedTTL is how long a finished build's status and logs are kept.
	finishedTTL = time.Hour
	// maxLogEntries bounds a build's log; what comes after is counted.
	maxLogEntries = 20000
	// maxLogsPerPoll is the most log entries one status answers (E2B's).
	maxLogsPerPoll = 100
	// maxStartBody bounds the steps' request.
	maxStartBody = 4 << 20
)

// logEntry is E2B's BuildLogEntry.
type logEntry struct {
	Timestamp string  `json:"timestamp"`
	Level     string  `json:"level"`
	Message   string  `json:"message"`
	Step      *string `json:"step,omitempty"`
}

// buildReason is E2B's BuildStatusReason: why a build failed.
type buildReason struct {
	Message    string     `json:"message"`
	Step       *string    `json:"step,omitempty"`
	LogEntries []logEntry `json:"logEntries"`
}

// build is one requested build.
type build struct {
	id, project, template string
	tags                  []string
	created               time.Time

	mu       sync.Mutex
	status   string
	reason   *buildReason
	logs     []logEntry
	dropped  int // log lines beyond maxLogEntries
	finished time.Time
}

// log adds a line to the build's log.
func (b *build) log(level, msg string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.logs) >= maxLogEntries {
		b.dropped++
		return
	}
	b.logs = append(b.logs, logEntry{Timestamp: time.Now().UTC().Format(time.RFC3339Nano), Level: level, Message: msg})
}

// finish sets the build's final status.
func (b *build) finish(status string, reason *buildReason) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.dropped > 0 {
		b.logs = append(b.logs, logEntry{Timestamp: time.Now().UTC().Format(time.RFC3339Nano), Level: "warn",
			Message: fmt.Sprintf("%d more log lines were left out (a build keeps %d)", b.dropped, maxLogEntries)})
	}
	b.status, b.reason, b.finished = status, reason, time.Now()
}

// logWriter turns the builder's progress lines into log entries.
type logWriter struct {
	b      *build
	prefix string // the builder's "[name] "
	buf    []byte
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		line := strings.TrimPrefix(string(w.buf[:i]), w.prefix)
		w.buf = w.buf[i+1:]
		level := "info"
		if strings.HasPrefix(line, "warning: ") {
			level = "warn"
		}
		w.b.log(level, line)
	}
}

// buildRoutes serve E2B's template build, file, tag and delete calls.
type buildRoutes struct {
	builder   Builder
	templates Templates
	tags      store.TemplateTags // nil: tags are not kept
	refs      templateRefs
	uploads   *uploads
	ctx       context.Context // builds run under it
	log       *slog.Logger

	mu     sync.Mutex
	builds map[string]*build // by id
}

func newBuildRoutes(cfg Config, refs templateRefs) *buildRoutes {
	ctx := cfg.BuildContext
	if ctx == nil {
		ctx = context.Background()
	}
	maxUpload := cfg.MaxUpload
	if maxUpload <= 0 {
		maxUpload = api.DefaultMaxBuildContext
	}
	return &buildRoutes{builder: cfg.Builder, templates: cfg.Templates, tags: cfg.Tags, refs: refs,
		uploads: newUploads(cfg.FilesDir, maxUpload, cfg.Disk), ctx: ctx, log: cfg.Logger, builds: map[string]*build{}}
}

// available refuses the build calls on a server that cannot build.
func (s *buildRoutes) available() error {
	if s.builder == nil || s.uploads.dir == "" {
		return errdefs.WithCode("feature_unavailable", fmt.Errorf("this server cannot build templates: %w", errdefs.ErrInvalid))
	}
	return nil
}

// buildRequest is E2B's TemplateBuildRequestV3.
type buildRequest struct {
	Name          string   `json:"name"`
	Alias         string   `json:"alias"` // deprecated name of Name
	Tags          []string `json:"tags"`
	CPUCount      *int     `json:"cpuCount"`
	MemoryMB      *int     `json:"memoryMB"`
	MinFreeDiskMb *int     `json:"minFreeDiskMb"`
}

// buildRequested is E2B's TemplateRequestResponseV3.
type buildRequested struct {
	TemplateID string   `json:"templateID"`
	BuildID    string   `json:"buildID"`
	Aliases    []string `json:"aliases"`
	Names      []string `json:"names"`
	Tags       []string `json:"tags"`
	Public     bool     `json:"public"`
}

var (
	// identifierRE and tagRE are E2B's rules for a template's name and
	// tags (lower case); a name must also be a lizard template name.
	identifierRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,127}$`)
	tagRE        = regexp.MustCompile(`^[a-z0-9_.-]{1,64}$`)
	uuidRE       = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
)

// defaultTag is the tag of a build requested without one.
const defaultTag = "default"

// parseName splits E2B's "[namespace/]name[:tag]" (field names it in
// errors): the namespace may only be the project's slug, the tag "" when
// none or "default".
func parseName(field, ref string, p store.Project) (name, tag string, err error) {
	ref = strings.ToLower(strings.TrimSpace(ref))
	ident, tag, hasTag := strings.Cut(ref, ":")
	if ns, rest, ok := strings.Cut(ident, "/"); ok {
		if ns != p.Slug {
			return "", "", invalid("%s: namespace %q: a template belongs to the key's project (%q); give the name without a namespace", field, ns, p.Slug)
		}
		ident = rest
	}
	if !identifierRE.MatchString(ident) {
		return "", "", invalid("%s: %q: want lower case letters, digits, '_' and '-', starting with a letter or digit", field, ident)
	}
	if hasTag {
		if err := checkTag(field, tag); err != nil {
			return "", "", err
		}
		if tag == defaultTag {
			tag = ""
		}
	}
	return ident, tag, nil
}

func checkTag(field, tag string) error {
	if !tagRE.MatchString(tag) || uuidRE.MatchString(tag) {
		return invalid("%s: tag %q: want 1 to 64 lower case letters, digits, '_', '.' and '-' (not a UUID)", field, tag)
	}
	return nil
}

// request serves POST /v3/templates: a build of a name is requested.
func (s *buildRoutes) request(w http.ResponseWriter, r *http.Request, p store.Project) error {
	if err := s.available(); err != nil {
		return err
	}
	var req buildRequest
	if err := api.Decode(w, r, maxBody, &req); err != nil {
		return err
	}
	field, ref := "name", req.Name
	if ref == "" {
		field, ref = "alias", req.Alias
	}
	if ref == "" {
		return invalid("name: required (the template's name, optionally name:tag)")
	}
	name, tag, err := parseName(field, ref, p)
	if err != nil {
		return err
	}
	if template.IsBuiltin(name) || template.Resolve(name) != name || aliasOf(name) != "" || templateAliases[name] != "" {
		return invalid("%s: %q is a built-in template of lizard; give yours another name", field, name)
	}
	var tags []string
	if tag != "" {
		tags = append(tags, tag)
	}
	for i, t := range req.Tags {
		t = strings.ToLower(strings.TrimSpace(t))
		if err := checkTag(fmt.Sprintf("tags[%d]", i), t); err != nil {
			return err
		}
		if !slices.Contains(tags, t) {
			tags = append(tags, t)
		}
	}
	if len(tags) == 0 {
		tags = []string{defaultTag}
	}
	for f, v := range map[string]*int{"cpuCount": req.CPUCount, "memoryMB": req.MemoryMB, "minFreeDiskMb": req.MinFreeDiskMb} {
		if v != nil && *v < 0 {
			return invalid("%s %d: must be positive", f, *v)
		}
	}
	b := &build{id: newUUID(), project: p.ID, template: name, tags: tags, created: time.Now(), status: buildWaiting}
	if err := s.add(b); err != nil {
		return err
	}
	s.uploads.prune(p.ID)
	api.WriteJSON(w, http.StatusAccepted, buildRequested{TemplateID: name, BuildID: b.id, Aliases: []string{name}, Names: []string{name}, Tags: tags})
	return nil
}

// add records a requested build, within the project's bounds.
func (s *buildRoutes) add(b *build) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	waiting := 0
	for id, o := range s.builds {
		o.mu.Lock()
		st, created, finished := o.status, o.created, o.finished
		o.mu.Unlock()
		switch {
		case st == buildWaiting && time.Since(created) > waitingTTL, !finished.IsZero() && time.Since(finished) > finishedTTL:
			delete(s.builds, id)
		case st == buildWaiting && o.project == b.project:
			waiting++
		}
	}
	if waiting >= maxWaiting {
		return fmt.Errorf("the project has %d template builds requested and not started (at most %d; they expire after %s): %w",
			waiting, maxWaiting, waitingTTL, errdefs.ErrLimit)
	}
	s.builds[b.id] = b
	return nil
}

// get returns project's build id of template; another project's is not
// found.
func (s *buildRoutes) get(project, templateID, id string) (*build, error) {
	s.mu.Lock()
	b := s.builds[id]
	s.mu.Unlock()
	if b == nil || b.project != project || b.template != templateID {
		return nil, fmt.Errorf("build %q of template %q: no such build on this server: %w", id, templateID, errdefs.ErrNotFound)
	}
	return b, nil
}

// known refuses a template the project neither built nor requested a
// build of.
func (s *buildRoutes) known(project, templateID string) error {
	s.mu.Lock()
	for _, b := range s.builds {
		if b.project == project && b.template == templateID {
			s.mu.Unlock()
			return nil
		}
	}
	s.mu.Unlock()
	_, err := s.refs.current(project, templateID)
	return err
}

// fileUpload is E2B's TemplateBuildFileUpload.
type fileUpload struct {
	Present bool   `json:"present"`
	URL     string `json:"url,omitempty"`
}

// files serves GET /templates/{templateID}/files/{hash}: whether the
// server has the files of hash, and where to upload them (always given:
// the SDK uploads again when told to force it).
func (s *buildRoutes) files(w http.ResponseWriter, r *http.Request, p store.Project) error {
	if err := s.available(); err != nil {
		return err
	}
	id, hash := r.PathValue("templateID"), r.PathValue("hash")
	if !filesHashRE.MatchString(hash) {
		return invalid("hash %q: want the hex SHA-256 of the files the SDK computes", hash)
	}
	if err := s.known(p.ID, id); err != nil {
		return err
	}
	api.WriteJSON(w, http.StatusCreated, fileUpload{Present: s.uploads.has(p.ID, hash), URL: s.uploads.uploadURL(r, p.ID, id, hash)})
	return nil
}

// start serves POST /v2/templates/{templateID}/builds/{buildID}: the
// steps of a requested build, which starts in the background.
func (s *buildRoutes) start(w http.ResponseWriter, r *http.Request, p store.Project) error {
	if err := s.available(); err != nil {
		return err
	}
	var req buildStart
	if err := api.Decode(w, r, maxStartBody, &req); err != nil {
		return err
	}
	b, err := s.get(p.ID, r.PathValue("templateID"), r.PathValue("buildID"))
	if err != nil {
		return err
	}
	steps, copies, err := planBuild(req, b.id)
	if err != nil {
		return err
	}
	for _, c := range copies {
		if !s.uploads.has(p.ID, c.Hash) {
			i, _ := strconv.Atoi(c.Dir)
			return invalid("steps[%d].filesHash: the files of %s were not uploaded (GET /templates/%s/files/%s gives where to)", i, c.Hash, b.template, c.Hash)
		}
	}
	s.mu.Lock()
	running := 0
	for _, o := range s.builds {
		o.mu.Lock()
		if o.project == p.ID && o.status == buildBuilding {
			running++
		}
		o.mu.Unlock()
	}
	b.mu.Lock()
	status := b.status
	if status == buildWaiting && running < maxRunning {
		b.status = buildBuilding
	}
	b.mu.Unlock()
	s.mu.Unlock()
	switch {
	case status != buildWaiting:
		return fmt.Errorf("build %q is %s, not waiting for its steps (request a new build): %w", b.id, status, errdefs.ErrConflict)
	case running >= maxRunning:
		return fmt.Errorf("the project has %d template builds running (at most %d at once): %w", running, maxRunning, errdefs.ErrLimit)
	}
	go s.run(b, steps, copies)
	w.WriteHeader(http.StatusAccepted)
	return nil
}

// run builds b from steps, whose COPY sources are copies.
func (s *buildRoutes) run(b *build, steps template.Steps, copies []copySource) {
	ctx := s.ctx
	b.log("info", fmt.Sprintf("Building template %s (build %s)", b.template, b.id))
	t, err := s.runBuild(ctx, b, steps, copies)
	if err != nil {
		_, _, msg := api.StatusOf(err)
		reason := &buildReason{Message: msg, LogEntries: []logEntry{}}
		if n, ok := template.FailedStep(err); ok {
			step := strconv.Itoa(n)
			switch n {
			case 0:
				step = "base"
			case len(steps.Steps) + 1:
				step = "finalize"
			}
			reason.Step = &step
		}
		b.log("error", "Build failed: "+msg)
		s.log.Info("e2b template build failed", "project", b.project, "template", b.template, "build", b.id, "err", err)
		b.mu.Lock()
		if n := len(b.logs); n > 0 {
			reason.LogEntries = append(reason.LogEntries, b.logs[max(0, n-20):]...)
		}
		b.mu.Unlock()
		b.finish(buildError, reason)
		return
	}
	// The tags name the version built, which is named by the build that
	// made it: this one, or an earlier one that built the same bits (the
	// registry keeps one version of them).
	if t.Version != b.id {
		b.log("info", fmt.Sprintf("The build made the same template as build %s: its tags name that build", t.Version))
	}
	if s.tags != nil {
		if err := s.tags.AssignTemplateTags(context.WithoutCancel(ctx), b.project, b.template, t.Version, b.tags); err != nil {
			s.log.Error("e2b template built; its tags were not kept", "template", b.template, "build", b.id, "err", err)
			b.log("warn", "the build's tags were not kept: "+err.Error())
		}
	}
	b.log("info", fmt.Sprintf("Template %s is ready (build %s, tags %s)", t.Name, t.Version, strings.Join(b.tags, ", ")))
	b.finish(buildReady, nil)
}

// runBuild unpacks the uploaded files into a build context and builds.
func (s *buildRoutes) runBuild(ctx context.Context, b *build, steps template.Steps, copies []copySource) (template.Template, error) {
	dir, err := os.MkdirTemp("", "lizard-e2b-build-")
	if err != nil {
		return template.Template{}, err
	}
	defer os.RemoveAll(dir)
	for _, c := range copies {
		i, _ := strconv.Atoi(c.Dir)
		dest := filepath.Join(dir, c.Dir)
		if err := os.Mkdir(dest, 0o755); err != nil {
			return template.Template{}, err
		}
		if err := template.ExtractArchive(s.uploads.path(b.project, c.Hash), dest); err != nil {
			err = errdefs.WithCause(errdefs.ErrInvalid, fmt.Sprintf("step %d (COPY): the uploaded files of %s cannot be unpacked (not a whole tar archive)", i+1, c.Hash), err)
			return template.Template{}, &template.StepError{Step: i + 1, Err: err}
		}
	}
	return s.builder.BuildSteps(ctx, b.project, b.template, steps, dir, sandboxSize, &logWriter{b: b, prefix: "[" + b.template + "] "})
}

// buildInfo is E2B's TemplateBuildInfo.
type buildInfo struct {
	TemplateID string       `json:"templateID"`
	BuildID    string       `json:"buildID"`
	Status     string       `json:"status"`
	LogEntries []logEntry   `json:"logEntries"`
	Logs       []string     `json:"logs"`
	Reason     *buildReason `json:"reason,omitempty"`
}

// status serves GET /templates/{templateID}/builds/{buildID}/status: the
// build's status and its log from logsOffset (at most limit entries, 100
// at most).
func (s *buildRoutes) status(w http.ResponseWriter, r *http.Request, p store.Project) error {
	q := r.URL.Query()
	offset, limit := 0, maxLogsPerPoll
	if v := q.Get("logsOffset"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return invalid("logsOffset %q: want a number of log entries, 0 or more", v)
		}
		offset = n
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return invalid("limit %q: want a number of log entries, 0 or more", v)
		}
		limit = min(n, maxLogsPerPoll)
	}
	b, err := s.get(p.ID, r.PathValue("templateID"), r.PathValue("buildID"))
	if err != nil {
		return err
	}
	b.mu.Lock()
	info := buildInfo{TemplateID: b.template, BuildID: b.id, Status: b.status, LogEntries: []logEntry{}, Logs: []string{}, Reason: b.reason}
	if offset < len(b.logs) {
		info.LogEntries = append(info.LogEntries, b.logs[offset:min(len(b.logs), offset+limit)]...)
	}
	b.mu.Unlock()
	api.WriteJSON(w, http.StatusOK, info)
	return nil
}

// newUUID is a random (version 4) UUID: E2B's build ids are.
func newUUID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
