// Package api is the HTTP edge of lizard: it speaks the Lizard Sandboxes API
// that the official SDKs use, authenticates API keys, decodes and validates
// requests, calls the sandbox service and maps errors to statuses in one
// place (errors.go). Only cmd/lizard wires it.
package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/lizard-build/lizard/internal/apikey"
	"github.com/lizard-build/lizard/internal/disk"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/identity"
	"github.com/lizard-build/lizard/internal/metrics"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/tmplqueue"
)

// Keys authenticates API keys.
type Keys interface {
	// Lookup returns the key a secret is. An unknown or revoked key is
	// errdefs.ErrUnauthenticated.
	Lookup(secret string) (apikey.Key, error)
}

// Limiter limits the request rate of each API key.
type Limiter interface {
	// Allow takes one request of key's allowance; when none is left it
	// returns false and when the next one will be.
	Allow(key string) (retryAfter time.Duration, ok bool)
	// String names the limit.
	String() string
}

// Config wires the API.
type Config struct {
	Keys      Keys
	Limiter   Limiter // nil: no rate limit
	Sandboxes Sandboxes
	// Usage answers sandboxes' usage samples (internal/sandbox/usage).
	Usage Usages
	// Snapshots keeps snapshots and Copies starts sandboxes from them and
	// forks (internal/sandbox/snapshot).
	Snapshots Snapshots
	Copies    Copies
	// Ports publishes sandbox ports on the preview proxy and Desktops
	// drives desktops (internal/sandbox/preview, desktop).
	Ports    Ports
	Desktops Desktops
	// Schedules keeps sandboxes' schedules (internal/sandbox/schedule);
	// nil serves no schedule routes.
	Schedules Schedules
	// Networks reads and replaces sandboxes' network configurations
	// (internal/sandbox/netconf); nil: `network` on a create is refused
	// and the network routes answer 404.
	Networks  Networks
	Templates Templates
	// TemplatePools keeps templates' warm pools; nil: none.
	TemplatePools TemplatePools
	// TemplateBuilds says which built-in templates the server builds in
	// the background (internal/tmplqueue), with their progress; nil: none.
	TemplateBuilds func(name string) (tmplqueue.Status, bool)
	Previews       PreviewURLs
	Volumes        Volumes
	Builder        TemplateBuilder
	// MaxBuildContext caps the body of POST /api/templates (the Dockerfile
	// and the build context's files); 0 means DefaultMaxBuildContext.
	MaxBuildContext int64
	Logger          *slog.Logger
	// Disk refuses file uploads when the data directory's disk is low
	// (the sandboxes' writable layers live there); nil: no check.
	Disk *disk.Guard
	// Metrics counts requests; nil counts nothing. With ServeMetrics,
	// GET /metrics serves them (unauthenticated, like /healthz).
	Metrics      *metrics.Metrics
	ServeMetrics bool
	// Tracing makes each request's server span (internal/tracing), a
	// child of the trace its traceparent names; nil makes none.
	Tracing trace.TracerProvider
	// Ready are what GET /readyz checks.
	Ready []ReadyCheck
	// KeyStore manages the project's API keys (/api/keys).
	KeyStore KeyStore
	// Events streams the project's lifecycle events (GET /api/events)
	// and Webhooks manages its webhooks (/api/webhooks); nil serves
	// none.
	Events   Events
	Webhooks Webhooks
	// Sessions and Dashboard: with both, GET / serves the dashboard
	// (internal/dashboard), /dashboard/login starts a session, and its
	// cookie authenticates API requests in place of an API key.
	Sessions  Sessions
	Dashboard http.Handler
	// E2B serves E2B's REST API (internal/e2b) beside this one, under
	// E2BPaths; nil serves none.
	E2B http.Handler
	// MCP serves the MCP server's Streamable HTTP (internal/mcp) at /mcp,
	// to requests with a valid API key; nil serves none.
	MCP http.Handler
	// Cluster routes requests to the node that holds what they name, and
	// places creates, in cluster mode; nil on a single server.
	Cluster Cluster
	// Secrets serves /api/projects/{pid}/secrets (internal/secrets).
	Secrets Secrets
	// Identity is the workload-identity issuer (internal/identity): the
	// iam field of a create, /api/sandboxes/{id}/iam/tokens, and, when it
	// is on, the issuer's discovery document and key set under its URL's
	// path. nil: off.
	Identity Identity
	// SandboxURL is where this node's sandboxes reach this API
	// (http://<gateway>:<port>, network.Manager.APIURL): a sandbox created
	// with a lizardToken gets it as LIZARD_API_URL, and a request that
	// arrives at that address is served the /api/ routes only (see
	// sandboxSide). "": sandboxes cannot reach the API, and a create with
	// a lizardToken is refused.
	SandboxURL string
}

// E2BPaths are the path patterns of E2B's REST API, including those lizard
// does not serve (which then answer E2B's 400 "not supported"); none is
// under /api/.
var E2BPaths = []string{"/sandboxes", "/sandboxes/", "/v2/", "/v3/", "/templates", "/templates/", "/snapshots", "/snapshots/",
	"/volumes", "/volumes/", "/volumecontent/", "/secrets", "/secrets/"}

// DefaultMaxBuildContext is the default cap of a template build's request.
const DefaultMaxBuildContext = 256 << 20

// Body size limits. A file write carries its content in JSON (base64 for
// bytes), so it may be larger than other requests.
const (
	maxBody      = 2 << 20
	maxWriteBody = 64 << 20
)

type server struct {
	keys      Keys
	limiter   Limiter
	sandboxes Sandboxes
	copies    Copies
	networks  Networks // a create's `network`
	usage     Usages
	log       *slog.Logger
	disk      *disk.Guard
	metrics   *metrics.Metrics
	tracing   trace.TracerProvider
	ready     []ReadyCheck
	sessions  Sessions
	cluster   Cluster
	ids       Identity
	// sandboxURL: see Config.SandboxURL.
	sandboxURL string
}

// Handler returns the API's http.Handler.
func Handler(cfg Config) http.Handler {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Identity == nil {
		cfg.Identity = &identity.Issuer{} // off
	}
	s := &server{keys: cfg.Keys, limiter: cfg.Limiter, sandboxes: cfg.Sandboxes, copies: cfg.Copies, networks: cfg.Networks, usage: cfg.Usage, log: cfg.Logger, metrics: cfg.Metrics, tracing: cfg.Tracing, ready: cfg.Ready, disk: cfg.Disk,
		sessions: cfg.Sessions, cluster: cfg.Cluster, ids: cfg.Identity, sandboxURL: cfg.SandboxURL}
	maxBuild := cfg.MaxBuildContext
	if maxBuild <= 0 {
		maxBuild = DefaultMaxBuildContext
	}
	// Handler groups: each holds only what its routes call.
	usageR := usageRoutes{usage: cfg.Usage}
	portR := portRoutes{ports: cfg.Ports, urls: cfg.Previews}
	deskR := desktopRoutes{desktops: cfg.Desktops, urls: cfg.Previews}
	logR := logRoutes{logs: cfg.Sandboxes, log: cfg.Logger}
	snapR := snapshotRoutes{snapshots: cfg.Snapshots, cluster: cfg.Cluster}
	volR := volumeRoutes{volumes: cfg.Volumes, cluster: cfg.Cluster}
	tplR := templateRoutes{templates: cfg.Templates, builds: cfg.TemplateBuilds}
	poolR := templatePoolRoutes{pools: cfg.TemplatePools}
	buildR := buildRoutes{builder: cfg.Builder, maxBuild: maxBuild}
	keyR := keyRoutes{keyStore: cfg.KeyStore, keys: cfg.Keys, log: cfg.Logger}
	secR := SecretRoutes[secretInfo]{Secrets: cfg.Secrets, Shape: secretInfoOf, RefParam: "ref"}
	tokR := tokenRoutes{ids: cfg.Identity}
	issR := issuerRoutes{ids: cfg.Identity}
	schedR := scheduleRoutes{schedules: cfg.Schedules}
	eventR := eventRoutes{events: cfg.Events, log: cfg.Logger}
	hookR := webhookRoutes{webhooks: cfg.Webhooks}
	netR := networkRoutes{networks: cfg.Networks}
	mux := http.NewServeMux()
	route := func(pattern string, h func(http.ResponseWriter, *http.Request, store.Project) error) {
		mux.Handle(pattern, s.authed(h))
	}
	route("GET /api/projects", s.listProjects)
	route("GET /api/projects/{pid}", s.getProject)

	route("POST /api/sandboxes", s.createSandbox)
	route("GET /api/sandboxes", s.listSandboxes)
	route("GET /api/projects/{pid}/sandboxes", s.listProjectSandboxes)
	route("GET /api/sandboxes/{id}", s.getSandbox)
	route("GET /api/sandboxes/{id}/metrics", usageR.sandboxMetrics)
	route("DELETE /api/sandboxes/{id}", s.killSandbox)
	route("POST /api/sandboxes/{id}/timeout", s.setTimeout)
	route("POST /api/sandboxes/{id}/pause", s.pauseSandbox)
	route("POST /api/sandboxes/{id}/resume", s.resumeSandbox)
	route("POST /api/sandboxes/{id}/fork", s.forkSandbox)
	route("POST /api/sandboxes/{id}/expose/{port}", portR.expose)
	route("DELETE /api/sandboxes/{id}/expose/{port}", portR.unexpose)
	if cfg.Networks != nil {
		route("GET /api/sandboxes/{id}/network", netR.getNetwork)
		route("PUT /api/sandboxes/{id}/network", netR.setNetwork)
		route("GET /api/sandboxes/{id}/network/log", netR.networkLog)
	}

	route("POST /api/sandboxes/{id}/snapshot", snapR.takeSnapshot)
	route("GET /api/projects/{pid}/snapshots", snapR.listProjectSnapshots)
	route("GET /api/sandbox-snapshots", snapR.listSnapshots)
	route("GET /api/sandbox-snapshots/{sid}", snapR.getSnapshot)
	route("PATCH /api/sandbox-snapshots/{sid}", snapR.updateSnapshot)
	route("DELETE /api/sandbox-snapshots/{sid}", snapR.deleteSnapshot)
	route("POST /api/sandbox-snapshots/{sid}/pause", snapR.pauseSnapshotPool)
	route("POST /api/sandbox-snapshots/{sid}/resume", snapR.resumeSnapshotPool)

	route("POST /api/projects/{pid}/volumes", volR.createVolume)
	route("GET /api/projects/{pid}/volumes", volR.listVolumes)
	route("GET /api/projects/{pid}/volumes/{vid}", volR.getVolume)
	route("PATCH /api/projects/{pid}/volumes/{vid}", volR.resizeVolume)
	route("DELETE /api/projects/{pid}/volumes/{vid}", volR.deleteVolume)

	route("POST /api/projects/{pid}/secrets", inProject(secR.Create))
	route("GET /api/projects/{pid}/secrets", inProject(secR.List))
	route("GET /api/projects/{pid}/secrets/{ref}", inProject(secR.Get))
	route("PATCH /api/projects/{pid}/secrets/{ref}", inProject(secR.Update))
	route("DELETE /api/projects/{pid}/secrets/{ref}", inProject(secR.Delete))

	route("GET /api/sandboxes/{id}/iam/tokens", tokR.list)
	route("POST /api/sandboxes/{id}/iam/tokens/{name}", tokR.mint)
	if cfg.Identity.Enabled() {
		mux.HandleFunc("GET "+cfg.Identity.Path()+identity.DiscoveryPath, issR.discovery)
		mux.HandleFunc("GET "+cfg.Identity.Path()+identity.JWKSPath, issR.keySet)
	}
	if cfg.Schedules != nil {
		route("POST /api/sandboxes/{id}/schedules", schedR.create)
		route("GET /api/sandboxes/{id}/schedules", schedR.listOfSandbox)
		route("GET /api/sandbox-schedules", schedR.list)
		route("GET /api/sandbox-schedules/{schid}", schedR.get)
		route("PATCH /api/sandbox-schedules/{schid}", schedR.update)
		route("DELETE /api/sandbox-schedules/{schid}", schedR.remove)
		route("POST /api/sandbox-schedules/{schid}/run", schedR.run)
		route("GET /api/sandbox-schedules/{schid}/runs", schedR.runs)
	}

	route("POST /api/sandboxes/{id}/desktop", deskR.start)
	route("GET /api/sandboxes/{id}/desktop", deskR.get)
	route("DELETE /api/sandboxes/{id}/desktop", deskR.stop)

	route("GET /api/sandboxes/{id}/logs", logR.sandboxLogs)
	route("POST /api/sandboxes/{id}/exec", s.exec)
	route("GET /api/sandboxes/{id}/processes", s.listProcesses)
	route("POST /api/sandboxes/{id}/processes/signal", s.signalProcess)
	mux.Handle("GET /api/sandboxes/{id}/terminal", browserKey(s.authed(s.terminal)))

	route("POST /api/sandboxes/{id}/files", s.writeFile)
	route("GET /api/sandboxes/{id}/files", s.readFile)
	route("DELETE /api/sandboxes/{id}/files", s.removeFile)
	route("GET /api/sandboxes/{id}/files/list", s.listFiles)
	route("GET /api/sandboxes/{id}/files/stat", s.statFile)
	route("POST /api/sandboxes/{id}/files/move", s.moveFile)
	route("POST /api/sandboxes/{id}/files/watch", s.watchFiles)
	route("GET /api/sandboxes/{id}/files/watch/events", s.watchEvents)
	route("DELETE /api/sandboxes/{id}/files/watch", s.unwatchFiles)

	route("GET /api/templates", tplR.listTemplates)
	route("POST /api/templates", buildR.buildTemplate)
	route("DELETE /api/templates/{name}", tplR.deleteTemplate)
	route("GET /api/template-pools", poolR.list)
	route("PUT /api/template-pools/{name}", poolR.set)

	if cfg.KeyStore != nil {
		route("GET /api/keys", keyR.listKeys)
		route("POST /api/keys", keyR.createKey)
		route("DELETE /api/keys/{kid}", keyR.revokeKey)
	}
	if cfg.Events != nil {
		route("GET /api/events", eventR.streamEvents)
	}
	if cfg.Webhooks != nil {
		route("POST /api/webhooks", hookR.createWebhook)
		route("GET /api/webhooks", hookR.listWebhooks)
		route("GET /api/webhooks/{wid}", hookR.getWebhook)
		route("DELETE /api/webhooks/{wid}", hookR.deleteWebhook)
		route("GET /api/webhooks/{wid}/deliveries", hookR.listDeliveries)
	}
	if cfg.Sessions != nil && cfg.Dashboard != nil {
		mux.HandleFunc("POST /dashboard/login", s.login)
		mux.HandleFunc("POST /dashboard/logout", s.logout)
		mux.HandleFunc("GET /dashboard/session", s.session)
		mux.Handle("GET /{$}", cfg.Dashboard)
		mux.Handle("GET /dashboard/static/", cfg.Dashboard)
	}
	if cfg.E2B != nil {
		for _, p := range E2BPaths {
			mux.Handle(p, cfg.E2B)
		}
	}
	if cfg.MCP != nil {
		mux.Handle("/mcp", s.keyed(cfg.MCP))
	}

	mux.HandleFunc("GET /healthz", s.healthz)
	mux.HandleFunc("GET /readyz", s.readyz)
	if cfg.ServeMetrics && cfg.Metrics != nil {
		mux.Handle("GET /metrics", cfg.Metrics.Handler())
	}

	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, r, s.log, errdefs.WithCode("route_not_found",
			fmt.Errorf("no route %s %s: %w", r.Method, r.URL.Path, errdefs.ErrNotFound)))
	})
	return s.logged(s.sandboxSide(mux))
}

// authed resolves the API key to its project, holds the key to its rate
// limit, and turns a handler's error into the error answer.
func (s *server) authed(h func(http.ResponseWriter, *http.Request, store.Project) error) http.Handler {
	auth := Auth{Keys: s.keys, Limiter: s.limiter}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k, _, err := s.authenticate(r)
		if err == nil {
			err = auth.allow(w, r, k)
		}
		forwarded := false
		if err == nil {
			forwarded, err = s.forward(w, r, k.Project.ID)
		}
		if err == nil && !forwarded {
			r = r.WithContext(context.WithValue(r.Context(), keyIDKey{}, k.ID))
			err = h(w, r, k.Project)
		}
		if err != nil {
			writeError(w, r, s.log, err)
		}
	})
}

// Auth authenticates API keys and holds each key to its rate limit. The
// Lizard API and the E2B control plane (internal/e2b) share it, so a key
// and its allowance are the same on both.
type Auth struct {
	Keys    Keys
	Limiter Limiter // nil: no rate limit
}

// Project returns the project of the request's API key (X-API-Key, or
// Authorization: Bearer), having taken one request of the key's allowance.
// Its errors are classed for StatusOf; when the allowance is used up it
// sets Retry-After on w.
func (a Auth) Project(w http.ResponseWriter, r *http.Request) (store.Project, error) {
	key := requestKey(r)
	if key == "" {
		return store.Project{}, errdefs.WithCode("missing_api_key", fmt.Errorf("missing API key: send it in the X-API-Key header: %w", errdefs.ErrUnauthenticated))
	}
	k, err := a.Keys.Lookup(key)
	if err != nil {
		if errors.Is(err, errdefs.ErrUnauthenticated) {
			err = errdefs.WithCode("invalid_api_key", fmt.Errorf("invalid API key: %w", errdefs.ErrUnauthenticated))
		}
		return store.Project{}, err
	}
	if err := a.allow(w, r, k); err != nil {
		return store.Project{}, err
	}
	return k.Project, nil
}

// allow notes the key's project for the request log and takes one request
// of the key's allowance; when it is used up it sets Retry-After on w.
func (a Auth) allow(w http.ResponseWriter, r *http.Request, k apikey.Key) error {
	noteProject(r.Context(), k.Project.ID)
	if a.Limiter != nil {
		if wait, ok := a.Limiter.Allow(k.ID); !ok {
			secs := max(1, int((wait+time.Second-1)/time.Second))
			w.Header().Set("Retry-After", strconv.Itoa(secs))
			return errdefs.WithCode("rate_limited",
				fmt.Errorf("rate limit of %s exceeded: retry after %d s: %w", a.Limiter, secs, errdefs.ErrLimit))
		}
	}
	return nil
}

// Decode reads a JSON body of at most limit bytes into v, as the Lizard
// API does (for internal/e2b).
func Decode(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	return decode(w, r, limit, v)
}

// ReadBody reads a request body of at most limit bytes, as the Lizard API
// does (for internal/e2b).
func ReadBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	return readBody(w, r, limit)
}

// Unmarshal decodes a JSON body as Decode does (for internal/e2b).
func Unmarshal(b []byte, v any) error { return unmarshal(b, v) }

// decode reads a JSON body of at most limit bytes into v. An empty body is
// accepted as {} (the SDKs send Content-Type: application/json on body-less
// POSTs). Wrong types and malformed JSON name the problem.
func decode(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	b, err := readBody(w, r, limit)
	if err != nil {
		return err
	}
	return unmarshal(b, v)
}

// readBody reads a request body of at most limit bytes.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	if r.ContentLength > limit {
		return nil, fmt.Errorf("request body is larger than %d bytes: %w", limit, errdefs.ErrTooLarge)
	}
	buf := bytes.NewBuffer(make([]byte, 0, max(r.ContentLength, 0)+bytes.MinRead))
	if _, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, limit)); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, fmt.Errorf("request body is larger than %d bytes: %w", limit, errdefs.ErrTooLarge)
		}
		return nil, fmt.Errorf("read body: %v: %w", err, errdefs.ErrInvalid)
	}
	return buf.Bytes(), nil
}

// unmarshal decodes a JSON body into v; an empty body leaves v as it is.
func unmarshal(b []byte, v any) error {
	if len(bytes.TrimSpace(b)) == 0 {
		return nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		var te *json.UnmarshalTypeError
		var se *json.SyntaxError
		switch {
		case errors.As(err, &te):
			return fmt.Errorf("field %q: expected %s, got %s: %w", te.Field, te.Type, te.Value, errdefs.ErrInvalid)
		case errors.As(err, &se):
			return fmt.Errorf("malformed JSON at byte %d: %v: %w", se.Offset, se, errdefs.ErrInvalid)
		default:
			return fmt.Errorf("malformed JSON: %v: %w", err, errdefs.ErrInvalid)
		}
	}
	return nil
}

func (s *server) listProjects(w http.ResponseWriter, r *http.Request, p store.Project) error {
	writeJSON(w, http.StatusOK, []store.Project{p})
	return nil
}

func (s *server) getProject(w http.ResponseWriter, r *http.Request, p store.Project) error {
	if err := sameProject(p, r.PathValue("pid")); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, p)
	return nil
}

// sameProject checks that a project reference in a request is the key's own
// project (by id or slug, any case); another project is not found.
func sameProject(p store.Project, ref string) error {
	if ref == "" || strings.EqualFold(ref, p.ID) || strings.EqualFold(ref, p.Slug) {
		return nil
	}
	return errdefs.WithCode("project_not_found", fmt.Errorf("project %q: %w", ref, errdefs.ErrNotFound))
}
