package e2b

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"time"

	"github.com/lizard-build/lizard/internal/api"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/identity"
	"github.com/lizard-build/lizard/internal/network"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/sandbox/snapshot"
	"github.com/lizard-build/lizard/internal/sandbox/usage"
	"github.com/lizard-build/lizard/internal/store"
)

// defaultTimeout is a new sandbox's lifetime when the request names none
// (e2b 2.51 sends none; 2.50 sends this): the SDKs' documented default.
const defaultTimeout = 300

// sandboxSize is the lizard size of E2B sandboxes: E2B's templates default
// to 2 vCPUs, and E2B's create names no size.
const sandboxSize = "small"

// maxTimeout is the largest timeout in seconds the service takes.
const maxTimeout = sandbox.MaxTimeoutMs / 1000

// newSandbox is E2B's NewSandbox. Fields the SDKs send that lizard does
// not act on (mcp, autoResume) are refused when set to something that
// would need them.
type newSandbox struct {
	TemplateID          string                  `json:"templateID"`
	Timeout             *int64                  `json:"timeout"`
	AutoPause           *bool                   `json:"autoPause"`
	AutoPauseMemory     *bool                   `json:"autoPauseMemory"`
	AutoResume          *struct{ Enabled bool } `json:"autoResume"`
	Secure              *bool                   `json:"secure"`
	AllowInternetAccess *bool                   `json:"allow_internet_access"`
	Network             *struct {
		network.Settings
		AllowPublicTraffic *bool  `json:"allowPublicTraffic"`
		MaskRequestHost    string `json:"maskRequestHost"`
	} `json:"network"`
	Metadata     map[string]string `json:"metadata"`
	EnvVars      map[string]string `json:"envVars"`
	VolumeMounts []volumeMount     `json:"volumeMounts"`
	Mcp          any               `json:"mcp"`
	// IAM registers the sandbox's workload tokens (internal/identity),
	// which network transforms may name as ${e2b.identity.tokens.NAME}.
	IAM *identity.IAM `json:"iam"`
}

// sandboxInfo is E2B's Sandbox: what create, connect and fork answer.
type sandboxInfo struct {
	TemplateID         string  `json:"templateID"`
	SandboxID          string  `json:"sandboxID"`
	Alias              string  `json:"alias,omitempty"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken,omitempty"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

func (s *server) infoOf(r sandbox.Record) sandboxInfo {
	info := sandboxInfo{
		TemplateID: r.Template, SandboxID: r.ID, Alias: aliasOf(r.Template), ClientID: "lizard",
		EnvdVersion: EnvdVersion, EnvdAccessToken: r.EnvdToken,
	}
	if r.TrafficToken != "" {
		info.TrafficAccessToken = &r.TrafficToken
	}
	if s.domain != "" {
		info.Domain = &s.domain
	}
	return info
}

// aliasOf is the E2B name of a lizard template, when it has one.
func aliasOf(tpl string) string {
	for e2b, lz := range templateAliases {
		if lz == tpl {
			return e2b
		}
	}
	return ""
}

// timeoutMs turns E2B's seconds (nil: def) into the service's
// milliseconds; E2B refuses 0 and less.
func timeoutMs(field string, secs *int64, def int64) (int64, error) {
	t := def
	if secs != nil {
		t = *secs
	}
	if t < 1 || t > maxTimeout {
		return 0, invalid("%s %d: must be 1 to %d seconds", field, t, maxTimeout)
	}
	return t * 1000, nil
}

// timeoutBody is the body of the calls that take only a timeout.
type timeoutBody struct {
	Timeout *int64 `json:"timeout"`
}

// optionalTimeout decodes a timeoutBody: the timeout in milliseconds, 0
// when the body names none.
func optionalTimeout(w http.ResponseWriter, r *http.Request) (int64, error) {
	var req timeoutBody
	if err := api.Decode(w, r, maxBody, &req); err != nil {
		return 0, err
	}
	if req.Timeout == nil {
		return 0, nil
	}
	return timeoutMs("timeout", req.Timeout, 0)
}

func (s *server) create(w http.ResponseWriter, r *http.Request, p store.Project) error {
	body, err := api.ReadBody(w, r, maxBody)
	if err != nil {
		return err
	}
	var req newSandbox
	if err := api.Unmarshal(body, &req); err != nil {
		return err
	}
	tpl := req.TemplateID
	if tpl == "" {
		// As E2B's API: the SDKs always send one (theirs default to base).
		return invalid("templateID: required (e.g. base)")
	}
	timeout, err := timeoutMs("timeout", req.Timeout, defaultTimeout)
	if err != nil {
		return err
	}
	if req.Mcp != nil {
		return invalid("mcp: MCP gateways are not supported by lizard")
	}
	autoPause := req.AutoPause != nil && *req.AutoPause
	autoResume := req.AutoResume != nil && req.AutoResume.Enabled
	if autoResume && !autoPause {
		// As E2B: what resumes by traffic must be paused at its timeout.
		return invalid("autoResume: needs autoPause (lifecycle.onTimeout 'pause'): a sandbox killed at its timeout has nothing to resume")
	}
	autoPauseFiles := req.AutoPauseMemory != nil && !*req.AutoPauseMemory
	if autoPauseFiles && autoResume {
		// As E2B: traffic would find a sandbox booted afresh.
		return invalid("autoPauseMemory: false cannot be combined with autoResume: a sandbox paused without its memory is resumed only by connect")
	}
	if err := sandbox.CheckMetadata("metadata", req.Metadata); err != nil {
		return err
	}
	if err := sandbox.CheckEnvs("envVars", req.EnvVars); err != nil {
		return err
	}
	// Sandbox.create(snapshotId) sends the snapshot as the template: what
	// no template answers to is looked up among the snapshots (of every
	// node, in a cluster).
	if isTpl, err := s.snapshots.isTemplate(p.ID, tpl); err != nil {
		return err
	} else if !isTpl {
		if sn, ok, err := s.snapshots.find(r.Context(), p.ID, tpl); err != nil {
			return err
		} else if ok {
			return s.restore(w, r, p, req, sn, timeout, body)
		}
	}
	if lz, ok := templateAliases[tpl]; ok {
		tpl = lz
	}
	if tpl, err = s.refs.sandboxTemplate(r.Context(), p.ID, tpl); err != nil {
		return err
	}
	vol, err := mountedVolume(req.VolumeMounts)
	if err != nil {
		return err
	}
	var settings network.Settings
	private, mask := false, ""
	if n := req.Network; n != nil {
		settings = n.Settings
		private = n.AllowPublicTraffic != nil && !*n.AllowPublicTraffic
		mask = n.MaskRequestHost
		if err := sandbox.CheckMaskHost("network.maskRequestHost", mask); err != nil {
			return err
		}
	}
	egress, err := network.ParseSettings("network", settings, req.AllowInternetAccess)
	if err != nil {
		return err
	}
	tokens, err := s.ids.Check("iam", req.IAM)
	if err != nil {
		return err
	}
	if err := s.checkNetwork(r.Context(), p.ID, egress, api.TokenNames(tokens)); err != nil {
		return err
	}
	create := func() error {
		rec, err := s.sandboxes.Create(r.Context(), sandbox.CreateRequest{
			ProjectID: p.ID, Template: tpl, Size: sandboxSize, TimeoutMs: timeout, Metadata: req.Metadata, Envs: req.EnvVars,
			Egress: egress, E2B: true, Secure: secure(req.Secure), PrivateTraffic: private,
			AutoPause: autoPause, AutoResume: autoResume, AutoPauseFiles: autoPauseFiles && autoPause, MaskRequestHost: mask, Volume: vol,
		})
		if err != nil {
			return err
		}
		if err := api.RegisterTokens(r.Context(), s.ids, s.sandboxes.Kill, p.ID, rec.ID, tokens); err != nil {
			return err
		}
		api.WriteJSON(w, http.StatusCreated, s.infoOf(rec))
		return nil
	}
	if s.cluster == nil {
		return create()
	}
	return s.cluster.Create(w, r, p.ID, api.Placement{Template: tpl, Volume: vol}, body, create)
}

// secure says whether a new sandbox's envd requires its access token: as
// E2B's API, always unless the request says secure: false (e2b 2.51 sends
// no secure flag; 2.50 sends true unless its caller asks otherwise). An
// unsecured envd runs any command for whoever reaches the preview proxy
// with the sandbox's id.
func secure(flag *bool) bool { return flag == nil || *flag }

// e2bSandbox returns the project's sandbox made through the E2B API;
// others are not found here, as their ports are not E2B's to open.
func (s *server) e2bSandbox(p store.Project, id string) (sandbox.Record, error) {
	return e2bRecord(s.sandboxes, p, id)
}

// e2bRecord is the project's sandbox id of l when it was made through the
// E2B API (see e2bSandbox).
func e2bRecord(l api.Lifecycle, p store.Project, id string) (sandbox.Record, error) {
	rec, err := l.Get(p.ID, id)
	if err == nil && !rec.E2B {
		err = fmt.Errorf("sandbox %q was not made through the E2B API: %w", id, errdefs.ErrNotFound)
	}
	return rec, err
}

// state is E2B's state of a sandbox: running or paused.
func state(rec sandbox.Record) string {
	switch rec.Status {
	case sandbox.StatusPaused, sandbox.StatusPausing:
		return "paused"
	default:
		return "running"
	}
}

// connect answers 200 for a running sandbox and 201 for one it resumed. A
// timeout only ever extends the sandbox's life.
func (s *server) connect(w http.ResponseWriter, r *http.Request, p store.Project) error {
	var req struct {
		Timeout *int64 `json:"timeout"`
		Memory  *bool  `json:"memory"`
	}
	if err := api.Decode(w, r, maxBody, &req); err != nil {
		return err
	}
	reboot := req.Memory != nil && !*req.Memory
	var timeout int64
	if req.Timeout != nil {
		t, err := timeoutMs("timeout", req.Timeout, 0)
		if err != nil {
			return err
		}
		timeout = t
	}
	rec, err := s.e2bSandbox(p, r.PathValue("id"))
	if err != nil {
		return err
	}
	status := http.StatusOK
	if rec.Status != sandbox.StatusRunning {
		// A sandbox paused at its deadline has no time left: the timeout
		// asked for is set first, so it counts from the resume and the
		// old deadline cannot pause it again on the way.
		if timeout > 0 {
			if err := s.sandboxes.SetTimeout(r.Context(), p.ID, rec.ID, timeout); err != nil {
				return err
			}
		}
		if reboot && !rec.FilesOnly {
			// onResume 'reboot' of a sandbox paused with its memory: its
			// files are taken without it, and it boots over them.
			if rec, err = s.sandboxes.Resume(r.Context(), p.ID, rec.ID); err != nil {
				return err
			}
			if err := s.sandboxes.PauseFiles(r.Context(), p.ID, rec.ID); err != nil {
				return err
			}
		}
		if rec, err = s.sandboxes.Resume(r.Context(), p.ID, rec.ID); err != nil {
			return err
		}
		status = http.StatusCreated
	}
	if timeout > 0 && (rec.EndAt != nil && time.Until(*rec.EndAt) < time.Duration(timeout)*time.Millisecond) {
		if err := s.sandboxes.SetTimeout(r.Context(), p.ID, rec.ID, timeout); err != nil {
			return err
		}
	}
	api.WriteJSON(w, status, s.infoOf(rec))
	return nil
}

// resume is the deprecated POST /sandboxes/{id}/resume: 409 when running.
func (s *server) resume(w http.ResponseWriter, r *http.Request, p store.Project) error {
	timeout, err := optionalTimeout(w, r)
	if err != nil {
		return err
	}
	rec, err := s.e2bSandbox(p, r.PathValue("id"))
	if err != nil {
		return err
	}
	if rec.Status == sandbox.StatusRunning {
		return fmt.Errorf("sandbox %q is already running: %w", rec.ID, errdefs.ErrConflict)
	}
	if rec, err = s.sandboxes.Resume(r.Context(), p.ID, rec.ID); err != nil {
		return err
	}
	if timeout > 0 {
		if err := s.sandboxes.SetTimeout(r.Context(), p.ID, rec.ID, timeout); err != nil {
			return err
		}
	}
	api.WriteJSON(w, http.StatusCreated, s.infoOf(rec))
	return nil
}

// detail is E2B's SandboxDetail (GET /sandboxes/{id}) and, without the
// token and domain, ListedSandbox.
type detail struct {
	TemplateID          string            `json:"templateID"`
	Alias               string            `json:"alias,omitempty"`
	SandboxID           string            `json:"sandboxID"`
	ClientID            string            `json:"clientID"`
	StartedAt           string            `json:"startedAt"`
	EndAt               string            `json:"endAt"`
	CPUCount            int               `json:"cpuCount"`
	MemoryMB            int64             `json:"memoryMB"`
	DiskSizeMB          int64             `json:"diskSizeMB"`
	Metadata            map[string]string `json:"metadata"`
	State               string            `json:"state"`
	EnvdVersion         string            `json:"envdVersion"`
	VolumeMounts        []volumeMount     `json:"volumeMounts"`
	EnvdAccessToken     string            `json:"envdAccessToken,omitempty"`
	Domain              *string           `json:"domain,omitempty"`
	AllowInternetAccess *bool             `json:"allowInternetAccess,omitempty"`
	Network             *networkConfig    `json:"network,omitempty"`
	Lifecycle           *lifecycle        `json:"lifecycle,omitempty"`
}

// networkConfig is E2B's SandboxNetworkConfig as getInfo shows it:
// placeholders as written, the SOCKS5 proxy without its password.
type networkConfig struct {
	network.Settings
	AllowPublicTraffic bool   `json:"allowPublicTraffic"`
	MaskRequestHost    string `json:"maskRequestHost,omitempty"`
}

func networkOf(rec sandbox.Record) *networkConfig {
	return &networkConfig{Settings: rec.Egress.Settings(), AllowPublicTraffic: rec.TrafficToken == "", MaskRequestHost: rec.MaskHost}
}

type lifecycle struct {
	OnTimeout  string `json:"onTimeout"`
	AutoResume bool   `json:"autoResume"`
}

// latestUsage is the latest usage sample of a sandbox of this node; nil
// before the first.
func (s *server) latestUsage(id string) *usage.Sample {
	if u, ok := s.usage.LatestUsage(id); ok {
		return &u
	}
	return nil
}

// listed is rec as E2B lists it; its disk size is what the latest usage
// sample u saw of the sandbox's disk limit (0 before the first), its
// volume's name is in vols (by id).
func listed(rec sandbox.Record, u *usage.Sample, vols map[string]string) detail {
	var disk int64
	if u != nil {
		disk = u.DiskTotal >> 20
	}
	end := rec.StartedAt.Add(time.Duration(rec.TimeoutMs) * time.Millisecond)
	switch {
	case rec.EndAt != nil:
		end = *rec.EndAt
	case rec.RemainingMs > 0:
		end = time.Now().Add(time.Duration(rec.RemainingMs) * time.Millisecond)
	}
	md := rec.Metadata
	if md == nil {
		md = map[string]string{}
	}
	return detail{
		TemplateID: rec.Template, Alias: aliasOf(rec.Template), SandboxID: rec.ID, ClientID: "lizard",
		StartedAt: rec.StartedAt.UTC().Format(time.RFC3339Nano), EndAt: end.UTC().Format(time.RFC3339Nano),
		CPUCount: int(math.Ceil(rec.CPUs)), MemoryMB: rec.MemoryMB, DiskSizeMB: disk,
		Metadata: md, State: state(rec), EnvdVersion: EnvdVersion, VolumeMounts: mountsOf(rec, vols),
	}
}

func (s *server) get(w http.ResponseWriter, r *http.Request, p store.Project) error {
	rec, err := s.e2bSandbox(p, r.PathValue("id"))
	if err != nil {
		return err
	}
	vols, err := s.volumeNames(r.Context(), p.ID, []sandbox.Record{rec})
	if err != nil {
		return err
	}
	d := listed(rec, s.latestUsage(rec.ID), vols)
	d.EnvdAccessToken = rec.EnvdToken
	if s.domain != "" {
		d.Domain = &s.domain
	}
	internet := !rec.Egress.Restricted
	d.AllowInternetAccess = &internet
	d.Network = networkOf(rec)
	d.Lifecycle = &lifecycle{OnTimeout: "kill", AutoResume: rec.AutoResume}
	if rec.AutoPause {
		d.Lifecycle.OnTimeout = "pause"
	}
	api.WriteJSON(w, http.StatusOK, d)
	return nil
}

func (s *server) kill(w http.ResponseWriter, r *http.Request, p store.Project) error {
	rec, err := s.e2bSandbox(p, r.PathValue("id"))
	if err != nil {
		return err
	}
	if err := s.sandboxes.Kill(r.Context(), p.ID, rec.ID); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *server) setTimeout(w http.ResponseWriter, r *http.Request, p store.Project) error {
	t, err := optionalTimeout(w, r)
	if err != nil {
		return err
	}
	if t == 0 {
		return invalid("timeout: required, 1 to %d seconds", maxTimeout)
	}
	rec, err := s.e2bSandbox(p, r.PathValue("id"))
	if err != nil {
		return err
	}
	if err := s.sandboxes.SetTimeout(r.Context(), p.ID, rec.ID, t); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// pause answers 409 for a sandbox that is already paused: the SDK's pause()
// then returns false.
func (s *server) pause(w http.ResponseWriter, r *http.Request, p store.Project) error {
	var req struct {
		Memory *bool `json:"memory"`
	}
	if err := api.Decode(w, r, maxBody, &req); err != nil {
		return err
	}
	pause := s.sandboxes.Pause
	if req.Memory != nil && !*req.Memory {
		pause = s.sandboxes.PauseFiles // a filesystem-only snapshot
	}
	rec, err := s.e2bSandbox(p, r.PathValue("id"))
	if err != nil {
		return err
	}
	if rec.Status != sandbox.StatusRunning {
		return fmt.Errorf("sandbox %q is %s: %w", rec.ID, rec.Status, errdefs.ErrConflict)
	}
	if err := pause(r.Context(), p.ID, rec.ID); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// fork answers one result per copy: {sandbox} or {error: {code, message}}.
func (s *server) fork(w http.ResponseWriter, r *http.Request, p store.Project) error {
	var req struct {
		Timeout *int64 `json:"timeout"`
		Count   *int   `json:"count"`
	}
	if err := api.Decode(w, r, maxBody, &req); err != nil {
		return err
	}
	count := 1
	if req.Count != nil {
		count = *req.Count
	}
	// The body is judged before the sandbox is looked up, as E2B does: a
	// bad count is a 400 whatever the id.
	if err := snapshot.CheckForkCount(count); err != nil {
		return err
	}
	var timeout int64 // the source's
	if req.Timeout != nil {
		t, err := timeoutMs("timeout", req.Timeout, 0)
		if err != nil {
			return err
		}
		timeout = t
	}
	rec, err := s.e2bSandbox(p, r.PathValue("id"))
	if err != nil {
		return err
	}
	results, err := s.copies.Fork(r.Context(), p.ID, rec.ID, count, timeout)
	if err != nil {
		return err
	}
	type result struct {
		Sandbox *sandboxInfo `json:"sandbox,omitempty"`
		Error   *errorBody   `json:"error,omitempty"`
	}
	out := make([]result, len(results))
	for i, res := range results {
		if res.Err != nil {
			status, _, msg := api.StatusOf(res.Err)
			out[i].Error = &errorBody{Code: status, Message: msg}
			continue
		}
		info := s.infoOf(*res.Sandbox)
		out[i].Sandbox = &info
	}
	api.WriteJSON(w, http.StatusCreated, out)
	return nil
}

// updateNetwork is PUT /sandboxes/{id}/network (E2B's updateNetwork): the
// egress configuration replaced as a whole — what the body leaves out is
// cleared —, followed by new connections once it answers 204.
func (s *server) updateNetwork(w http.ResponseWriter, r *http.Request, p store.Project) error {
	var req struct {
		network.Settings
		AllowInternetAccess *bool `json:"allow_internet_access"`
	}
	if err := api.Decode(w, r, maxBody, &req); err != nil {
		return err
	}
	if len(req.HTTPSPorts) > 0 {
		return invalid("network.httpsPorts: set when the sandbox is created, not changed by a network update")
	}
	egress, err := network.ParseSettings("network", req.Settings, req.AllowInternetAccess)
	if err != nil {
		return err
	}
	if s.networks == nil {
		return errdefs.WithCode("feature_unavailable", invalid("PUT /sandboxes/{id}/network: this server cannot change a sandbox's network"))
	}
	rec, err := s.e2bSandbox(p, r.PathValue("id"))
	if err != nil {
		return err
	}
	if _, err := s.networks.SetNetwork(r.Context(), p.ID, rec.ID, egress); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// checkNetwork checks a create's placeholders (Config.Networks); a server
// without it takes none.
func (s *server) checkNetwork(ctx context.Context, projectID string, e network.Egress, tokens []string) error {
	if s.networks != nil {
		return s.networks.Check(ctx, projectID, e, tokens)
	}
	if len(e.Placeholders()) > 0 {
		return invalid("network.rules: placeholders are not resolved by this server")
	}
	return nil
}
