// Package server is the in-sandbox side of the agent protocol (see package
// agent): the HTTP API that lizard-agent, PID 1 of every sandbox, serves to
// the node. It runs commands, keeps the table of running ones, reaps every
// process of the sandbox, does file operations as sandbox users, and
// watches files with inotify. Interactive processes (interactive.go) run on
// a pty or with a stdin pipe and fan their output out to any number of
// readers.
package server

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"sync"
	"time"

	"github.com/lizard-build/lizard/internal/agent"
)

// Config configures a Server.
type Config struct {
	// Addr is the TCP address Run listens on, e.g. ":49983".
	Addr string
	// Token is the per-sandbox secret every request must carry; it must not
	// be empty unless TokenSum is set.
	Token string
	// TokenSum, if not zero, is the SHA-256 of the token, in place of Token:
	// a copy of a server (Server.TokenSum) answers to the same token.
	TokenSum [sha256.Size]byte
	// Logger receives the agent's log; nil discards it.
	Logger *slog.Logger
	// EnvdTokenFile, if not "", is where a secure envd's access token is
	// kept for the sandbox's other servers (agent.EnvdTokenFile in a
	// sandbox; tests leave the host's /run alone).
	EnvdTokenFile string
	// EgressCA, if not "", is where the egress proxy's CA certificate is
	// mounted (agent.EgressCAFile in a sandbox): New adds it to the
	// system trust store and commands get the variables that point the
	// usual clients at it (installTrust). Absent, nothing is changed.
	EgressCA string
	// Home, if not "", makes the server stand in for a sandbox as an
	// ordinary process on the host (package runtime/fake): what asks for
	// root runs as the server's own user, with Home as its home and default
	// working directory and Home/.tmp as its TMPDIR (the host's /tmp is
	// not the sandbox's). Other users are the host's.
	Home string
}

// Server is the agent's HTTP API. It is an http.Handler.
type Server struct {
	// tokenMu guards tokenSum, which POST /token replaces.
	tokenMu  sync.RWMutex
	tokenSum [sha256.Size]byte
	log      *slog.Logger
	reaper   *reaper
	procs    *procTable
	ios      *ioTable
	watches  *watchHub
	bg       *bgLog
	envd     *envd
	handler  http.Handler
	accts    accounts
	// trustEnv are the variables of the egress CA every command starts
	// with (its own and the request's override them).
	trustEnv map[string]string
}

// shutdownGrace bounds how long Run waits for open requests (exec streams
// included) once its context is done.
const shutdownGrace = 5 * time.Second

// New returns a Server. It starts the process reaper of this process (once
// per process, shared by every Server).
func New(cfg Config) (*Server, error) {
	sum := cfg.TokenSum
	if sum == ([sha256.Size]byte{}) {
		if cfg.Token == "" {
			return nil, errors.New("agent token is empty")
		}
		sum = sha256.Sum256([]byte(cfg.Token))
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r, err := sharedReaper()
	if err != nil {
		return nil, fmt.Errorf("starting reaper: %w", err)
	}
	var accts accounts
	if cfg.Home != "" {
		if accts.host, err = hostAccount(cfg.Home); err != nil {
			return nil, err
		}
	}
	s := &Server{
		accts: accts,
		// Comparing hashes keeps the comparison constant-time even in the
		// token's length.
		tokenSum: sum,
		log:      log,
		reaper:   r,
		procs:    newProcTable(cfg.Home != ""),
		ios:      newIOTable(),
		watches:  newWatchHub(log),
		bg:       &bgLog{},
	}
	if cfg.EgressCA != "" {
		env, err := installTrust("/", cfg.EgressCA)
		if err != nil {
			// A sandbox whose bundle is read-only still gets the
			// variables of what was done.
			log.Warn("egress CA not trusted everywhere", "err", err)
		}
		s.trustEnv = env
	}
	s.envd = s.newEnvd()
	s.envd.tokenFile = cfg.EnvdTokenFile
	own := s.authenticate(s.routes())
	// E2B's envd beside the agent's own routes, for what the proxy marks.
	s.handler = s.recoverer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(agent.EnvdHeader) == "1" {
			s.envd.handler.ServeHTTP(w, r)
			return
		}
		own.ServeHTTP(w, r)
	}))
	return s, nil
}

// Run serves the API on cfg.Addr until ctx is done, then shuts down,
// waiting at most shutdownGrace for open requests.
func Run(ctx context.Context, cfg Config) error {
	s, err := New(cfg)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", cfg.Addr, err)
	}
	hs := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	s.log.Info("agent listening", "addr", ln.Addr().String(), "pid", os.Getpid())

	select {
	case err := <-errc:
		return fmt.Errorf("serving: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		// Exec streams of long commands do not end by themselves.
		_ = hs.Close()
	}
	return nil
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.handler.ServeHTTP(w, r)
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /health", s.handle(s.health))
	mux.Handle("GET /logs", s.handle(s.backgroundLogs))
	mux.Handle("POST /token", s.handle(s.setToken))
	mux.Handle("POST /envd/token", s.handle(s.setEnvd))
	mux.Handle("POST /exec", s.handle(s.exec))
	mux.Handle("GET /processes", s.handle(s.listProcesses))
	mux.Handle("POST /processes/signal", s.handle(s.signalProcess))
	mux.Handle("POST /processes", s.handle(s.startProcess))
	mux.Handle("GET /processes/{pid}/output", s.handle(s.attachOutput))
	mux.Handle("POST /processes/{pid}/stdin", s.handle(s.writeStdin))
	mux.Handle("DELETE /processes/{pid}/stdin", s.handle(s.closeStdin))
	mux.Handle("POST /processes/{pid}/resize", s.handle(s.resize))
	mux.Handle("GET /files", s.handle(s.readFile))
	mux.Handle("PUT /files", s.handle(s.writeFile))
	mux.Handle("DELETE /files", s.handle(s.removeFile))
	mux.Handle("GET /files/list", s.handle(s.listFiles))
	mux.Handle("GET /files/stat", s.handle(s.statFile))
	mux.Handle("POST /files/move", s.handle(s.moveFile))
	mux.Handle("POST /watch", s.handle(s.watch))
	mux.Handle("GET /watch/events", s.handle(s.watchEvents))
	mux.Handle("DELETE /watch", s.handle(s.unwatch))
	mux.Handle("GET /forward/{port}", s.handle(s.forward))
	// A catch-all keeps unknown routes (and wrong methods) answering JSON.
	mux.Handle("/", s.handle(func(w http.ResponseWriter, r *http.Request) error {
		return errNotFound("no route %s %s", r.Method, r.URL.Path)
	}))
	return mux
}

// handlerFunc is a handler that returns its error instead of writing it. It
// must return an error only before it has written anything.
type handlerFunc func(http.ResponseWriter, *http.Request) error

func (s *Server) handle(h handlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := h(w, r); err != nil {
			s.writeError(w, r, err)
		}
	})
}

func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	ae := toAPIError(err)
	if ae.status >= http.StatusInternalServerError {
		s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	writeJSON(w, ae.status, agent.Error{Code: ae.code, Message: ae.msg})
}

func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := sha256.Sum256([]byte(r.Header.Get(agent.TokenHeader)))
		s.tokenMu.RLock()
		ok := subtle.ConstantTimeCompare(got[:], s.tokenSum[:]) == 1
		s.tokenMu.RUnlock()
		if !ok {
			writeJSON(w, http.StatusUnauthorized, agent.Error{
				Code:    codeUnauthenticated,
				Message: "missing or wrong " + agent.TokenHeader,
			})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// recoverer turns a panic into a 500 JSON answer, or, once the answer has
// begun, into an aborted connection so the client sees a broken stream
// rather than a clean end.
func (s *Server) recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tw := &trackingWriter{ResponseWriter: w}
		defer func() {
			v := recover()
			if v == nil {
				return
			}
			if v == http.ErrAbortHandler || tw.wrote {
				panic(http.ErrAbortHandler)
			}
			s.log.Error("panic in handler", "method", r.Method, "path", r.URL.Path,
				"panic", v, "stack", string(debug.Stack()))
			writeJSON(w, http.StatusInternalServerError, agent.Error{
				Code:    codeInternal,
				Message: fmt.Sprintf("internal error: %v", v),
			})
		}()
		next.ServeHTTP(tw, r)
	})
}

// trackingWriter records whether the answer has begun. Unwrap lets
// http.ResponseController reach the real writer's Flush; ReadFrom keeps
// sendfile for file downloads.
type trackingWriter struct {
	http.ResponseWriter
	wrote bool
}

func (t *trackingWriter) WriteHeader(code int) {
	t.wrote = true
	t.ResponseWriter.WriteHeader(code)
}

func (t *trackingWriter) Write(b []byte) (int, error) {
	t.wrote = true
	return t.ResponseWriter.Write(b)
}

func (t *trackingWriter) ReadFrom(r io.Reader) (int64, error) {
	t.wrote = true
	return io.Copy(t.ResponseWriter, r)
}

func (t *trackingWriter) Unwrap() http.ResponseWriter { return t.ResponseWriter }

// Flush is for handlers that assert http.Flusher (connect-go's streams).
func (t *trackingWriter) Flush() {
	t.wrote = true
	_ = http.NewResponseController(t.ResponseWriter).Flush()
}

// setToken replaces the token. A sandbox restored from a snapshot wakes up
// with its source's token; the node gives each copy its own at once.
func (s *Server) setToken(w http.ResponseWriter, r *http.Request) error {
	var req agent.TokenRequest
	if err := decodeJSON(w, r, 4096, &req); err != nil {
		return err
	}
	if len(req.Token) < 16 {
		return errInvalid("token must be at least 16 characters")
	}
	sum := sha256.Sum256([]byte(req.Token))
	s.tokenMu.Lock()
	s.tokenSum = sum
	s.tokenMu.Unlock()
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// TokenSum is the SHA-256 of the token the server answers to now.
func (s *Server) TokenSum() [sha256.Size]byte {
	s.tokenMu.RLock()
	defer s.tokenMu.RUnlock()
	return s.tokenSum
}

func (s *Server) health(w http.ResponseWriter, _ *http.Request) error {
	writeJSON(w, http.StatusOK, agent.Health{OK: true, Pid: os.Getpid(), Version: agent.ProtocolVersion})
	return nil
}
