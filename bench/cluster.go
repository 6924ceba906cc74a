package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/lizard-build/lizard/internal/cluster"
	"github.com/lizard-build/lizard/internal/objstore"
	"github.com/lizard-build/lizard/internal/objstore/s3"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/store/postgres"
	"github.com/lizard-build/lizard/internal/store/postgres/pgtest"
)

// The cluster measurements (issues 12 and 13): a three-node cluster of
// the bench's own, brought up by scripts/cluster.sh (PostgreSQL,
// versitygw, nodes in network namespaces) with names, addresses, ports
// and a state directory nothing else on the host uses, and torn down on
// the way out, however the section ends. Each figure stands beside its
// floor: forwarding beside the owner answered directly, create through
// the cluster beside a single node without one, a resume on another node
// (from the object store) beside one on the same node.
//
// Not measured here: the first use of a template on a node that lacks it.
// Template distribution landed in main while this section was written, with
// its own row in the durable section (bench/tmpldist.go: create → exec
// with the fetch from the object store, beside a node that holds it); a
// cluster row of it is still to do.

// The cluster's private layout (scripts/cluster.sh's variables): host
// bridge lzbc0 with 10.74.0.1/24, nodes n1-n3 in namespaces lzbn-n1…
// at 10.74.0.11-13, sandbox subnets 10.101-103/16 (bridges lzsb-n1…),
// build subnets 10.111-113/16, cgroup parents lzbc-n1…, PostgreSQL and
// versitygw on 10.74.0.1:55474 and :55475, state in
// /var/tmp/lizard-bench-cluster. The single-node floor server gets bridge
// lzbs0 and 10.104/16.
var clusterEnv = map[string]string{
	"LIZARD_CLUSTER_BRIDGE":      "lzbc0",
	"LIZARD_CLUSTER_NET":         "10.74.0",
	"LIZARD_CLUSTER_NETNS":       "lzbn",
	"LIZARD_CLUSTER_CGROUP":      "lzbc",
	"LIZARD_CLUSTER_NODES":       "n1 n2 n3",
	"LIZARD_CLUSTER_SUBNET_BASE": "100",
	"LIZARD_CLUSTER_PG_PORT":     "55474",
	"LIZARD_CLUSTER_S3_PORT":     "55475",
	"LIZARD_CLUSTER_DIR":         "/var/tmp/lizard-bench-cluster",
}

const (
	singleBridge = "lzbs0"
	singleSubnet = "10.104.0.0/16"
)

// benchCluster is the running cluster: its nodes' APIs, its database and
// object store, and the lizard binary for the CLI.
type benchCluster struct {
	dir   string // of the built binaries
	names []string
	nodes []*server
	db    string
	pg    *postgres.Store
	obj   objstore.Store
	key   string
}

// clusterScript runs scripts/cluster.sh with the bench's layout.
func clusterScript(cfg config, bin string, stdout io.Writer, args ...string) error {
	c := exec.Command("scripts/cluster.sh", args...)
	c.Env = os.Environ()
	for k, v := range clusterEnv {
		c.Env = append(c.Env, k+"="+v)
	}
	c.Env = append(c.Env, "LIZARD_BIN="+bin, "TEMPLATE_DIR="+cfg.templateDir, "RUNSC="+cfg.runsc,
		"VERSITYGW="+os.Getenv("LIZARD_VERSITYGW"))
	c.Stdout, c.Stderr = stdout, os.Stderr
	if err := c.Run(); err != nil {
		return fmt.Errorf("scripts/cluster.sh %s: %w", strings.Join(args, " "), err)
	}
	return nil
}

var (
	reAPIKey = regexp.MustCompile(`LIZARD_API_KEY=(\S+)`)
	reS3Keys = regexp.MustCompile(`AWS_ACCESS_KEY_ID=(\S+) AWS_SECRET_ACCESS_KEY=([^\s)]+)`)
)

// startBenchCluster brings the cluster up; stop tears it down (and is
// to be called even when this fails).
func startBenchCluster(ctx context.Context, cfg config) (c *benchCluster, stop func(), err error) {
	dir, err := os.MkdirTemp("", "lizard-bench-cluster-bin-")
	if err != nil {
		return nil, func() {}, err
	}
	c = &benchCluster{dir: dir}
	bin := filepath.Join(dir, "lizard")
	stop = func() {
		if c.pg != nil {
			c.pg.Close()
		}
		if err := clusterScript(cfg, bin, os.Stderr, "down"); err != nil {
			fmt.Fprintln(os.Stderr, "bench: cluster down:", err)
		}
		os.RemoveAll(dir)
	}
	if err := buildLizard(dir); err != nil {
		return nil, stop, err
	}
	var out bytes.Buffer
	if err := clusterScript(cfg, bin, io.MultiWriter(&out, os.Stderr), "up", "-d"); err != nil {
		return nil, stop, err
	}
	key, s3k := reAPIKey.FindStringSubmatch(out.String()), reS3Keys.FindStringSubmatch(out.String())
	if key == nil || s3k == nil {
		return nil, stop, fmt.Errorf("scripts/cluster.sh up printed no API key or object store keys:\n%s", out.String())
	}
	c.key = key[1]
	state := clusterEnv["LIZARD_CLUSTER_DIR"]
	b, err := os.ReadFile(filepath.Join(state, "database"))
	if err != nil {
		return nil, stop, err
	}
	c.db = strings.TrimSpace(string(b))
	if c.pg, err = postgres.Open(ctx, c.db); err != nil {
		return nil, stop, err
	}
	creds := filepath.Join(dir, "s3-credentials")
	if err := os.WriteFile(creds, []byte("[default]\naws_access_key_id = "+s3k[1]+"\naws_secret_access_key = "+s3k[2]+"\n"), 0o600); err != nil {
		return nil, stop, err
	}
	net := clusterEnv["LIZARD_CLUSTER_NET"]
	if c.obj, err = s3.Open("s3://lizard?endpoint=" + net + ".1:" + clusterEnv["LIZARD_CLUSTER_S3_PORT"] + "&region=us-east-1&insecure=true&credentials-file=" + creds); err != nil {
		return nil, stop, err
	}
	for i, n := range strings.Fields(clusterEnv["LIZARD_CLUSTER_NODES"]) {
		c.names = append(c.names, n)
		c.nodes = append(c.nodes, &server{url: fmt.Sprintf("http://%s.%d:8080", net, 11+i), key: c.key,
			dataDir: filepath.Join(state, "nodes", n, "data"),
			client:  &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}})
	}
	return c, stop, nil
}

// cli runs `lizard args… --database` against the cluster's database.
func (c *benchCluster) cli(args ...string) error {
	out, err := exec.Command(filepath.Join(c.dir, "lizard"), append(args, "--database", c.db)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("lizard %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// where is the index of the node holding sandbox id, as node via says.
func (c *benchCluster) where(via int, id string) (int, error) {
	var info struct {
		Node string `json:"node"`
	}
	if err := c.nodes[via].call("GET", "/api/sandboxes/"+id, nil, &info); err != nil {
		return 0, err
	}
	for i, n := range c.names {
		if n == info.Node {
			return i, nil
		}
	}
	return 0, fmt.Errorf("sandbox %s on unknown node %q", id, info.Node)
}

// clusterRow is one measurement beside its floor.
type clusterRow struct {
	name, floorName string
	got, floor      []time.Duration
}

func benchClusterSection(ctx context.Context, cfg config, w io.Writer, n int) error {
	var rows []clusterRow
	// The floor of create → first exec: one node, no cluster, no
	// database but its SQLite.
	single := cfg
	single.bridge, single.subnet = singleBridge, singleSubnet
	srv, err := startServer(ctx, single)
	if err != nil {
		return err
	}
	singleCreate, err := timeit(n, func() error { return createExec(srv, srv) })
	srv.stop()
	if err != nil {
		return fmt.Errorf("single node create: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return err
	}

	c, stop, err := startBenchCluster(ctx, cfg)
	defer stop()
	if err != nil {
		return err
	}
	r, err := c.benchForward(n)
	if err != nil {
		return fmt.Errorf("forwarding: %w", err)
	}
	rows = append(rows, r...)
	create, err := timeit(n, func() error { return createExec(c.nodes[0], c.nodes[0]) })
	if err != nil {
		return fmt.Errorf("create through a node: %w", err)
	}
	rows = append(rows, clusterRow{name: "create → first exec through n1 (3 nodes)", got: create,
		floorName: "single node, no cluster", floor: singleCreate})
	// Placement alone: the same creates with n2 and n3 drained, so that
	// every one is placed (the same choice over the nodes' rows) on n1
	// itself and nothing is forwarded.
	local, err := c.onlyOn(0, func() ([]time.Duration, error) {
		return timeit(n, func() error { return createExec(c.nodes[0], c.nodes[0]) })
	})
	if err != nil {
		return fmt.Errorf("create placed on the node asked: %w", err)
	}
	// The same floor on PostgreSQL: what the cluster adds beside the
	// database it needs.
	singlePG, err := singleOnPostgres(ctx, single, n)
	if err != nil {
		return fmt.Errorf("single node on PostgreSQL: %w", err)
	}
	rows = append(rows, clusterRow{name: "create → first exec through n1, placed on n1", got: local,
		floorName: "single node, no cluster", floor: singleCreate},
		clusterRow{name: "create → first exec through n1, placed on n1", got: local,
			floorName: "single node on PostgreSQL", floor: singlePG})
	fmt.Fprintln(os.Stderr, "measured create through the cluster")
	if err := ctx.Err(); err != nil {
		return err
	}
	spread, note, err := c.benchSpread(ctx, 60)
	if err != nil {
		return fmt.Errorf("60 creates: %w", err)
	}
	rows = append(rows, spread)
	var moves []moveRow
	for _, big := range []bool{false, true} {
		if err := ctx.Err(); err != nil {
			return err
		}
		m, err := c.benchMove(max(3, n/4), big)
		if err != nil {
			return fmt.Errorf("move %s: %w", m.name, err)
		}
		fmt.Fprintf(os.Stderr, "measured pause/resume across nodes, %s\n", m.name)
		moves = append(moves, m)
		rows = append(rows,
			clusterRow{name: "pause → durable, " + m.name, got: m.durable, floorName: "pause (local)", floor: m.pause},
			clusterRow{name: "resume → first exec on another node (object store), " + m.name, got: m.cross,
				floorName: "same node (local image)", floor: m.local})
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	drain, downtime, err := c.benchDrainMove(5)
	if err != nil {
		return fmt.Errorf("drain --move: %w", err)
	}
	fmt.Fprintln(os.Stderr, "measured drain --move")

	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "cluster (3 nodes on this host)\tn\tp50\tp95\tfloor\tn\tp50\tp95\tΔ p50\t")
	for _, r := range rows {
		g, f := stats(r.got), stats(r.floor)
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%d\t%s\t%s\t%+.1fms\t\n", r.name, len(r.got), ms(g[1]), ms(g[2]),
			r.floorName, len(r.floor), ms(f[1]), ms(f[2]), float64((g[1]-f[1]).Microseconds())/1000)
	}
	d := stats(downtime)
	fmt.Fprintf(tw, "drain --move of 5 running sandboxes: total\t1\t%s\t\t—\t\t\t\t\t\n", ms(drain))
	fmt.Fprintf(tw, "  per-sandbox downtime (longest gap between execs)\t%d\t%s\t%s\t—\t\t\t\t\t\n", len(downtime), ms(d[1]), ms(d[2]))
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "durable image (last pause)\tpause image\tuploaded\tuploaded/image\t")
	for _, m := range moves {
		fmt.Fprintf(tw, "%s\t%.1f MiB\t%.1f MiB\t%.2f\t\n", m.name, float64(m.image)/(1<<20), float64(m.stored)/(1<<20), float64(m.stored)/float64(max(m.image, 1)))
	}
	tw.Flush()
	fmt.Fprintln(w, note)
	fmt.Fprintln(w, "exec/1 MiB: the same sandbox through a node that does not hold it (forwarded over the internal listener) vs through its owner; "+
		"create: POST create and exec `true` through n1, placed by best-of-2 on any node; placed on n1: the same with n2 and n3 drained (placement runs, nothing is forwarded); "+
		"pause → durable: POST pause until GET shows durableAt (zstd chunks uploaded to versitygw); floor: POST pause alone; "+
		"another node: the owner drained with --move (releases the paused sandbox), then POST resume through another node (download, restore, take-over) and exec; "+
		"drain --move: the CLI's run until it returns (it polls each second); downtime: per sandbox, the longest gap between successful execs `true` sent in a loop through a node not drained")
	return nil
}

// createExec creates a sandbox through node via and runs `true` in it
// through node exe, then kills it.
func createExec(via, exe *server) error {
	id, err := via.create()
	if err != nil {
		return err
	}
	defer via.kill(id)
	return exe.execTrue(id)
}

// benchForward measures exec `true` and a 1 MiB write + read through a
// node that does not hold the sandbox, and through the one that does.
func (c *benchCluster) benchForward(n int) ([]clusterRow, error) {
	id, err := c.nodes[0].create()
	if err != nil {
		return nil, err
	}
	defer c.nodes[0].kill(id)
	o, err := c.where(0, id)
	if err != nil {
		return nil, err
	}
	owner, other := c.nodes[o], c.nodes[(o+1)%len(c.nodes)]
	execRow := clusterRow{name: "exec true, through a non-owner", floorName: "owner directly"}
	// Interleaved, so that both see the same host.
	for range n * 5 {
		for _, s := range []*server{owner, other} {
			t := time.Now()
			if err := s.execTrue(id); err != nil {
				return nil, err
			}
			if s == owner {
				execRow.floor = append(execRow.floor, time.Since(t))
			} else {
				execRow.got = append(execRow.got, time.Since(t))
			}
		}
	}
	data := make([]byte, 1<<20)
	rand.Read(data)
	b64 := base64.StdEncoding.EncodeToString(data)
	fileRow := clusterRow{name: "1 MiB write + read, through a non-owner", floorName: "owner directly"}
	for range n {
		for _, s := range []*server{owner, other} {
			t := time.Now()
			if err := s.call("POST", "/api/sandboxes/"+id+"/files", map[string]any{"path": "/tmp/blob", "content": b64, "encoding": "base64"}, nil); err != nil {
				return nil, err
			}
			var back []byte
			if err := s.call("GET", "/api/sandboxes/"+id+"/files?path=/tmp/blob", nil, &back); err != nil {
				return nil, err
			}
			if !bytes.Equal(back, data) {
				return nil, fmt.Errorf("read back %d bytes, not the ones written", len(back))
			}
			if s == owner {
				fileRow.floor = append(fileRow.floor, time.Since(t))
			} else {
				fileRow.got = append(fileRow.got, time.Since(t))
			}
		}
	}
	fmt.Fprintln(os.Stderr, "measured forwarding")
	return []clusterRow{execRow, fileRow}, nil
}

// benchSpread creates k nano sandboxes at once, all through n1, then k
// spread over the three nodes' APIs, each to a first exec, watching the
// nodes' reservations against their capacity meanwhile.
func (c *benchCluster) benchSpread(ctx context.Context, k int) (clusterRow, string, error) {
	r := clusterRow{name: fmt.Sprintf("%d concurrent creates → exec through n1 (each)", k),
		floorName: "spread over n1-n3"}
	// The default project allows 50 live sandboxes.
	if err := c.cli("projects", "set", "default", "--max-sandboxes", fmt.Sprint(2*k)); err != nil {
		return r, "", err
	}
	var notes []string
	for _, spread := range []bool{false, true} {
		got, wall, placed, err := c.createWave(ctx, k, spread)
		if err != nil {
			return r, "", err
		}
		how := "through n1"
		if spread {
			r.floor = got
			how = "spread"
		} else {
			r.got = got
		}
		notes = append(notes, fmt.Sprintf("%s: all %d succeeded in %s wall, placed %v", how, k, ms(wall), placed))
		fmt.Fprintf(os.Stderr, "measured %d creates %s\n", k, how)
	}
	return r, fmt.Sprintf("%d concurrent nano creates: %s; no node over its capacity (sandboxes, vCPU, memory) at any sample of its row", k, strings.Join(notes, "; ")), nil
}

// createWave runs one wave of k concurrent creates and kills them after.
func (c *benchCluster) createWave(ctx context.Context, k int, spread bool) (each []time.Duration, wall time.Duration, placed map[string]int, err error) {
	stopWatch := make(chan struct{})
	watchErr := make(chan error, 1)
	go func() { watchErr <- c.watchCapacity(ctx, stopWatch) }()
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		ids  []string
		errs []string
	)
	start := time.Now()
	for i := range k {
		s := c.nodes[0]
		if spread {
			s = c.nodes[i%len(c.nodes)]
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.Now()
			var sb struct {
				SandboxID string `json:"sandboxId"`
			}
			err := s.call("POST", "/api/sandboxes", map[string]any{"template": "base", "size": "nano", "timeoutMs": 600000}, &sb)
			if err == nil {
				err = s.execTrue(sb.SandboxID)
			}
			d := time.Since(t)
			mu.Lock()
			defer mu.Unlock()
			if sb.SandboxID != "" {
				ids = append(ids, sb.SandboxID)
			}
			if err != nil {
				errs = append(errs, err.Error())
				return
			}
			each = append(each, d)
		}()
	}
	wg.Wait()
	wall = time.Since(start)
	close(stopWatch)
	werr := <-watchErr
	placed = map[string]int{}
	for _, id := range ids {
		if o, err := c.where(0, id); err == nil {
			placed[c.names[o]]++
		}
	}
	for _, id := range ids {
		c.nodes[0].kill(id)
	}
	if len(errs) > 0 {
		return nil, 0, nil, fmt.Errorf("%d of %d creates failed: %s", len(errs), k, strings.Join(errs, "; "))
	}
	return each, wall, placed, werr
}

// watchCapacity samples the nodes' rows until stop and fails if any holds
// more than its capacity.
func (c *benchCluster) watchCapacity(ctx context.Context, stop <-chan struct{}) error {
	for {
		ns, err := c.pg.Nodes(ctx)
		if err != nil {
			return err
		}
		for _, n := range ns {
			if over(n) {
				return fmt.Errorf("node %s over capacity: %d/%d sandboxes, %.1f/%.1f vCPU, %d/%d MiB", n.Name,
					n.Sandboxes, n.MaxSandboxes, n.ReservedVCPUs, n.VCPUs, n.ReservedMemoryMB, n.MemoryMB)
			}
		}
		select {
		case <-stop:
			return nil
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func over(n store.Node) bool {
	return (n.MaxSandboxes > 0 && n.Sandboxes > n.MaxSandboxes) ||
		(n.VCPUs > 0 && n.ReservedVCPUs > n.VCPUs) || (n.MemoryMB > 0 && n.ReservedMemoryMB > n.MemoryMB)
}

type moveRow struct {
	name                         string
	pause, durable, local, cross []time.Duration
	image, stored                int64 // of the last pause
}

// benchMove measures, n times each, pause → durable, then alternately a
// resume on the same node and one on another node, each to a first exec.
func (c *benchCluster) benchMove(n int, big bool) (moveRow, error) {
	r := moveRow{name: "idle"}
	if big {
		r.name = "256 MiB"
	}
	a := c.nodes[0]
	id, kill, err := createHolding(a, big)
	if err != nil {
		return r, err
	}
	defer kill()
	for i := range 2 * n {
		if err := c.waitStoreEmpty(); err != nil {
			return r, err
		}
		o, err := c.where(0, id)
		if err != nil {
			return r, err
		}
		owner := c.nodes[o]
		t := time.Now()
		if err := owner.post("/api/sandboxes/"+id+"/pause", nil, nil); err != nil {
			return r, err
		}
		r.pause = append(r.pause, time.Since(t))
		if err := waitDurable(owner, id); err != nil {
			return r, err
		}
		r.durable = append(r.durable, time.Since(t))
		r.image = dirSize(filepath.Join(owner.dataDir, "sandboxes", id, "checkpoint"))
		r.stored = 0
		if err := c.obj.List(context.Background(), "blobs/", func(i objstore.Info) error { r.stored += i.Size; return nil }); err != nil {
			return r, err
		}
		cross := i%2 == 1
		via := owner
		if cross {
			// The owner lets the paused sandbox go; another node takes it
			// over on its resume.
			if err := c.cli("nodes", "drain", c.names[o], "--move"); err != nil {
				return r, err
			}
			settle()
			via = c.nodes[(o+1)%len(c.nodes)]
		}
		t = time.Now()
		if err := via.post("/api/sandboxes/"+id+"/resume", nil, nil); err != nil {
			return r, err
		}
		if err := via.execTrue(id); err != nil {
			return r, err
		}
		if !cross {
			r.local = append(r.local, time.Since(t))
			continue
		}
		r.cross = append(r.cross, time.Since(t))
		if now, err := c.where(0, id); err != nil || now == o {
			return r, fmt.Errorf("sandbox %s after a resume elsewhere: on %s (%v), still its old node", id, c.names[now], err)
		}
		if err := c.cli("nodes", "drain", c.names[o], "--undo"); err != nil {
			return r, err
		}
	}
	return r, nil
}

// settle waits until every node's cached list of nodes has seen a drain
// (or its undoing) in the database, so that placement honours it.
func settle() { time.Sleep(cluster.DefaultNodesTTL + 200*time.Millisecond) }

// waitStoreEmpty waits until the object store holds nothing: a resumed
// image's objects go in the background, and the next pause's upload is
// to be measured alone.
func (c *benchCluster) waitStoreEmpty() error {
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		left := 0
		if err := c.obj.List(context.Background(), "", func(objstore.Info) error { left++; return nil }); err != nil {
			return err
		}
		if left == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the object store still holds %d objects after 2 minutes", left)
		}
	}
}

// benchDrainMove times `lizard nodes drain n1 --move` of n1 running k
// sandboxes, while a loop per sandbox runs exec `true` in it through n2,
// and returns each sandbox's longest gap between successful execs.
// singleOnPostgres times n creates → first exec on a single server (no
// cluster) on a PostgreSQL 15 of its own over TCP (the cluster's user may
// not create databases).
func singleOnPostgres(ctx context.Context, cfg config, n int) ([]time.Duration, error) {
	port, err := freeAddr()
	if err != nil {
		return nil, err
	}
	pg, err := pgtest.StartTCP(ctx, netip.MustParseAddrPort(port), netip.MustParsePrefix("127.0.0.0/8"))
	if err != nil {
		return nil, err
	}
	defer pg.Stop()
	db, err := pg.NewDatabase(ctx)
	if err != nil {
		return nil, err
	}
	// On the first floor's bridge: benchClusterSection removes it and
	// its table once, at its end.
	srv, err := startServer(ctx, cfg, "--database", db)
	if err != nil {
		return nil, err
	}
	defer srv.stop()
	return timeit(n, func() error { return createExec(srv, srv) })
}

// onlyOn runs f while every node but node i is drained (no new sandboxes
// placed there), and undrains them after.
func (c *benchCluster) onlyOn(i int, f func() ([]time.Duration, error)) (got []time.Duration, err error) {
	var drained []string
	defer func() {
		for _, n := range drained {
			if uerr := c.cli("nodes", "drain", n, "--undo"); err == nil {
				err = uerr
			}
		}
		settle()
	}()
	for j, n := range c.names {
		if j == i {
			continue
		}
		if err := c.cli("nodes", "drain", n); err != nil {
			return nil, err
		}
		drained = append(drained, n)
	}
	settle()
	return f()
}

func (c *benchCluster) benchDrainMove(k int) (time.Duration, []time.Duration, error) {
	a, b := c.nodes[0], c.nodes[1]
	var ids []string
	defer func() {
		for _, id := range ids {
			b.kill(id)
		}
	}()
	// Everything on n1: the others take no new sandboxes meanwhile.
	for _, n := range c.names[1:] {
		if err := c.cli("nodes", "drain", n); err != nil {
			return 0, nil, err
		}
	}
	settle()
	for range k {
		id, err := a.create()
		if err != nil {
			return 0, nil, err
		}
		ids = append(ids, id)
	}
	for _, n := range c.names[1:] {
		if err := c.cli("nodes", "drain", n, "--undo"); err != nil {
			return 0, nil, err
		}
	}
	settle()
	for _, id := range ids {
		if o, err := c.where(1, id); err != nil || o != 0 {
			return 0, nil, fmt.Errorf("sandbox %s placed on %s (%v), want n1", id, c.names[o], err)
		}
	}
	stop := make(chan struct{})
	gaps := make([]time.Duration, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			last := time.Now()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if b.execTrue(id) == nil {
					gaps[i] = max(gaps[i], time.Since(last))
					last = time.Now()
				} else {
					time.Sleep(20 * time.Millisecond)
				}
			}
		}()
	}
	time.Sleep(time.Second) // the loops run before the drain
	t := time.Now()
	err := c.cli("nodes", "drain", "n1", "--move")
	took := time.Since(t)
	time.Sleep(time.Second) // and after it
	close(stop)
	wg.Wait()
	if err != nil {
		return 0, nil, err
	}
	for _, id := range ids {
		if o, err := c.where(1, id); err != nil || o == 0 {
			return 0, nil, fmt.Errorf("sandbox %s after drain --move: on %s (%v)", id, c.names[o], err)
		}
		if err := b.execTrue(id); err != nil {
			return 0, nil, err
		}
	}
	return took, gaps, c.cli("nodes", "drain", "n1", "--undo")
}
