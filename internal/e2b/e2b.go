// Package e2b is E2B's REST control plane on lizard: the API that E2B's
// SDKs (npm `e2b`, `@e2b/code-interpreter`) call at E2B_API_URL, served on
// lizard's API listener beside the Lizard API (internal/api mounts it under
// api.E2BPaths). It authenticates with lizard keys through api.Auth, maps
// E2B templates to lizard's, turns E2B's seconds into the service's
// milliseconds, and answers errors in E2B's shape {code, message} with the
// statuses api.StatusOf gives. Sandboxes made here are marked E2B, which
// lets the preview proxy route E2B-addressed traffic to them
// (internal/proxy/e2b.go). Only cmd/lizard wires it.
package e2b

import (
	"fmt"
	"log/slog"
	"net/http"

	"github.com/lizard-build/lizard/internal/api"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/template"
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
}

// Sandboxes is what the control plane calls of the sandbox service
// (*sandbox.Service): E2B's sandbox calls map one to one onto these.
type Sandboxes interface {
	api.Lifecycle
}

var _ Sandboxes = (*sandbox.Service)(nil)

// Config wires the control plane.
type Config struct {
	Auth      api.Auth
	Sandboxes Sandboxes
	// Usage answers the metrics routes and the lists' disk sizes
	// (*usage.Sampler).
	Usage api.Usages
	// Networks checks and replaces sandboxes' network configurations
	// (*netconf.Service).
	Networks  api.Networks
	Templates Templates
	// Domain is what responses give as the sandboxes' domain: the SDK
	// reaches port P of sandbox S at P-S.<Domain> (the preview proxy's
	// domain, with its port unless it is the scheme's default).
	Domain string
	Logger *slog.Logger
	// Cluster routes per-sandbox requests to the sandbox's node, places
	// creates and lists every node's sandboxes in cluster mode; nil on a
	// single server.
	Cluster api.Cluster
}

type server struct {
	auth      api.Auth
	sandboxes Sandboxes
	usage     api.Usages
	networks  api.Networks
	templates Templates
	domain    string
	log       *slog.Logger
	cluster   api.Cluster
}

// maxBody bounds request bodies.
const maxBody = 1 << 20

// Handler returns the control plane's handler.
func Handler(cfg Config) http.Handler {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &server{auth: cfg.Auth, sandboxes: cfg.Sandboxes, usage: cfg.Usage, networks: cfg.Networks, templates: cfg.Templates, domain: cfg.Domain, log: cfg.Logger, cluster: cfg.Cluster}
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
	route("GET /templates/aliases/{alias}", s.templateAlias)
	mux.Handle("/", s.authed(notSupported))
	return mux
}

// notSupported answers the calls of E2B's API that lizard does not serve
// (volumes, secrets, snapshots, template builds and tags, …). Not a 404: the SDKs turn a 404 into "sandbox not found" or
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
