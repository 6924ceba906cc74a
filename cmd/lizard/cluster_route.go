package main

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/lizard-build/lizard/internal/api"
	"github.com/lizard-build/lizard/internal/cluster"
	"github.com/lizard-build/lizard/internal/proxy"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/sandbox/snapshot"
	sandboxusage "github.com/lizard-build/lizard/internal/sandbox/usage"
	"github.com/lizard-build/lizard/internal/volume"
)

// clusterRouting is cluster mode's routing of requests between nodes
// (internal/cluster: internal.go, forward.go, place.go, list.go): the
// router the API, the E2B API and the preview proxy consult, and the
// internal listener's server.
type clusterRouting struct {
	router *cluster.Router
	signer *cluster.Signer
	local  cluster.Local
	log    *slog.Logger
	// resume resumes an orphaned sandbox here for a peer moving it
	// (drain --move).
	resume func(ctx context.Context, id string) error
	// pools adopts and drops peers' warm pools here.
	pools cluster.PoolHost
}

// newClusterRouting builds node self's routing over the shared database
// db, with this node's sandbox service and volume manager as its part of
// the lists.
func newClusterRouting(self string, secret []byte, db cluster.Database, svc *sandbox.Service, snaps *snapshot.Manager, usages *sandboxusage.Sampler, vols *volume.Manager, objectStore bool, log *slog.Logger) (*clusterRouting, error) {
	signer, err := cluster.NewSigner(self, secret)
	if err != nil {
		return nil, err
	}
	local := cluster.LocalService{Node: self, Service: svc, SnapshotManager: snaps, Usage: usages, VolumeManager: vols}
	cr := &clusterRouting{
		router: cluster.NewRouter(cluster.RouterConfig{Self: self, Directory: db, Store: db, Signer: signer, Local: local, ObjectStore: objectStore, Logger: log}),
		signer: signer, local: local, log: log,
		resume: func(ctx context.Context, id string) error {
			o, err := db.SandboxOwner(ctx, id)
			if err != nil {
				return err
			}
			_, err = svc.Resume(ctx, o.ProjectID, id)
			return err
		},
		pools: snaps,
	}
	snaps.SetPoolPeers(cr.router)
	return cr, nil
}

// hooks are what the API, the E2B API and the proxy get: the router in
// cluster mode, nil interfaces on a single server (cr nil).
func (cr *clusterRouting) hooks() (api.Cluster, proxy.Forwarder) {
	if cr == nil {
		return nil, nil
	}
	return cr.router, cr.router
}

// server is the server of --internal-listen: the requests peers forward,
// to this node's API handler and preview proxy, and their list calls.
func (cr *clusterRouting) server(apiH, proxyH http.Handler, tp trace.TracerProvider) *http.Server {
	return &http.Server{
		Handler: cluster.InternalHandler(cluster.InternalConfig{Signer: cr.signer, API: apiH, Proxy: proxyH, Local: cr.local, Resume: cr.resume, Pools: cr.pools,
			Logger: cr.log, Tracing: tp}),
		ReadHeaderTimeout: 10 * time.Second,
	}
}
