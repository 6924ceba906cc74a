package api

import (
	"context"
	"fmt"
	"net/http"

	"github.com/lizard-build/lizard/internal/egress"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/network"
	"github.com/lizard-build/lizard/internal/store"
)

// networkRoutes serve a sandbox's network configuration and its egress
// log (docs/API-EXTENSIONS.md).
type networkRoutes struct {
	networks Networks
}

// getNetwork is GET /api/sandboxes/{id}/network: the configuration, with
// placeholders as written and never the SOCKS5 password.
func (n networkRoutes) getNetwork(w http.ResponseWriter, r *http.Request, p store.Project) error {
	e, err := n.networks.Network(p.ID, r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, settingsOf(e))
	return nil
}

// setNetwork is PUT /api/sandboxes/{id}/network: allowOut, denyOut, rules
// and egressProxy replaced as a whole (what the body leaves out is
// cleared; httpsPorts, set at create, stay). It answers the new
// configuration once new connections follow it.
func (n networkRoutes) setNetwork(w http.ResponseWriter, r *http.Request, p store.Project) error {
	var req network.Settings
	if err := decode(w, r, maxBody, &req); err != nil {
		return err
	}
	if len(req.HTTPSPorts) > 0 {
		return fmt.Errorf("httpsPorts: set when the sandbox is created, not changed by a network update: %w", errdefs.ErrInvalid)
	}
	e, err := network.ParseSettings("network", req, nil)
	if err != nil {
		return err
	}
	out, err := n.networks.SetNetwork(r.Context(), p.ID, r.PathValue("id"), e)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, settingsOf(out))
	return nil
}

// networkLog is GET /api/sandboxes/{id}/network/log: the sandbox's egress
// log, oldest first (the node keeps its last entries in memory).
func (n networkRoutes) networkLog(w http.ResponseWriter, r *http.Request, p store.Project) error {
	entries, err := n.networks.Log(p.ID, r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, struct {
		Entries []egress.Entry `json:"entries"`
	}{entries})
	return nil
}

// networkSettings is a configuration as the API shows it: every list
// present, empty when unset.
type networkSettings struct {
	AllowOut    []string                  `json:"allowOut"`
	DenyOut     []string                  `json:"denyOut"`
	Rules       map[string][]network.Rule `json:"rules"`
	EgressProxy *network.SOCKSProxy       `json:"egressProxy"`
	HTTPSPorts  []int                     `json:"httpsPorts"`
}

func settingsOf(e network.Egress) networkSettings {
	s := e.Settings()
	out := networkSettings{AllowOut: s.AllowOut, DenyOut: s.DenyOut, Rules: s.Rules, EgressProxy: s.EgressProxy, HTTPSPorts: s.HTTPSPorts}
	if out.AllowOut == nil {
		out.AllowOut = []string{}
	}
	if out.DenyOut == nil {
		out.DenyOut = []string{}
	}
	if out.Rules == nil {
		out.Rules = map[string][]network.Rule{}
	}
	if out.HTTPSPorts == nil {
		out.HTTPSPorts = []int{}
	}
	return out
}

// createNetwork is a create's configuration: `network`, or the older
// internetAccess and allowedHosts (not both), its placeholders checked.
func createNetwork(ctx context.Context, networks Networks, projectID string, req createRequest, tokens []string) (network.Egress, error) {
	if req.Network == nil {
		return network.ParseEgress(req.InternetAccess, req.AllowedHosts)
	}
	if req.InternetAccess != nil || len(req.AllowedHosts) > 0 {
		return network.Egress{}, fmt.Errorf("network: not with internetAccess or allowedHosts (say denyOut [\"0.0.0.0/0\"] and allowOut instead): %w", errdefs.ErrInvalid)
	}
	if req.SnapshotID != "" {
		return network.Egress{}, fmt.Errorf("network: not taken with snapshotId (a restored sandbox keeps its snapshot's; change it with PUT /api/sandboxes/{id}/network): %w", errdefs.ErrInvalid)
	}
	e, err := network.ParseSettings("network", *req.Network, nil)
	if err != nil {
		return network.Egress{}, err
	}
	if networks == nil {
		return network.Egress{}, fmt.Errorf("network: this server takes no network configuration: %w", errdefs.ErrInvalid)
	}
	return e, networks.Check(ctx, projectID, e, tokens)
}
