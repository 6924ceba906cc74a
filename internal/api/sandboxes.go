package api

import (
	"fmt"
	"net/http"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/identity"
	"github.com/lizard-build/lizard/internal/network"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/store"
)

// sandboxInfo is SandboxInfo as the SDKs read it.
type sandboxInfo struct {
	SandboxID  string            `json:"sandboxId"`
	ProjectID  string            `json:"projectId"`
	Template   string            `json:"template"`
	StartedAt  string            `json:"startedAt"`
	EndAt      *string           `json:"endAt"`
	Status     string            `json:"status"`
	Metadata   map[string]string `json:"metadata"`
	Runtime    string            `json:"runtime"`
	Size       string            `json:"size"`
	CPUs       float64           `json:"cpus"`
	MemoryMB   int64             `json:"memoryMb"`
	Region     *string           `json:"region"`
	TimeoutMs  int64             `json:"timeoutMs"`
	PauseError *string           `json:"pauseError"`
	// DurableAt is when a paused sandbox became durable in the object
	// store (a lizard addition; absent while only on the node's disk).
	DurableAt  *string `json:"durableAt,omitempty"`
	SnapshotID *string `json:"snapshotId,omitempty"`
	// InternetAccess is false when egress is restricted; AllowedHosts is
	// what a restricted sandbox may still reach.
	InternetAccess bool     `json:"internetAccess"`
	AllowedHosts   []string `json:"allowedHosts"`
	// Network is the whole network configuration (a lizard addition,
	// docs/API-EXTENSIONS.md).
	Network  networkSettings `json:"network"`
	VolumeID *string         `json:"volumeId"`
	// ExposedPorts are the ports published on the preview proxy (a lizard
	// addition; POST …/expose/{port} again answers a port's URL).
	ExposedPorts []int `json:"exposedPorts"`
	// Metrics is the latest usage sample (getInfo only; a lizard
	// addition).
	Metrics *usagePoint `json:"metrics,omitempty"`
	// Node holds the sandbox (cluster mode only).
	Node string `json:"node,omitempty"`
	// AutoResume: paused, it is resumed by the first request that needs
	// it (a lizard addition, docs/API-EXTENSIONS.md).
	AutoResume bool `json:"autoResume"`
	// PauseMemory, while it is paused (or pausing): false when the pause
	// kept its files only, so that a resume boots it (a lizard addition).
	PauseMemory *bool `json:"pauseMemory,omitempty"`
}

func infoOf(r sandbox.Record) sandboxInfo {
	info := sandboxInfo{
		SandboxID: r.ID, ProjectID: r.ProjectID, Template: r.Template,
		StartedAt: r.StartedAt.UTC().Format(time.RFC3339Nano), Status: r.Status,
		Metadata: r.Metadata, Runtime: "container", Size: r.Size, CPUs: r.CPUs, MemoryMB: r.MemoryMB,
		TimeoutMs: r.TimeoutMs, InternetAccess: !r.Egress.Restricted, AllowedHosts: r.Egress.Allowed,
		Network: settingsOf(r.Egress), AutoResume: r.AutoResume,
		PauseMemory: pauseMemory(r),
	}
	if info.AllowedHosts == nil {
		info.AllowedHosts = []string{}
	}
	info.ExposedPorts = append([]int{}, r.Ports...)
	if info.Metadata == nil {
		info.Metadata = map[string]string{}
	}
	if r.EndAt != nil {
		s := r.EndAt.UTC().Format(time.RFC3339Nano)
		info.EndAt = &s
	}
	if r.Region != "" {
		info.Region = &r.Region
	}
	if r.PauseError != "" {
		info.PauseError = &r.PauseError
	}
	if r.SnapshotID != "" {
		info.SnapshotID = &r.SnapshotID
	}
	if r.DurableAt != nil {
		s := r.DurableAt.UTC().Format(time.RFC3339Nano)
		info.DurableAt = &s
	}
	if r.VolumeID != "" {
		info.VolumeID = &r.VolumeID
	}
	return info
}

// createRequest is the body of POST /api/sandboxes. A region the client
// names is taken but not acted on: a sandbox runs on the node that takes
// the create, in that node's region (which SandboxInfo answers). The TS
// SDK names us-east-1 unless told otherwise, and refusing a region that
// differs would fail every create of a client that names one.
type createRequest struct {
	Template       string            `json:"template"`
	SnapshotID     string            `json:"snapshotId"`
	Size           string            `json:"size"`
	TimeoutMs      *int64            `json:"timeoutMs"`
	ProjectID      string            `json:"projectId"`
	Metadata       map[string]string `json:"metadata"`
	Envs           map[string]string `json:"envs"`
	Region         string            `json:"region"`
	VolumeID       string            `json:"volumeId"`
	VolumeName     string            `json:"volumeName"`
	InternetAccess *bool             `json:"internetAccess"`
	AllowedHosts   []string          `json:"allowedHosts"`
	// Network is E2B's network configuration (allowOut, denyOut, rules,
	// egressProxy, httpsPorts), in place of internetAccess and
	// allowedHosts (docs/API-EXTENSIONS.md).
	Network *network.Settings `json:"network"`
	// LizardToken is an API key of the project to give the sandbox, for
	// the lizard CLI in it (see lizardToken).
	LizardToken string `json:"lizardToken"`
	// Environment names one of the project's named sandbox environments
	// (sets of variables) to start with; lizard has none, so only the
	// default is known (see checkEnvironment).
	Environment string `json:"environment"`
	// IAM registers the sandbox's workload tokens (internal/identity), as
	// E2B's create does.
	IAM *identity.IAM `json:"iam"`
	// AutoResume: once paused, the sandbox is resumed by the first request
	// that needs it (exec, files, processes, previews) instead of
	// answering 409 sandbox_not_running.
	AutoResume bool `json:"autoResume"`
}

// pauseMemory is sandboxInfo.PauseMemory.
func pauseMemory(r sandbox.Record) *bool {
	if r.Status != sandbox.StatusPaused && r.Status != sandbox.StatusPausing {
		return nil
	}
	kept := !r.FilesOnly
	return &kept
}

// defaultEnvironment is the one sandbox environment a project has here:
// the variables the create itself passes in envs.
const defaultEnvironment = "default"

// checkEnvironment refuses a named sandbox environment this server does
// not have: the SDK documents that an unknown name is refused, and
// starting without the variables it asked for would lose them silently.
func checkEnvironment(name string) error {
	if name == "" || name == defaultEnvironment {
		return nil
	}
	return errdefs.WithCode("unknown_environment", fmt.Errorf("environment %q: unknown; this server has no named sandbox environments, only %q "+
		"(pass the variables in envs): %w", name, defaultEnvironment, errdefs.ErrInvalid))
}

// defaultTimeoutMs is the SDKs' default sandbox lifetime.
const defaultTimeoutMs = 300_000

func (s *server) createSandbox(w http.ResponseWriter, r *http.Request, p store.Project) error {
	body, err := readBody(w, r, maxBody)
	if err != nil {
		return err
	}
	var req createRequest
	if err := unmarshal(body, &req); err != nil {
		return err
	}
	if err := sameProject(p, req.ProjectID); err != nil {
		return err
	}
	if err := checkEnvironment(req.Environment); err != nil {
		return err
	}
	vol := req.VolumeName
	if req.VolumeID != "" {
		vol = req.VolumeID
	}
	tokens, err := s.ids.Check("iam", req.IAM)
	if err != nil {
		return err
	}
	egress, err := createNetwork(r.Context(), s.networks, p.ID, req, TokenNames(tokens))
	if err != nil {
		return err
	}
	// Checked here too (the service checks what it is given), so that a
	// cluster refuses before it places, and a restore, which keeps its
	// snapshot's metadata and envs, refuses what a create would.
	if err := sandbox.CheckMetadata("metadata", req.Metadata); err != nil {
		return err
	}
	if err := sandbox.CheckEnvs("envs", req.Envs); err != nil {
		return err
	}
	envs := req.Envs
	if req.LizardToken != "" && req.SnapshotID != "" {
		// A restored sandbox has its snapshot's envs and network policy
		// (a snapshot of a sandbox given a key has it).
		return fmt.Errorf("lizardToken: not taken with snapshotId (a restored sandbox keeps the envs and the key of the sandbox its snapshot was taken of): %w", errdefs.ErrInvalid)
	}
	if req.AutoResume && req.SnapshotID != "" {
		return fmt.Errorf("autoResume: not taken with snapshotId (a restored sandbox keeps its snapshot's lifecycle): %w", errdefs.ErrInvalid)
	}
	if req.LizardToken != "" {
		if envs, err = s.lizardToken(p, req.LizardToken, req.Envs); err != nil {
			return err
		}
		egress.NodeAPI = true
	}
	timeout := int64(defaultTimeoutMs)
	if req.TimeoutMs != nil {
		timeout = *req.TimeoutMs
	}
	create := func() error {
		var rec sandbox.Record
		var err error
		if req.SnapshotID != "" {
			rec, err = s.copies.Restore(r.Context(), p.ID, req.SnapshotID, timeout)
		} else {
			rec, err = s.sandboxes.Create(r.Context(), sandbox.CreateRequest{
				ProjectID: p.ID, Template: req.Template, Size: req.Size, TimeoutMs: timeout,
				Metadata: req.Metadata, Envs: envs, Egress: egress, Volume: vol, AutoResume: req.AutoResume,
			})
		}
		if err != nil {
			return err
		}
		if err := RegisterTokens(r.Context(), s.ids, s.sandboxes.Kill, p.ID, rec.ID, tokens); err != nil {
			return err
		}
		writeJSON(w, http.StatusCreated, s.localInfo(rec))
		return nil
	}
	if s.cluster == nil {
		return create()
	}
	want := Placement{Template: req.Template, Snapshot: req.SnapshotID, Volume: vol}
	if req.SnapshotID != "" {
		want.Template, want.Volume = "", ""
	}
	return s.cluster.Create(w, r, p.ID, want, body, create)
}

func (s *server) listSandboxes(w http.ResponseWriter, r *http.Request, p store.Project) error {
	out := []sandboxInfo{}
	if s.cluster != nil {
		all, err := s.cluster.Sandboxes(r.Context(), p.ID)
		if err != nil {
			return err
		}
		for _, ns := range all {
			info := infoOf(ns.Record)
			info.Node = ns.Node
			out = append(out, info)
		}
		writeJSON(w, http.StatusOK, out)
		return nil
	}
	for _, rec := range s.sandboxes.List(p.ID) {
		out = append(out, infoOf(rec))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *server) listProjectSandboxes(w http.ResponseWriter, r *http.Request, p store.Project) error {
	if err := sameProject(p, r.PathValue("pid")); err != nil {
		return err
	}
	return s.listSandboxes(w, r, p)
}

func (s *server) getSandbox(w http.ResponseWriter, r *http.Request, p store.Project) error {
	rec, err := s.sandboxes.Get(p.ID, r.PathValue("id"))
	if err != nil {
		return err
	}
	info := s.localInfo(rec)
	if u, ok := s.usage.LatestUsage(rec.ID); ok {
		pt := pointOf(u)
		info.Metrics = &pt
	}
	writeJSON(w, http.StatusOK, info)
	return nil
}

func (s *server) killSandbox(w http.ResponseWriter, r *http.Request, p store.Project) error {
	if err := s.sandboxes.Kill(r.Context(), p.ID, r.PathValue("id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *server) setTimeout(w http.ResponseWriter, r *http.Request, p store.Project) error {
	var req struct {
		TimeoutMs *int64 `json:"timeoutMs"`
	}
	if err := decode(w, r, maxBody, &req); err != nil {
		return err
	}
	if req.TimeoutMs == nil {
		return fmt.Errorf("timeoutMs: required, 1000 to %d: %w", sandbox.MaxTimeoutMs, errdefs.ErrInvalid)
	}
	if err := s.sandboxes.SetTimeout(r.Context(), p.ID, r.PathValue("id"), *req.TimeoutMs); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// pauseSandbox checkpoints the sandbox; it is paused when this answers.
// {"memory": false} (a lizard addition) pauses it keeping its files only.
func (s *server) pauseSandbox(w http.ResponseWriter, r *http.Request, p store.Project) error {
	var req struct {
		Memory *bool `json:"memory"`
	}
	if err := decode(w, r, maxBody, &req); err != nil {
		return err
	}
	pause := s.sandboxes.Pause
	if req.Memory != nil && !*req.Memory {
		pause = s.sandboxes.PauseFiles
	}
	if err := pause(r.Context(), p.ID, r.PathValue("id")); err != nil {
		return err
	}
	return s.getSandbox(w, r, p)
}

// resumeSandbox restores a paused sandbox; of a running one it is the no-op
// the Python client's connect() relies on.
func (s *server) resumeSandbox(w http.ResponseWriter, r *http.Request, p store.Project) error {
	rec, err := s.sandboxes.Resume(r.Context(), p.ID, r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, s.localInfo(rec))
	return nil
}

// forkSandbox answers the array the SDK expects: one entry per copy, in
// order, {sandbox} or {error}.
func (s *server) forkSandbox(w http.ResponseWriter, r *http.Request, p store.Project) error {
	var req struct {
		Count     *int   `json:"count"`
		TimeoutMs *int64 `json:"timeoutMs"`
	}
	if err := decode(w, r, maxBody, &req); err != nil {
		return err
	}
	count, timeout := 1, int64(0)
	if req.Count != nil {
		count = *req.Count
	}
	if req.TimeoutMs != nil {
		timeout = *req.TimeoutMs
	}
	results, err := s.copies.Fork(r.Context(), p.ID, r.PathValue("id"), count, timeout)
	if err != nil {
		return err
	}
	type entry struct {
		Sandbox *sandboxInfo `json:"sandbox,omitempty"`
		Error   string       `json:"error,omitempty"`
	}
	out := make([]entry, len(results))
	for i, res := range results {
		if res.Err != nil {
			_, _, msg := statusOf(res.Err)
			out[i].Error = msg
			continue
		}
		info := s.localInfo(*res.Sandbox)
		out[i].Sandbox = &info
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
