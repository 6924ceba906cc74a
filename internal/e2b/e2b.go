// Package e2b is E2B's REST control plane on lizard: the API that E2B's
// SDKs (npm `e2b`, `@e2b/code-interpreter`) call at E2B_API_URL, served on
// lizard's API listener beside the Lizard API (internal/api mounts it under
// api.E2BPaths). It authenticates with lizard keys through api.Auth, maps
// E2B templates to lizard's, turns E2B's seconds into the service's
// milliseconds, and answers errors in E2B's shape {code, message} with the
// statuses api.StatusOf gives. Sandboxes made here are marked E2B, which
// lets the preview proxy route E2B-addressed traffic to them
// (internal/proxy/e2b.go). E2B's snapshots are lizard's snapshots of E2B
// sandboxes (snapshots.go); its volumes are lizard's volumes (volumes.go),
// their files reached with a token of the volume's own (volumecontent.go).
// Only cmd/lizard wires it.
package e2b

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/api"
	"github.com/lizard-build/lizard/internal/disk"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/identity"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/sandbox/snapshot"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/template"
	"github.com/lizard-build/lizard/internal/volume"
)

// EnvdVersion is the envd version sandboxes report: the highest whose
// features envd in lizard-agent all has. The SDKs gate features on it, so
// it is never more than implemented: 0.5.7 octet-stream uploads, 0.6.2
// user-defined file metadata (X-Metadata-* headers, kept as user.e2b.
// extended attributes), 0.6.3 entries in watch events (include_entry),
// 0.6.4 watching network mounts only when allowed (allow_network_mounts).
// The versions between change nothing the SDKs can see.
const EnvdVersion = "0.6.4"

// templateAliases maps E2B's template names to lizard's. None at present:
// code-interpreter-v1 is a lizard template of that name (the interpreter
// rootfs serving port 49999, template/derived.go).
var templateAliases = map[string]string{}

// Templates is what the control plane needs of the template registry.
type Templates interface {
	// ListFor returns the built templates project sees: the built-in ones
	// and its own.
	ListFor(project string) ([]template.Template, error)
	// Delete removes project's template name (not a built-in one); its
	// versions stay while sandboxes or snapshots use them.
	Delete(ctx context.Context, project, name string) error
}

// Sandboxes is what the control plane calls of the sandbox service
// (*sandbox.Service): E2B's sandbox calls map one to one onto these;
// Update gives a sandbox made from a snapshot the metadata and envs of its
// create.
type Sandboxes interface {
	api.Lifecycle
	Update(ctx context.Context, projectID, id string, fn func(*sandbox.Record) error) (sandbox.Record, error)
}

// Snapshots is what E2B's snapshot calls use of lizard's snapshots (the
// sandbox service's today).
type Snapshots interface {
	// Take saves a running sandbox, which keeps running; the snapshot is
	// ready when it returns.
	Take(ctx context.Context, projectID, id, name string, poolSize int) (snapshot.Info, error)
	// List lists the project's snapshots on this node, oldest first.
	List(projectID string) []snapshot.Info
	// Delete removes a snapshot; sandboxes made from it go on.
	Delete(ctx context.Context, projectID, id string) error
}

// Volumes is what E2B's volume calls use of the volume manager
// (*volume.Manager); refs are a volume's id or name.
type Volumes interface {
	Create(ctx context.Context, projectID, name string, sizeGB int, region string, getOrCreate bool) (volume.Volume, error)
	Get(ctx context.Context, projectID, ref string) (volume.Volume, error)
	List(ctx context.Context, projectID string) ([]volume.Volume, error)
	Delete(ctx context.Context, projectID, ref string) error
	// Token returns the volume with its content token, made if missing.
	Token(ctx context.Context, projectID, ref string) (volume.Volume, error)
	// Lend runs fn over the files of a volume no sandbox holds, or
	// returns its holder (see volume.Manager.Lend).
	Lend(ctx context.Context, projectID, ref string, write bool, fn func(dir string) error) (holder string, err error)
}

// Agents reaches a running sandbox's agent (*sandbox.Service): the file
// API of a volume a sandbox holds goes through that sandbox.
type Agents interface {
	Agent(projectID, id string) (*agent.Client, sandbox.Record, error)
}

var (
	_ Sandboxes = (*sandbox.Service)(nil)
	_ Snapshots = (*snapshot.Manager)(nil)
	_ Agents    = (*sandbox.Service)(nil)
	_ Volumes   = (*volume.Manager)(nil)
)

// Config wires the control plane.
type Config struct {
	Auth      api.Auth
	Sandboxes Sandboxes
	// Copies forks sandboxes (*snapshot.Manager).
	Copies api.Copies
	// Usage answers the metrics routes and the lists' disk sizes
	// (*usage.Sampler).
	Usage api.Usages
	// Networks checks and replaces sandboxes' network configurations
	// (*netconf.Service).
	Networks  api.Networks
	Templates Templates
	Snapshots Snapshots
	Volumes   Volumes
	Agents    Agents
	// SandboxCLI is where the lizard CLI is inside sandboxes
	// (gvisor.CLIPath): the file API of a held volume runs its
	// volume-content command there.
	SandboxCLI string
	// Domain is what responses give as the sandboxes' domain: the SDK
	// reaches port P of sandbox S at P-S.<Domain> (the preview proxy's
	// domain, with its port unless it is the scheme's default).
	Domain string
	Logger *slog.Logger
	// Cluster routes per-sandbox requests to the sandbox's node, places
	// creates and lists every node's sandboxes in cluster mode; nil on a
	// single server.
	Cluster api.Cluster
	// Secrets serves /secrets (internal/secrets).
	Secrets api.Secrets
	// Identity registers the workload tokens of a create's iam
	// (internal/identity); nil: off.
	Identity api.Identity

	// Template builds (build.go): Builder builds (nil: the build calls are
	// refused), FilesDir keeps the files of COPY steps, at most MaxUpload
	// bytes an upload (0: api.DefaultMaxBuildContext), while Disk has
	// room; Tags keeps templates' tags (nil: none are kept); builds run
	// under BuildContext (nil: context.Background()).
	Builder      Builder
	FilesDir     string
	MaxUpload    int64
	Disk         *disk.Guard
	Tags         store.TemplateTags
	BuildContext context.Context
}

type server struct {
	auth      api.Auth
	sandboxes Sandboxes
	copies    api.Copies
	usage     api.Usages
	networks  api.Networks
	templates Templates
	snapshots snapshotFinder
	volumes   Volumes
	agents    Agents
	domain    string
	log       *slog.Logger
	cluster   api.Cluster
	ids       api.Identity
	refs      templateRefs
}

// maxBody bounds request bodies.
const maxBody = 1 << 20

// Handler returns the control plane's handler.
func Handler(cfg Config) http.Handler {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Identity == nil {
		cfg.Identity = &identity.Issuer{} // off
	}
	refs := templateRefs{templates: cfg.Templates, tags: cfg.Tags}
	snaps := snapshotFinder{snapshots: cfg.Snapshots, templates: cfg.Templates, cluster: cfg.Cluster}
	s := &server{auth: cfg.Auth, sandboxes: cfg.Sandboxes, copies: cfg.Copies, usage: cfg.Usage, networks: cfg.Networks, templates: cfg.Templates, snapshots: snaps, volumes: cfg.Volumes, agents: cfg.Agents,
		domain: cfg.Domain, log: cfg.Logger, cluster: cfg.Cluster, ids: cfg.Identity, refs: refs}
	// E2B's Secret: create, pages (limit, nextToken, X-Next-Token), get,
	// update (POST) and delete by id or name, values write-only.
	secR := api.SecretRoutes[secret]{Secrets: cfg.Secrets, Shape: secretOf, RefParam: "secretID"}
	snapR := snapshotRoutes{find: snaps, sandboxes: cfg.Sandboxes}
	volR := volumeRoutes{volumes: cfg.Volumes, cluster: cfg.Cluster}
	contentR := contentRoutes{volumes: cfg.Volumes, agents: cfg.Agents, cli: cfg.SandboxCLI, cluster: cfg.Cluster, log: cfg.Logger}
	mux := http.NewServeMux()
	route := func(pattern string, h func(http.ResponseWriter, *http.Request, store.Project) error) {
		mux.Handle(pattern, s.authed(h))
	}
	for _, prefix := range []string{"", "/v2"} {
		route("POST "+prefix+"/sandboxes", s.create)
		route("GET "+prefix+"/sandboxes", s.list)
		route("POST "+prefix+"/sandboxes/{id}/connect", s.connect)
	}
	route("GET /sandboxes/{id}", s.get)
	route("DELETE /sandboxes/{id}", s.kill)
	route("POST /sandboxes/{id}/timeout", s.setTimeout)
	route("POST /sandboxes/{id}/pause", s.pause)
	route("POST /sandboxes/{id}/resume", s.resume)
	route("POST /sandboxes/{id}/fork", s.fork)
	route("GET /sandboxes/{id}/metrics", s.metrics)
	route("PUT /sandboxes/{id}/network", s.updateNetwork)
	route("GET /templates", s.listTemplates)
	builds := newBuildRoutes(cfg, refs)
	// GET /templates/aliases/{alias} and GET /templates/{templateID}/tags
	// overlap (/templates/aliases/tags): one route tells them apart.
	route("GET /templates/{templateID}/{what}", func(w http.ResponseWriter, r *http.Request, p store.Project) error {
		id, what := r.PathValue("templateID"), r.PathValue("what")
		switch {
		case id == "aliases":
			r.SetPathValue("alias", what)
			return s.templateAlias(w, r, p)
		case what == "tags":
			return builds.listTags(w, r, p)
		}
		return notSupported(w, r, p)
	})
	route("POST /v3/templates", builds.request)
	route("GET /templates/{templateID}/files/{hash}", builds.files)
	// The upload URL: signed, not authenticated by key.
	mux.Handle("PUT /templates/{templateID}/files/{hash}", s.unauthed(builds.uploads.put))
	route("POST /v2/templates/{templateID}/builds/{buildID}", builds.start)
	route("GET /templates/{templateID}/builds/{buildID}/status", builds.status)
	route("POST /templates/tags", builds.assignTags)
	route("DELETE /templates/tags", builds.removeTags)
	route("POST /secrets", secR.Create)
	route("GET /secrets", secR.List)
	route("GET /secrets/{secretID}", secR.Get)
	route("POST /secrets/{secretID}", secR.Update)
	route("DELETE /secrets/{secretID}", secR.Delete)
	route("POST /sandboxes/{id}/snapshots", snapR.take)
	route("GET /snapshots", snapR.list)
	// The SDK deletes a snapshot as the template it is in E2B.
	route("DELETE /templates/{templateID}", snapR.deleteOr(builds.deleteTemplate))
	route("POST /volumes", volR.create)
	route("GET /volumes", volR.list)
	route("GET /volumes/{volumeID}", volR.get)
	route("DELETE /volumes/{volumeID}", volR.delete)
	contentR.register(mux)
	mux.Handle("/", s.authed(notSupported))
	return mux
}

// notSupported answers the calls of E2B's API that lizard does not serve
// (…). Not a 404: the SDKs turn a 404 into "sandbox not found" or
// "does not exist" (SandboxNotFoundError, Volume.exists() false), which
// would hide that the call cannot work here; a 400 surfaces as an error
// that carries this message.
func notSupported(w http.ResponseWriter, r *http.Request, _ store.Project) error {
	return errdefs.WithCode("not_supported", fmt.Errorf("%s %s is not supported by lizard: %w",
		r.Method, r.URL.Path, errdefs.ErrInvalid))
}

// authed authenticates as the Lizard API does and answers errors in E2B's
// shape.
func (s *server) authed(h func(http.ResponseWriter, *http.Request, store.Project) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, err := s.auth.Project(w, r)
		forwarded := false
		if err == nil && s.cluster != nil {
			if id := r.PathValue("id"); id != "" {
				forwarded, err = s.cluster.Forward(w, r, p.ID, api.Ref{Kind: api.RefSandbox, ID: id})
			}
		}
		if err == nil && !forwarded {
			err = h(w, r, p)
		}
		if err != nil {
			s.writeError(w, r, err)
		}
	})
}

// unauthed answers errors of a route that needs no key (a signed URL) in
// E2B's shape.
func (s *server) unauthed(h func(http.ResponseWriter, *http.Request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := h(w, r); err != nil {
			s.writeError(w, r, err)
		}
	})
}

// errorBody is E2B's error: the SDKs decide on code, the status.
type errorBody struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func (s *server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	status, code, msg := api.StatusOf(err)
	api.SetRetryAfter(w, err)
	if status >= 500 && code != "recovering" && code != "unresponsive" {
		s.log.Error("e2b request failed", "method", r.Method, "path", r.URL.Path, "status", status, "err", err)
	} else {
		s.log.Debug("e2b request refused", "method", r.Method, "path", r.URL.Path, "status", status, "err", err)
	}
	api.MarkMissing(w, err)
	api.WriteJSON(w, status, errorBody{Code: status, Message: msg})
}

func invalid(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, errdefs.ErrInvalid)...)
}
