package mcp

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/lizard-build/lizard/internal/apiclient"
)

// HTTP transport settings.
const (
	// sessionIdle ends a Streamable HTTP session no request came for in
	// this long (a client that went away without saying).
	sessionIdle = time.Hour
	// maxRequestBody bounds one MCP request (write_file carries a file).
	maxRequestBody = 16 << 20
	// inProcessURL is the API's URL for the in-process client; no request
	// leaves the process, the host is only the requests' Host.
	inProcessURL = "http://lizard.internal"
	// statelessVersion is the first protocol revision whose Streamable
	// HTTP has no sessions (SEP-2575); the SDK serves it only from a
	// stateless handler, earlier revisions (the TypeScript SDK's
	// 2025-11-25, …) only from a stateful one.
	statelessVersion = "2026-07-28"
)

// HandlerConfig configures Handler.
type HandlerConfig struct {
	// Version is the server's version in the MCP handshake.
	Version string
	// Logger logs the SDK's warnings and errors (its info lines, a few
	// for every session and so for every request of a client without
	// sessions, are left out); nil logs nothing.
	Logger *slog.Logger
	// Serving ends every MCP request when it ends (the server is shutting
	// down): a session's stream of server messages stays open as long as
	// its client is there, and would hold a graceful shutdown up; nil:
	// requests end with their connections.
	Serving context.Context
}

// Handler serves MCP's Streamable HTTP transport, at /mcp on the API
// listener. It must be served behind the API's key check (api.Config.MCP):
// every request that reaches it carries a valid API key, in X-API-Key or
// Authorization: Bearer. A session is bound to the key that opened it (a
// request of the session with another key is a 403), and each tool runs
// with the key of the request that carries its call, through api, the
// API's own handler in this process (apiclient.InProcess): it sees what
// that key sees on the API, nothing more.
//
// Both kinds of client are served: those of the current revision
// (2026-07-28, no sessions: a request's Mcp-Protocol-Version says so),
// whose calls are cancelled by closing their request, and those of earlier
// revisions, with sessions, whose calls are cancelled by
// notifications/cancelled.
func Handler(api http.Handler, cfg HandlerConfig) http.Handler {
	if cfg.Logger != nil {
		cfg.Logger = slog.New(atLeast{Handler: cfg.Logger.Handler(), min: slog.LevelWarn})
	}
	hc := &http.Client{Transport: apiclient.InProcess(api)}
	srv := NewServer(Config{
		Client: func(extra *sdk.RequestExtra) (*apiclient.Client, error) {
			key := requestKey(extra)
			if key == "" {
				return nil, errors.New("the request carries no API key")
			}
			return apiclient.New(inProcessURL, key, hc)
		},
		Version: cfg.Version,
		Logger:  cfg.Logger,
	})
	server := func(*http.Request) *sdk.Server { return srv }
	opts := sdk.StreamableHTTPOptions{
		Logger:              cfg.Logger,
		MaxRequestBodyBytes: maxRequestBody,
		// The SDK refuses requests to a loopback listener whose Host is
		// not loopback, against DNS rebinding from a browser. Every
		// request here needs an API key, which a page of another site
		// does not have; and the check would refuse a reverse proxy on the
		// same host that keeps the client's Host.
		DisableLocalhostProtection: true,
	}
	stateful := opts
	stateful.SessionTimeout = sessionIdle
	stateless := opts
	stateless.Stateless, stateless.PropagateRequestCancellation = true, true
	sessions := sdk.NewStreamableHTTPHandler(server, &stateful)
	sessionless := sdk.NewStreamableHTTPHandler(server, &stateless)
	mux := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Mcp-Protocol-Version") >= statelessVersion {
			sessionless.ServeHTTP(w, r)
			return
		}
		sessions.ServeHTTP(w, r)
	})
	bearer := auth.RequireBearerToken(keyInfo, nil)(mux)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		if cfg.Serving != nil {
			var cancel context.CancelFunc
			ctx, cancel = context.WithCancel(ctx)
			defer cancel()
			defer context.AfterFunc(cfg.Serving, cancel)()
		}
		r = r.Clone(ctx)
		// The key the API authenticated, as the SDK's bearer middleware
		// reads it: X-API-Key first, as the API takes it.
		if k := r.Header.Get("X-API-Key"); k != "" {
			r.Header.Set("Authorization", "Bearer "+k)
		}
		bearer.ServeHTTP(w, r)
	})
}

// atLeast passes on the records of level min and above.
type atLeast struct {
	slog.Handler
	min slog.Level
}

func (h atLeast) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.Handler.Enabled(ctx, l)
}

func (h atLeast) WithAttrs(attrs []slog.Attr) slog.Handler {
	return atLeast{Handler: h.Handler.WithAttrs(attrs), min: h.min}
}

func (h atLeast) WithGroup(name string) slog.Handler {
	return atLeast{Handler: h.Handler.WithGroup(name), min: h.min}
}

// keyInfo is the SDK's token info of an API key the API has checked: its
// digest names the user a session is bound to, and the key itself is what
// the session's tools call the API with.
func keyInfo(_ context.Context, key string, _ *http.Request) (*auth.TokenInfo, error) {
	sum := sha256.Sum256([]byte(key))
	return &auth.TokenInfo{
		UserID: hex.EncodeToString(sum[:16]),
		// The API checks the key on every call; this is only the SDK's
		// bound on the request.
		Expiration: time.Now().Add(24 * time.Hour),
		Extra:      map[string]any{"key": key},
	}, nil
}

// requestKey is the API key of an MCP request over HTTP.
func requestKey(extra *sdk.RequestExtra) string {
	if extra == nil || extra.TokenInfo == nil {
		return ""
	}
	k, _ := extra.TokenInfo.Extra["key"].(string)
	return k
}

// ServeStdio serves MCP over stdin and stdout, for one client, until the
// client closes them or ctx ends; every tool calls the API through c.
func ServeStdio(ctx context.Context, c *apiclient.Client, version string, log *slog.Logger) error {
	srv := NewServer(Config{
		Client:  func(*sdk.RequestExtra) (*apiclient.Client, error) { return c, nil },
		Version: version,
		Logger:  log,
	})
	err := srv.Run(ctx, &sdk.StdioTransport{})
	if ctx.Err() != nil {
		return nil
	}
	return err
}
