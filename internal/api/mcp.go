package api

import "net/http"

// keyed serves h (the MCP server's Streamable HTTP, internal/mcp, at /mcp)
// to requests that carry a valid API key, in X-API-Key or Authorization:
// Bearer, as MCP clients send it; the dashboard's cookie does not admit
// them. The key's rate limit applies as to any request; the MCP server
// then calls the API with the same key for every tool, so that it sees
// what the key sees here.
func (s *server) keyed(h http.Handler) http.Handler {
	auth := Auth{Keys: s.keys, Limiter: s.limiter}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := auth.Project(w, r); err != nil {
			writeError(w, r, s.log, err)
			return
		}
		h.ServeHTTP(w, r)
	})
}
