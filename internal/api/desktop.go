package api

import (
	"net/http"
	"net/url"

	"github.com/lizard-build/lizard/internal/proxy"
	"github.com/lizard-build/lizard/internal/sandbox/desktop"
	"github.com/lizard-build/lizard/internal/store"
)

// desktopReply is the API's DesktopInfo. Width and height are null when the
// desktop was never started, and the URLs empty.
type desktopReply struct {
	Running     bool   `json:"running"`
	Width       *int   `json:"width"`
	Height      *int   `json:"height"`
	URL         string `json:"url"`
	ViewOnlyURL string `json:"viewOnlyUrl"`
}

// desktopRoutes serve /api/sandboxes/{id}/desktop.
type desktopRoutes struct {
	desktops Desktops
	urls     PreviewURLs
}

// start starts the sandbox's desktop (a running one keeps its size)
// and answers its URLs.
func (s desktopRoutes) start(w http.ResponseWriter, r *http.Request, p store.Project) error {
	var req struct {
		Width  int `json:"width"`
		Height int `json:"height"`
	}
	if err := decode(w, r, maxBody, &req); err != nil {
		return err
	}
	size, err := desktop.ValidSize(req.Width, req.Height)
	if err != nil {
		return err
	}
	d, err := s.desktops.Start(r.Context(), p.ID, r.PathValue("id"), size)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, s.reply(r.PathValue("id"), d))
	return nil
}

func (s desktopRoutes) get(w http.ResponseWriter, r *http.Request, p store.Project) error {
	d, err := s.desktops.State(r.Context(), p.ID, r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, s.reply(r.PathValue("id"), d))
	return nil
}

func (s desktopRoutes) stop(w http.ResponseWriter, r *http.Request, p store.Project) error {
	if err := s.desktops.Stop(r.Context(), p.ID, r.PathValue("id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s desktopRoutes) reply(id string, d desktop.Desktop) desktopReply {
	out := desktopReply{Running: d.Running}
	if d.Size != nil {
		out.Width, out.Height = &d.Size.Width, &d.Size.Height
	}
	if d.Token != "" && d.ViewOnlyToken != "" {
		out.URL = s.noVNCURL(id, desktop.Port, d.Token, false)
		out.ViewOnlyURL = s.noVNCURL(id, desktop.ViewOnlyPort, d.ViewOnlyToken, true)
	}
	return out
}

// noVNCURL opens noVNC's page on a desktop port: it connects at once
// (autoconnect) to the websockify endpoint of the same host, scales the
// screen to the window, and reconnects after a drop. The token in the
// query becomes the host's cookie at the proxy, which the page's WebSocket
// then carries.
func (s desktopRoutes) noVNCURL(id string, port int, token string, viewOnly bool) string {
	q := url.Values{
		"autoconnect":    {"1"},
		"resize":         {"scale"},
		"reconnect":      {"1"},
		"path":           {"websockify"},
		proxy.TokenQuery: {token},
	}
	if viewOnly {
		// Only cosmetic: the server behind this port ignores input anyway.
		q.Set("view_only", "1")
	}
	u := url.URL{Scheme: s.urls.Scheme, Host: s.urls.host(id, port), Path: "/vnc.html", RawQuery: q.Encode()}
	return u.String()
}
