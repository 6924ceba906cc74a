package api

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/proxy"
	"github.com/lizard-build/lizard/internal/store"
)

// PreviewURLs says how preview URLs look: <sandbox>-<port>.<Domain>, with
// Scheme, and :Port when the proxy is not on the scheme's default port.
type PreviewURLs struct {
	Domain string
	Scheme string // "http" or "https"
	Port   string // "" for the scheme's default
}

func (p PreviewURLs) host(id string, port int) string {
	h := fmt.Sprintf("%s-%d.%s", id, port, p.Domain)
	if p.Port != "" {
		h += ":" + p.Port
	}
	return h
}

type exposeReply struct {
	Hostname    string `json:"hostname"`
	URL         string `json:"url"`
	Port        int    `json:"port"`
	AccessToken string `json:"accessToken"`
}

func pathPort(r *http.Request) (int, error) {
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil {
		return 0, fmt.Errorf("port %q: must be a number from 1 to 65535: %w", r.PathValue("port"), errdefs.ErrInvalid)
	}
	return port, nil
}

// portRoutes serve /api/sandboxes/{id}/expose/{port}.
type portRoutes struct {
	ports Ports
	urls  PreviewURLs
}

// expose publishes a port and answers what a client needs to reach it:
// the hostname, a browser URL carrying the token, and the token.
func (s portRoutes) expose(w http.ResponseWriter, r *http.Request, p store.Project) error {
	port, err := pathPort(r)
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	token, err := s.ports.Expose(r.Context(), p.ID, id, port)
	if err != nil {
		return err
	}
	host := s.urls.host(id, port)
	u := url.URL{Scheme: s.urls.Scheme, Host: host, Path: "/", RawQuery: url.Values{proxy.TokenQuery: {token}}.Encode()}
	writeJSON(w, http.StatusOK, exposeReply{Hostname: host, URL: u.String(), Port: port, AccessToken: token})
	return nil
}

func (s portRoutes) unexpose(w http.ResponseWriter, r *http.Request, p store.Project) error {
	port, err := pathPort(r)
	if err != nil {
		return err
	}
	if err := s.ports.Unexpose(r.Context(), p.ID, r.PathValue("id"), port); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
