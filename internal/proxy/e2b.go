package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// Headers of E2B-addressed traffic.
const (
	// E2BSandboxIDHeader and E2BSandboxPortHeader route a request sent to
	// the proxy's own address (E2B_SANDBOX_URL) instead of by its host.
	E2BSandboxIDHeader   = "E2b-Sandbox-Id"
	E2BSandboxPortHeader = "E2b-Sandbox-Port"
	// TrafficTokenHeader admits E2B-addressed requests to the ports of a
	// sandbox whose traffic is not public.
	TrafficTokenHeader = "E2b-Traffic-Access-Token"
	// EnvdHeader tells the sandbox's agent that a request is E2B envd
	// traffic (its envd routes, which check envd's own access token).
	EnvdHeader = "X-Lizard-Envd"
	// AgentTokenHeader is the agent's own token: never taken from outside.
	AgentTokenHeader = "X-Lizard-Agent-Token"
)

// E2BTargets is what the proxy asks the sandbox service about
// E2B-addressed requests: <port>-<sandbox>.<domain>, or the
// E2b-Sandbox-Id and E2b-Sandbox-Port headers.
type E2BTargets interface {
	// E2BTarget returns where a request to port of a sandbox made through
	// the E2B API goes. It has no side effects: a paused sandbox is
	// errdefs.ErrUnavailable, or, when it was made with autoResume, a
	// target with Asleep set (and no Addr) for the proxy to authenticate
	// the request to before it wakes it (E2BWaker). An unknown sandbox, or
	// one not made through the E2B API, is errdefs.ErrNotFound.
	E2BTarget(sandboxID string, port int) (E2BTarget, error)
}

// E2BWaker is implemented by E2BTargets whose sandboxes can be woken by
// traffic (E2B's lifecycle.autoResume).
type E2BWaker interface {
	// E2BWake resumes the paused sandbox of an Asleep target, for a
	// request the proxy has authenticated; it returns once the sandbox
	// runs (one resume for any number of requests).
	E2BWake(ctx context.Context, sandboxID string) error
}

// E2BSigned is implemented by E2BTargets that can tell which sandbox an
// E2B signed file URL is for when the URL names none: with E2B_SANDBOX_URL
// the SDK puts downloadUrl and uploadUrl on the proxy's own address, with
// no sandbox id in the host and no routing headers (a browser or curl
// sends none). The signature is made with the sandbox's envd access
// token, so it names one sandbox.
type E2BSigned interface {
	// E2BSignedFile returns the sandbox and envd port of the signed
	// request to /files with query q for operation ("read" or "write").
	E2BSignedFile(q url.Values, operation string) (sandboxID string, envdPort int, ok bool)
}

// E2BTarget is where an E2B-addressed request goes.
type E2BTarget struct {
	Addr string // host:port
	// Envd: the port is envd's (the agent's): the request is marked with
	// EnvdHeader and envd checks its own access token.
	Envd bool
	// TrafficToken, when not "", must come in TrafficTokenHeader (not for
	// envd, which has its own token).
	TrafficToken string
	// Host, when not "", is the Host header the request reaches the
	// sandbox with (E2B's maskRequestHost), instead of its own.
	Host string
	// TLS: the port serves HTTPS (E2B's httpsPorts), reached over TLS,
	// unverified.
	TLS bool
	// Asleep: the sandbox is paused and made with autoResume; a request
	// the proxy admits wakes it (E2BWaker). AccessToken is then envd's
	// access token of a secure sandbox, which a request to envd's port
	// must carry in X-Access-Token to wake it.
	Asleep      bool
	AccessToken string
}

type e2bKey struct{}
type envdKey struct{}

// e2bAddress reads an E2B address: the host in E2B's order
// <port>-<sandbox>.<domain>, else the routing headers. Lizard's order is
// <sandbox>-<port> and sandbox ids start with a letter, so a host is never
// both.
func e2bAddress(r *http.Request, domain string) (id string, port int, ok bool) {
	if id, port, err := ParseE2BHost(r.Host, domain); err == nil {
		return id, port, true
	}
	id = r.Header.Get(E2BSandboxIDHeader)
	port, err := strconv.Atoi(r.Header.Get(E2BSandboxPortHeader))
	if id == "" || err != nil || port < 1 || port > 65535 {
		return "", 0, false
	}
	return id, port, true
}

// signedFile finds the sandbox of an E2B signed file URL that came to the
// proxy's own address with nothing naming its sandbox (E2BSigned).
func signedFile(r *http.Request, targets E2BTargets) (id string, port int, ok bool) {
	s, isSigned := targets.(E2BSigned)
	if !isSigned || r.URL.Path != "/files" {
		return "", 0, false
	}
	q := r.URL.Query()
	if !strings.HasPrefix(q.Get("signature"), "v1_") {
		return "", 0, false
	}
	switch r.Method {
	case http.MethodGet:
		return s.E2BSignedFile(q, "read")
	case http.MethodPost:
		return s.E2BSignedFile(q, "write")
	}
	return "", 0, false
}

// ParseE2BHost splits "<port>-<sandbox>.<domain>[:listen port]" into the
// sandbox id and port.
func ParseE2BHost(host, domain string) (id string, port int, err error) {
	label, err := previewLabel(host, domain)
	if err != nil {
		return "", 0, err
	}
	p, id, ok := strings.Cut(label, "-")
	if !ok || id == "" || id[0] < 'a' || id[0] > 'z' || strings.Contains(id, "-") {
		return "", 0, hostError(host, "want <port>-<sandbox>."+domain)
	}
	if port, err = strconv.Atoi(p); err != nil || port < 1 || port > 65535 || p[0] == '0' {
		return "", 0, hostError(host, "bad port")
	}
	return id, port, nil
}

// serveE2B forwards an E2B-addressed request as E2B's proxy does: ports
// are public unless the sandbox's traffic needs its token; envd's port
// goes to the agent's envd routes; an unknown or paused sandbox and a
// closed port are a 502 with E2B's error body; a paused sandbox made with
// autoResume is resumed first, once the request is admitted (E2BWaker).
func (p *proxy) serveE2B(w http.ResponseWriter, r *http.Request, id string, port int) string {
	t, err := p.cfg.E2B.E2BTarget(id, port)
	if err == nil && t.Asleep {
		t, err = p.wakeE2B(r, id, port, t)
	}
	if err != nil {
		p.cfg.Logger.Debug("e2b traffic refused", "sandbox", id, "port", port, "err", err)
		msg := "The sandbox is not running."
		if errors.Is(err, errdefs.ErrNotFound) {
			// E2B's exact words: its SDK's tests match on them.
			msg = "The sandbox was not found"
		}
		e2bBadGateway(w, id, msg)
		return "unavailable"
	}
	if t.TrafficToken != "" && !t.Envd && !equal(r.Header.Get(TrafficTokenHeader), t.TrafficToken) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		json.NewEncoder(w).Encode(map[string]any{"code": http.StatusForbidden, "sandboxId": id,
			"message": "This sandbox's traffic is private: send its traffic access token in the " + TrafficTokenHeader + " header."})
		return "unauthorized"
	}
	outcome := "forwarded"
	ctx := context.WithValue(r.Context(), addrKey{}, target{sandbox: id, addr: t.Addr, run: p.runOf(id), tls: t.TLS})
	ctx = context.WithValue(ctx, outcomeKey{}, &outcome)
	ctx = context.WithValue(ctx, e2bKey{}, id)
	ctx = context.WithValue(ctx, envdKey{}, t.Envd)
	if t.Host != "" {
		r.Host = t.Host
	}
	// The routing headers are the proxy's, not the app's.
	r.Header.Del(E2BSandboxIDHeader)
	r.Header.Del(E2BSandboxPortHeader)
	// envd answers (and ends streams) once it has read a call's message,
	// while the SDK may still be sending the end of a streamed body. By
	// default the server would consume that rest before writing the
	// answer's headers, racing the upstream copy for it, which then cuts
	// the answer short ("terminated" in the SDK).
	_ = http.NewResponseController(w).EnableFullDuplex()
	p.rp.ServeHTTP(w, r.WithContext(ctx))
	return outcome
}

// wakeE2B resumes the sleeping sandbox of t for r when r would be
// admitted: a private port's traffic token, envd's access token of a
// secure sandbox. A request that would not is told the sandbox is not
// running, and it stays paused. It returns the target once awake.
func (p *proxy) wakeE2B(r *http.Request, id string, port int, t E2BTarget) (E2BTarget, error) {
	waker, ok := p.cfg.E2B.(E2BWaker)
	asleep := fmt.Errorf("sandbox %q is paused: %w", id, errdefs.ErrUnavailable)
	switch {
	case !ok:
		return E2BTarget{}, asleep
	case t.Envd && t.AccessToken != "" && !equal(r.Header.Get("X-Access-Token"), t.AccessToken):
		return E2BTarget{}, asleep
	case !t.Envd && t.TrafficToken != "" && !equal(r.Header.Get(TrafficTokenHeader), t.TrafficToken):
		return t, nil // refused with 403 as for a running sandbox
	}
	if err := waker.E2BWake(r.Context(), id); err != nil {
		return E2BTarget{}, err
	}
	return p.cfg.E2B.E2BTarget(id, port)
}

// e2bBadGateway is E2B's answer for a sandbox or port it cannot reach:
// the SDK reads a 502 as "not running".
func e2bBadGateway(w http.ResponseWriter, id, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusBadGateway)
	json.NewEncoder(w).Encode(map[string]any{"code": http.StatusBadGateway, "sandboxId": id, "message": msg})
}
