package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/envd/filesystem/filesystemconnect"
	"github.com/lizard-build/lizard/internal/envd/process/processconnect"
)

// envd is E2B's in-sandbox daemon protocol, served by the agent beside its
// own routes for requests marked agent.EnvdHeader (see package agent). It is
// an adapter: processes are the agent's interactive processes, files go
// through the same file operations, watches through the same inotify hub.
type envd struct {
	// tokenFile: see Config.EnvdTokenFile; set once, before serving.
	tokenFile string
	// fallback is the default user when the node names none, if the
	// sandbox has it: envdUser (tests choose another); set once.
	fallback string
	accts    accounts // the server's; set once

	mu        sync.RWMutex
	secure    bool
	tokenSum  [sha256.Size]byte
	token     string // kept for signed URLs, which hash it
	user      string // the node's default user (a template's USER); "" for none
	workdir   string
	env       map[string]string
	handler   http.Handler
	keepalive time.Duration // the longest gap between stream events
}

// defaultKeepalive is the keepalive interval when the client names none
// (E2B's SDKs ask for 50 s in Keepalive-Ping-Interval).
const defaultKeepalive = 50 * time.Second

// keepaliveHeader is where E2B's SDKs ask for keepalives, in seconds.
const keepaliveHeader = "Keepalive-Ping-Interval"

// envdUser is who E2B's envd acts as by default: every E2B template, and
// every built-in one of lizard's, has this account (uid 1000, home
// /home/user).
const envdUser = "user"

func (s *Server) newEnvd() *envd {
	e := &envd{keepalive: defaultKeepalive, fallback: envdUser, accts: s.accts}
	mux := http.NewServeMux()
	mux.Handle(processconnect.NewProcessHandler(&envdProcess{s: s, e: e}))
	mux.Handle(filesystemconnect.NewFilesystemHandler(&envdFS{s: s, e: e}))
	mux.Handle("GET /files", s.envdHandle(s.envdGetFile))
	mux.Handle("POST /files", s.envdHandle(s.envdPostFiles))
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})
	mux.Handle("GET /envs", s.envdHandle(func(w http.ResponseWriter, _ *http.Request) error {
		e.mu.RLock()
		env := maps.Clone(e.env)
		e.mu.RUnlock()
		if env == nil {
			env = map[string]string{}
		}
		writeJSON(w, http.StatusOK, env)
		return nil
	}))
	mux.Handle("/", s.envdHandle(func(w http.ResponseWriter, r *http.Request) error {
		return errNotFound("envd has no route %s %s", r.Method, r.URL.Path)
	}))
	e.handler = e.authenticate(mux)
	return e
}

// envdHandle is handle for envd's plain HTTP routes: errors are E2B's
// {code, message} with the numeric status as code.
func (s *Server) envdHandle(h handlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := h(w, r); err != nil {
			ae := toAPIError(err)
			if ae.status >= http.StatusInternalServerError {
				s.log.Error("envd request failed", "method", r.Method, "path", r.URL.Path, "err", err)
			}
			writeEnvdError(w, ae.status, ae.msg)
		}
	})
}

func writeEnvdError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{status, msg})
}

// authenticate admits every request when envd is not secure; otherwise
// those with the access token, /health, and /files with a valid signature
// (checked by the handler).
func (e *envd) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.mu.RLock()
		secure, sum := e.secure, e.tokenSum
		e.mu.RUnlock()
		if !secure || r.URL.Path == "/health" {
			next.ServeHTTP(w, r)
			return
		}
		if tok := r.Header.Get("X-Access-Token"); tok != "" {
			got := sha256.Sum256([]byte(tok))
			if subtle.ConstantTimeCompare(got[:], sum[:]) == 1 {
				next.ServeHTTP(w, r)
				return
			}
		} else if r.URL.Path == "/files" && r.URL.Query().Has("signature") {
			next.ServeHTTP(w, r)
			return
		}
		if strings.Count(r.URL.Path, "/") == 2 && strings.Contains(r.URL.Path, ".") {
			// A Connect procedure: its error shape.
			writeJSON(w, http.StatusUnauthorized, map[string]string{
				"code": connect.CodeUnauthenticated.String(), "message": "missing or wrong X-Access-Token",
			})
			return
		}
		writeEnvdError(w, http.StatusUnauthorized, "missing or wrong X-Access-Token")
	})
}

// setEnvd is POST /envd/token (an agent route: the node configures envd).
func (s *Server) setEnvd(w http.ResponseWriter, r *http.Request) error {
	var req agent.EnvdRequest
	if err := decodeJSON(w, r, 1<<20, &req); err != nil {
		return err
	}
	if req.Secure && len(req.Token) < 16 {
		return errInvalid("token must be at least 16 characters for a secure envd")
	}
	if req.Workdir != "" && !filepath.IsAbs(req.Workdir) {
		return errInvalid("workdir %q is not absolute", req.Workdir)
	}
	e := s.envd
	if e.tokenFile != "" {
		if err := writeEnvdToken(e.tokenFile, req.Secure, req.Token); err != nil {
			return err
		}
	}
	e.mu.Lock()
	e.secure, e.token, e.tokenSum = req.Secure, req.Token, sha256.Sum256([]byte(req.Token))
	if !req.KeepDefaults {
		e.user, e.workdir, e.env = req.User, req.Workdir, maps.Clone(req.Env)
	}
	e.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// writeEnvdToken keeps a secure envd's token in path (see
// agent.EnvdTokenFile), replaced atomically, or removes the file when envd
// is not secure.
func writeEnvdToken(path string, secure bool, token string) error {
	if !secure {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove %s: %w", path, err)
		}
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(token), 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// account is the account a request acts as: the Basic auth user E2B's
// SDKs send ("user:"), else name (a username parameter), else the default.
func (e *envd) account(h http.Header, name string) (*account, error) {
	if name == "" {
		if a := h.Get("Authorization"); a != "" {
			enc, ok := strings.CutPrefix(a, "Basic ")
			if !ok {
				return nil, errInvalid("Authorization must be Basic base64(user:)")
			}
			raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(enc))
			if err != nil {
				return nil, errInvalid("Authorization: %v", err)
			}
			name, _, _ = strings.Cut(string(raw), ":")
		}
	}
	if name == "" {
		return e.defaultAccount()
	}
	return e.accts.lookupAccount(name)
}

// defaultAccount is who requests naming no user act as, as in E2B's envd:
// the user the node configured (a template's USER, root included), else
// envdUser when the sandbox has that account, else root.
func (e *envd) defaultAccount() (*account, error) {
	e.mu.RLock()
	name := e.user
	e.mu.RUnlock()
	if name != "" {
		return e.accts.lookupAccount(name)
	}
	a, err := e.accts.findAccount(e.fallback)
	if err != nil || a != nil {
		return a, err
	}
	return e.accts.lookupAccount("root")
}

// resolve makes p absolute: relative paths are the user's home's.
func resolvePath(name, p string, acct *account) (string, error) {
	if p == "~" {
		p = acct.home
	} else if rest, ok := strings.CutPrefix(p, "~/"); ok {
		p = rest
	}
	if p != "" && !filepath.IsAbs(p) {
		p = filepath.Join(acct.home, p)
	}
	return cleanPath(name, p)
}

// keepaliveEvery is the keepalive interval a stream's client asks for in
// Keepalive-Ping-Interval (seconds), at most the default.
func (e *envd) keepaliveEvery(h http.Header) time.Duration {
	if n, err := strconv.Atoi(h.Get(keepaliveHeader)); err == nil && n > 0 {
		if d := time.Duration(n) * time.Second; d < e.keepalive {
			return d
		}
	}
	return e.keepalive
}

// connectError turns an agent error into a Connect error of the class the
// SDKs expect (NotFound for a missing file, AlreadyExists for MakeDir of an
// existing directory, …).
func connectError(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	ae := toAPIError(err)
	if ae.code == codeExists || errors.Is(err, syscall.EEXIST) {
		return connect.NewError(connect.CodeAlreadyExists, errors.New(ae.msg))
	}
	code := connect.CodeInternal
	switch ae.status {
	case http.StatusBadRequest:
		code = connect.CodeInvalidArgument
	case http.StatusUnauthorized:
		code = connect.CodeUnauthenticated
	case http.StatusForbidden:
		code = connect.CodePermissionDenied
	case http.StatusNotFound:
		code = connect.CodeNotFound
	case http.StatusConflict:
		code = connect.CodeFailedPrecondition
	case http.StatusRequestEntityTooLarge:
		code = connect.CodeResourceExhausted
	}
	return connect.NewError(code, errors.New(ae.msg))
}
