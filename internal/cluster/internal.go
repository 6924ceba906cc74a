package cluster

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/lizard-build/lizard/internal/tracing"
)

// Headers of a request between nodes. The signature covers the time, the
// sending node, the kind, the method, the host and the request URI (path
// and query); the body is not signed (the hop is short-lived and the
// owner still authenticates the user by the client's own credentials).
const (
	headerNode = "X-Lizard-Cluster-Node"
	headerTime = "X-Lizard-Cluster-Time"
	headerKind = "X-Lizard-Cluster-Forward"
	headerSig  = "X-Lizard-Cluster-Signature"
)

// Kinds of internal requests: a client's request forwarded to the owner's
// API handler or preview proxy, or one of the /internal/v1 calls.
const (
	kindAPI      = "api"
	kindProxy    = "proxy"
	kindInternal = "internal"
)

// MaxSkew is how far a signed request's time may be from the receiver's
// clock, either way.
const MaxSkew = 60 * time.Second

// MinSecretBytes is the shortest cluster secret accepted.
const MinSecretBytes = 32

// Signer signs the requests a node sends to its peers and checks those it
// receives, with the cluster's shared secret (HMAC-SHA256).
type Signer struct {
	secret []byte
	node   string
	now    func() time.Time
}

// NewSigner returns the signer of node with the cluster secret; a secret
// shorter than MinSecretBytes is refused.
func NewSigner(node string, secret []byte) (*Signer, error) {
	if len(secret) < MinSecretBytes {
		return nil, fmt.Errorf("cluster secret: %d bytes, want at least %d", len(secret), MinSecretBytes)
	}
	if node == "" {
		return nil, errors.New("cluster signer: empty node name")
	}
	return &Signer{secret: append([]byte(nil), secret...), node: node, now: time.Now}, nil
}

// sign sets the signature headers of an outgoing request of kind. The host
// is the request's Host (or its URL's), the URI its URL's RequestURI: what
// the receiver sees as r.Host and r.RequestURI.
func (s *Signer) sign(r *http.Request, kind string) {
	ts := strconv.FormatInt(s.now().Unix(), 10)
	host := r.Host
	if host == "" {
		host = r.URL.Host
	}
	r.Header.Set(headerNode, s.node)
	r.Header.Set(headerTime, ts)
	r.Header.Set(headerKind, kind)
	r.Header.Set(headerSig, hex.EncodeToString(s.mac(ts, s.node, kind, r.Method, host, r.URL.RequestURI())))
}

func (s *Signer) mac(ts, node, kind, method, host, uri string) []byte {
	m := hmac.New(sha256.New, s.secret)
	for _, f := range []string{ts, node, kind, method, host, uri} {
		// Lengths first, so that no two field lists make the same input.
		fmt.Fprintf(m, "%d:%s\n", len(f), f)
	}
	return m.Sum(nil)
}

// verify checks an incoming request's signature and returns the sending
// node and the kind. Every failure is the same to the caller.
func (s *Signer) verify(r *http.Request) (node, kind string, err error) {
	node, ts, kind, sig := r.Header.Get(headerNode), r.Header.Get(headerTime), r.Header.Get(headerKind), r.Header.Get(headerSig)
	if node == "" || ts == "" || kind == "" || sig == "" {
		return "", "", errors.New("unsigned request")
	}
	secs, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return "", "", errors.New("bad signature time")
	}
	if d := s.now().Sub(time.Unix(secs, 0)); d > MaxSkew || d < -MaxSkew {
		return "", "", fmt.Errorf("signature time %s is off by %s", time.Unix(secs, 0).UTC(), d.Round(time.Second))
	}
	got, err := hex.DecodeString(sig)
	if err != nil {
		return "", "", errors.New("bad signature encoding")
	}
	if !hmac.Equal(got, s.mac(ts, node, kind, r.Method, r.Host, r.RequestURI)) {
		return "", "", errors.New("bad signature")
	}
	return node, kind, nil
}

// forwardedKey marks the context of a request that came over the internal
// listener: it is served here, never forwarded again.
type forwardedKey struct{}

// Forwarded reports whether the request of ctx was forwarded by a peer.
func Forwarded(ctx context.Context) bool {
	_, ok := ctx.Value(forwardedKey{}).(string)
	return ok
}

// InternalConfig wires the internal listener's handler.
type InternalConfig struct {
	Signer *Signer
	// API and Proxy are this node's API handler and preview proxy: they
	// serve the requests peers forward.
	API, Proxy http.Handler
	// Local is what this node holds, for the peers' cluster-wide lists.
	Local Local
	// Resume resumes the orphaned sandbox id here: a peer moving its
	// sandboxes away (drain --move) chose this node for it.
	Resume func(ctx context.Context, id string) error
	// Pools adopts and drops peers' warm pools here (pools.go).
	Pools  PoolHost
	Logger *slog.Logger
	// Tracing makes the server spans of the /internal/v1 calls, children
	// of the calling node's (the API and the proxy make their own); nil
	// makes none.
	Tracing trace.TracerProvider
}

// msgUnauthorized is the one answer to every request that is not signed
// right, whatever the reason (the log has it).
const msgUnauthorized = "internal listener: request not signed with the cluster secret\n"

// InternalHandler returns the handler of --internal-listen. Every request
// must be signed by a peer (Signer); anything else is a 401 that reaches
// nothing. Signed requests of kind api or proxy go to the API handler or
// the preview proxy, marked Forwarded; those of kind internal are the
// /internal/v1 calls (list.go).
func InternalHandler(cfg InternalConfig) http.Handler {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	internal := http.NewServeMux()
	internal.HandleFunc("GET /internal/v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		serveLocalSandboxes(w, r, cfg.Local)
	})
	internal.HandleFunc("GET /internal/v1/snapshots", func(w http.ResponseWriter, r *http.Request) {
		serveLocalSnapshots(w, r, cfg.Local)
	})
	internal.HandleFunc("GET /internal/v1/volumes", func(w http.ResponseWriter, r *http.Request) {
		serveLocalVolumes(w, r, cfg.Local, cfg.Logger)
	})
	internal.HandleFunc("POST /internal/v1/resume/{id}", func(w http.ResponseWriter, r *http.Request) {
		serveResume(w, r, cfg.Resume, cfg.Logger)
	})
	internal.HandleFunc("POST /internal/v1/pools/{id}/{op}", func(w http.ResponseWriter, r *http.Request) {
		servePool(w, r, cfg.Pools, cfg.Logger)
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		node, kind, err := cfg.Signer.verify(r)
		if err != nil {
			cfg.Logger.Warn("internal request refused", "remote", r.RemoteAddr, "method", r.Method, "path", r.URL.Path, "err", err)
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(http.StatusUnauthorized)
			w.Write([]byte(msgUnauthorized))
			return
		}
		for _, h := range []string{headerNode, headerTime, headerKind, headerSig} {
			r.Header.Del(h)
		}
		r = r.WithContext(context.WithValue(r.Context(), forwardedKey{}, node))
		switch {
		case kind == kindAPI && cfg.API != nil:
			cfg.API.ServeHTTP(w, r)
		case kind == kindProxy && cfg.Proxy != nil:
			cfg.Proxy.ServeHTTP(w, r)
		case kind == kindInternal && strings.HasPrefix(r.URL.Path, "/internal/v1/"):
			r, span := tracing.StartServer(cfg.Tracing, r)
			sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
			internal.ServeHTTP(sw, r)
			tracing.EndServer(span, r.Method, r.Pattern, sw.status, tracing.Node.String(node))
		default:
			http.Error(w, fmt.Sprintf("internal listener: nothing serves %s %s of kind %q", r.Method, r.URL.Path, kind), http.StatusNotFound)
		}
	})
}

// statusWriter remembers the status of an /internal/v1 answer for its
// span.
type statusWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (w *statusWriter) WriteHeader(status int) {
	if !w.wrote {
		w.status, w.wrote = status, true
	}
	w.ResponseWriter.WriteHeader(status)
}
