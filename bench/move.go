package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/lizard-build/lizard/internal/objstore/vgwtest"
	"github.com/lizard-build/lizard/internal/store/postgres/pgtest"
)

// The move measurements (docs/CLUSTER.md, state that moves): two cluster
// nodes on this host (PostgreSQL of their own, a versitygw on loopback):
// pause → durable, resume on the same node → first exec beside a resume on
// the other node (the sandbox released by a drain --move of its node, then
// resumed through the other: download, restore, take-over) → first exec,
// for an idle sandbox and one holding 256 MiB; and drain --move of a node
// running five sandboxes, until the CLI returns (each resumed elsewhere).

// moveCluster is the bench's two nodes and what they share.
type moveCluster struct {
	nodes [2]*server
	db    string
}

func startMoveCluster(ctx context.Context, cfg config) (_ *moveCluster, stop func(), err error) {
	var undo []func()
	stop = func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	pg, err := pgtest.Start(ctx)
	if err != nil {
		return nil, nil, err
	}
	undo = append(undo, func() { pg.Stop() })
	c := &moveCluster{}
	if c.db, err = pg.NewDatabase(ctx); err != nil {
		return nil, nil, err
	}
	gw, err := vgwtest.Start(ctx)
	if err != nil {
		return nil, nil, err
	}
	undo = append(undo, func() { gw.Close() })
	dir, err := os.MkdirTemp("", "lizard-bench-move-")
	if err != nil {
		return nil, nil, err
	}
	undo = append(undo, func() { os.RemoveAll(dir) })
	creds, secret := filepath.Join(dir, "creds"), filepath.Join(dir, "secret")
	if err := os.WriteFile(creds, []byte("[default]\naws_access_key_id = "+gw.AccessKey+"\naws_secret_access_key = "+gw.SecretKey+"\n"), 0o600); err != nil {
		return nil, nil, err
	}
	if err := os.WriteFile(secret, []byte(strings.Repeat("bench-cluster-secret-", 3)), 0o600); err != nil {
		return nil, nil, err
	}
	for i := range c.nodes {
		internal, err := freeAddr()
		if err != nil {
			return nil, nil, err
		}
		name := fmt.Sprintf("m%d", i+1)
		s, err := startServer(ctx, cfg, "--object-store", gw.URL("bench")+"&credentials-file="+creds,
			"--database", c.db, "--internal-listen", internal, "--advertise", internal, "--node-name", name,
			"--cluster-secret-file", secret, "--cgroup-parent", "lizardb"+name,
			"--bridge", "lzbench"+name, "--subnet", fmt.Sprintf("10.%d.0.0/16", 246+i),
			"--build-bridge", "lzbenchb"+name, "--build-subnet", fmt.Sprintf("10.%d.0.0/16", 244+i))
		if err != nil {
			return nil, nil, err
		}
		undo = append(undo, s.stop)
		c.nodes[i] = s
	}
	return c, stop, nil
}

// nodesCLI runs lizard nodes args against the cluster's database.
func (c *moveCluster) nodesCLI(args ...string) error {
	out, err := exec.Command(filepath.Join(c.nodes[0].dir, "lizard"), append(append([]string{"nodes"}, args...), "--database", c.db)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("lizard nodes %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// where is the node of sandbox id, as node 0 sees it.
func (c *moveCluster) where(id string) (int, error) {
	var info struct {
		Node string `json:"node"`
	}
	if err := c.nodes[0].call("GET", "/api/sandboxes/"+id, nil, &info); err != nil {
		return 0, err
	}
	for i := range c.nodes {
		if info.Node == fmt.Sprintf("m%d", i+1) {
			return i, nil
		}
	}
	return 0, fmt.Errorf("sandbox %s on unknown node %q", id, info.Node)
}

// waitDurable waits until sandbox id's pause image is durable.
func waitDurable(s *server, id string) error {
	for t := time.Now(); ; time.Sleep(20 * time.Millisecond) {
		var info struct {
			DurableAt *string `json:"durableAt"`
		}
		if err := s.call("GET", "/api/sandboxes/"+id, nil, &info); err != nil {
			return err
		}
		if info.DurableAt != nil {
			return nil
		}
		if time.Since(t) > 10*time.Minute {
			return fmt.Errorf("%s not durable after 10 minutes", id)
		}
	}
}

type moveRow struct {
	name                  string
	durable, local, cross []time.Duration
}

func benchMove(ctx context.Context, cfg config, w io.Writer, n int) error {
	c, stop, err := startMoveCluster(ctx, cfg)
	if err != nil {
		return err
	}
	defer stop()
	var rows []moveRow
	for _, big := range []bool{false, true} {
		r, err := c.benchMoveOne(n, big)
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "measured move %s\n", r.name)
		rows = append(rows, r)
	}
	drain, err := c.benchDrainMove(5)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "move (2 nodes, versitygw on loopback)\tn\tpause→durable p50\tp95\tresume same node→exec p50\tother node→exec p50\tp95\t")
	for _, r := range rows {
		d, l, x := stats(r.durable), stats(r.local), stats(r.cross)
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t\n", r.name, len(r.cross), ms(d[1]), ms(d[2]), ms(l[1]), ms(x[1]), ms(x[2]))
	}
	fmt.Fprintf(tw, "drain --move of 5 running sandboxes\t1\t%s\t\t\t\t\t\n", ms(drain))
	tw.Flush()
	fmt.Fprintln(w, "other node: the sandbox's node drained with --move (it releases the paused sandbox), then POST resume through the other node: image download, restore, row take-over; drain --move: the CLI's run until it returns, each sandbox paused, durable, resumed elsewhere")
	return nil
}

// benchMoveOne measures, n times, pause → durable, then alternately a
// resume on the same node and one on the other node, each to a first exec.
func (c *moveCluster) benchMoveOne(n int, big bool) (moveRow, error) {
	r := moveRow{name: "idle"}
	if big {
		r.name = "256 MiB"
	}
	a := c.nodes[0]
	id, err := a.create()
	if err != nil {
		return r, err
	}
	defer a.kill(id)
	if big {
		if err := a.call("POST", "/api/sandboxes/"+id+"/exec", map[string]any{"cmd": hold256}, nil); err != nil {
			return r, err
		}
	}
	for i := range 2 * n {
		owner, err := c.where(id)
		if err != nil {
			return r, err
		}
		other := c.nodes[1-owner]
		t := time.Now()
		if err := a.post("/api/sandboxes/"+id+"/pause", nil, nil); err != nil {
			return r, err
		}
		if err := waitDurable(a, id); err != nil {
			return r, err
		}
		r.durable = append(r.durable, time.Since(t))
		cross := i%2 == 1
		name := fmt.Sprintf("m%d", owner+1)
		if cross {
			if err := c.nodesCLI("drain", name, "--move"); err != nil {
				return r, err
			}
		}
		via := c.nodes[owner]
		if cross {
			via = other
		}
		t = time.Now()
		if err := via.post("/api/sandboxes/"+id+"/resume", nil, nil); err != nil {
			return r, err
		}
		if err := via.execTrue(id); err != nil {
			return r, err
		}
		if cross {
			r.cross = append(r.cross, time.Since(t))
			if err := c.nodesCLI("drain", name, "--undo"); err != nil {
				return r, err
			}
		} else {
			r.local = append(r.local, time.Since(t))
		}
	}
	return r, nil
}

// benchDrainMove times lizard nodes drain --move of a node running k
// sandboxes, and checks each answers on the other node afterwards.
func (c *moveCluster) benchDrainMove(k int) (time.Duration, error) {
	a := c.nodes[0]
	var ids []string
	defer func() {
		for _, id := range ids {
			a.kill(id)
		}
	}()
	// Everything on m1: m2 takes no new sandboxes meanwhile.
	if err := c.nodesCLI("drain", "m2"); err != nil {
		return 0, err
	}
	for range k {
		id, err := a.create()
		if err != nil {
			return 0, err
		}
		ids = append(ids, id)
	}
	if err := c.nodesCLI("drain", "m2", "--undo"); err != nil {
		return 0, err
	}
	t := time.Now()
	if err := c.nodesCLI("drain", "m1", "--move"); err != nil {
		return 0, err
	}
	took := time.Since(t)
	for _, id := range ids {
		if w, err := c.where(id); err != nil || w != 1 {
			return 0, fmt.Errorf("sandbox %s after drain --move: on m%d (%v), want m2", id, w+1, err)
		}
		if err := a.execTrue(id); err != nil {
			return 0, err
		}
	}
	return took, c.nodesCLI("drain", "m1", "--undo")
}
