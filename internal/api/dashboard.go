package api

import (
	"context"
	"crypto/subtle"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/lizard-build/lizard/internal/apikey"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
)

// Sessions are the dashboard's sign-in sessions (internal/dashboard).
type Sessions interface {
	// Create starts a session for an API key: its id (the cookie) and
	// its CSRF token.
	Create(key string) (id, csrf string)
	// Session returns a live session's key and CSRF token; an unknown or
	// expired one is errdefs.ErrUnauthenticated.
	Session(id string) (key, csrf string, err error)
	// End ends a session; an unknown one is a no-op.
	End(id string)
	// TTL is a session's absolute lifetime.
	TTL() time.Duration
}

// Dashboard session cookie and CSRF header. The page reads its CSRF token
// from the sign-in answer or GET /dashboard/session and sends it on every
// request that is not a GET.
const (
	SessionCookie = "lizard_session"
	CSRFHeader    = "X-CSRF-Token"
)

type keyIDKey struct{}

// requestKeyID is the id of the API key a request authenticated with.
func requestKeyID(ctx context.Context) string {
	id, _ := ctx.Value(keyIDKey{}).(string)
	return id
}

// authenticate finds the API key of a request: X-API-Key, Authorization:
// Bearer, or a dashboard session cookie. A session's request must come from
// this origin (when the browser says where it comes from: always on
// WebSockets and cross-origin requests) and, unless it is a GET, carry the
// session's CSRF token. A session whose key was revoked ends. sid is the
// session's id when a cookie authenticated the request.
func (s *server) authenticate(r *http.Request) (k apikey.Key, sid string, err error) {
	secret := r.Header.Get("X-API-Key")
	if secret == "" {
		if a, ok := cutBearer(r.Header.Get("Authorization")); ok {
			secret = a
		}
	}
	if secret == "" && s.sessions != nil {
		if c, cerr := r.Cookie(SessionCookie); cerr == nil && c.Value != "" {
			if err := sameOrigin(r); err != nil {
				return apikey.Key{}, "", err
			}
			key, csrf, err := s.sessions.Session(c.Value)
			if err != nil {
				return apikey.Key{}, "", err
			}
			if r.Method != http.MethodGet && r.Method != http.MethodHead &&
				subtle.ConstantTimeCompare([]byte(r.Header.Get(CSRFHeader)), []byte(csrf)) != 1 {
				return apikey.Key{}, "", errdefs.WithCode("csrf_token_invalid",
					fmt.Errorf("missing or wrong %s header: reload the dashboard: %w", CSRFHeader, errdefs.ErrPermission))
			}
			secret, sid = key, c.Value
		}
	}
	if secret == "" {
		return apikey.Key{}, "", errdefs.WithCode("missing_api_key", fmt.Errorf("missing API key: send it in the X-API-Key header: %w", errdefs.ErrUnauthenticated))
	}
	k, err = s.keys.Lookup(secret)
	if err != nil {
		if sid != "" {
			s.sessions.End(sid)
			return apikey.Key{}, "", errdefs.WithCode("session_ended",
				fmt.Errorf("the API key of this dashboard session was revoked: sign in again: %w", errdefs.ErrUnauthenticated))
		}
		return apikey.Key{}, "", errdefs.WithCode("invalid_api_key", fmt.Errorf("invalid API key: %w", errdefs.ErrUnauthenticated))
	}
	return k, sid, nil
}

func cutBearer(h string) (string, bool) {
	const p = "Bearer "
	if len(h) > len(p) && h[:len(p)] == p {
		return h[len(p):], true
	}
	return "", false
}

// sameOrigin refuses a browser request whose Origin is another host than
// the one it was sent to. No Origin (same-origin GETs, non-browsers) passes.
func sameOrigin(r *http.Request) error {
	o := r.Header.Get("Origin")
	if o == "" {
		return nil
	}
	u, err := url.Parse(o)
	if err != nil || u.Host != r.Host {
		return errdefs.WithCode("origin_refused",
			fmt.Errorf("origin %q may not use this dashboard's session: %w", o, errdefs.ErrPermission))
	}
	return nil
}

// sessionInfo answers the sign-in and GET /dashboard/session.
type sessionInfo struct {
	Project   store.Project `json:"project"`
	KeyID     string        `json:"keyId"`
	CSRFToken string        `json:"csrfToken"`
	ExpiresAt string        `json:"expiresAt,omitempty"`
}

// login is POST /dashboard/login {apiKey}: a valid key starts a session,
// whose id the answer sets as an HttpOnly, SameSite=Strict cookie (Secure
// over TLS) lasting the session's lifetime.
func (s *server) login(w http.ResponseWriter, r *http.Request) {
	err := func() error {
		if err := sameOrigin(r); err != nil {
			return err
		}
		var req struct {
			APIKey string `json:"apiKey"`
		}
		if err := decode(w, r, maxBody, &req); err != nil {
			return err
		}
		if req.APIKey == "" {
			return fmt.Errorf("apiKey: required, the project's API key: %w", errdefs.ErrInvalid)
		}
		k, err := s.keys.Lookup(req.APIKey)
		if err != nil {
			return errdefs.WithCode("invalid_api_key", fmt.Errorf("invalid API key: %w", errdefs.ErrUnauthenticated))
		}
		noteProject(r.Context(), k.Project.ID)
		id, csrf := s.sessions.Create(req.APIKey)
		ttl := s.sessions.TTL()
		http.SetCookie(w, &http.Cookie{
			Name: SessionCookie, Value: id, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode,
			Secure: r.TLS != nil, MaxAge: int(ttl / time.Second),
		})
		writeJSON(w, http.StatusOK, sessionInfo{Project: k.Project, KeyID: k.ID, CSRFToken: csrf,
			ExpiresAt: time.Now().Add(ttl).UTC().Format(time.RFC3339)})
		return nil
	}()
	if err != nil {
		writeError(w, r, s.log, err)
	}
}

// session is GET /dashboard/session: the signed-in project and the CSRF
// token, for a page that is loaded again.
func (s *server) session(w http.ResponseWriter, r *http.Request) {
	k, sid, err := s.authenticate(r)
	if err == nil && sid == "" {
		err = errdefs.WithCode("session_expired", fmt.Errorf("no dashboard session: sign in: %w", errdefs.ErrUnauthenticated))
	}
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	noteProject(r.Context(), k.Project.ID)
	_, csrf, err := s.sessions.Session(sid)
	if err != nil {
		writeError(w, r, s.log, err)
		return
	}
	writeJSON(w, http.StatusOK, sessionInfo{Project: k.Project, KeyID: k.ID, CSRFToken: csrf})
}

// logout is POST /dashboard/logout: the session ends and the cookie goes.
// It needs no CSRF token (ending a session is what an attacker gains
// nothing by), but a browser's request must come from this origin.
func (s *server) logout(w http.ResponseWriter, r *http.Request) {
	if err := sameOrigin(r); err != nil {
		writeError(w, r, s.log, err)
		return
	}
	if c, err := r.Cookie(SessionCookie); err == nil {
		s.sessions.End(c.Value)
	}
	http.SetCookie(w, &http.Cookie{Name: SessionCookie, Value: "", Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode,
		Secure: r.TLS != nil, MaxAge: -1})
	w.WriteHeader(http.StatusNoContent)
}
