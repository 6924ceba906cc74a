package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/lizard-build/lizard/internal/cluster"
	"github.com/lizard-build/lizard/internal/store"
)

const nodesUsage = `usage:
  lizard nodes ls --database URL
  lizard nodes drain NODE [--undo] --database URL   (no new sandboxes on NODE; --undo: take them again)
  lizard nodes drain NODE --move [--timeout D] --database URL
                                                     (and move its sandboxes to other nodes: paused, made durable,
                                                      resumed elsewhere; waits, exits non-zero naming what did not move)
  lizard nodes remove NODE --database URL            (NODE is gone for good: its sandboxes are lost)`

// nodes is `lizard nodes`: the cluster's members, straight from the
// database the nodes share (like projects and keys).
func nodes(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("nodes", flag.ContinueOnError)
	database := fs.String("database", "", databaseUsage)
	undo := fs.Bool("undo", false, "with drain: the node takes new sandboxes again")
	move := fs.Bool("move", false, "with drain: move the node's sandboxes to other nodes, and wait")
	timeout := fs.Duration("timeout", cluster.DefaultMoveTimeout, "with drain --move: how long to wait")
	pos, err := configure(fs, args)
	if err != nil {
		return err
	}
	var cmd string
	if len(pos) > 0 {
		cmd = pos[0]
	}
	switch {
	case (cmd == "ls" || cmd == "list") && len(pos) == 1 && !*undo:
	case cmd == "drain" && len(pos) == 2 && !(*undo && *move):
	case cmd == "remove" && len(pos) == 2 && !*undo:
	default:
		return errors.New(nodesUsage)
	}
	if pg, err := isPostgres(*database); err != nil || !pg {
		return errors.New("nodes: --database postgres://…: the database the cluster's nodes share")
	}
	st, err := openStore(ctx, "", *database)
	if err != nil {
		return err
	}
	defer st.Close()
	db, ok := st.(cluster.Database)
	if !ok {
		return fmt.Errorf("nodes: the %T store holds no cluster", st)
	}
	switch cmd {
	case "drain":
		if *move {
			return drainMove(ctx, db, pos[1], *timeout, os.Stdout)
		}
		if err := db.SetDraining(ctx, pos[1], !*undo); err != nil {
			return err
		}
		if *undo {
			fmt.Printf("node %s takes new sandboxes again\n", pos[1])
		} else {
			fmt.Printf("node %s is draining: no new sandboxes are placed on it; its sandboxes keep running\n", pos[1])
		}
		return nil
	case "remove":
		if err := db.RemoveNode(ctx, pos[1]); err != nil {
			return err
		}
		fmt.Printf("node %s removed: its sandboxes are lost; if it comes back it joins as a new member and destroys them\n", pos[1])
		return nil
	}
	return listNodes(ctx, db, os.Stdout)
}

// listNodes prints the nodes as a table.
func listNodes(ctx context.Context, db store.Cluster, out io.Writer) error {
	ns, err := db.Nodes(ctx)
	if err != nil {
		return err
	}
	rows := make([][]string, 0, len(ns))
	for _, n := range ns {
		runsc := n.RunscBuild
		if len(runsc) > 19 {
			runsc = runsc[:19] // sha256: and 12 hex digits tell builds apart
		}
		rows = append(rows, []string{n.Name, n.Address, n.State, fmt.Sprint(n.Sandboxes),
			store.FormatAmount(n.ReservedVCPUs) + "/" + capacityText(n.VCPUs, store.FormatAmount),
			store.FormatAmount(float64(n.ReservedMemoryMB)/1024) + "/" + capacityText(float64(n.MemoryMB)/1024, store.FormatGiB),
			heartbeatText(n), runsc})
	}
	return printTable(out, []string{"NAME", "ADDRESS", "STATE", "SANDBOXES", "VCPUS", "MEMORY", "HEARTBEAT", "RUNSC"}, rows)
}

// capacityText is a node's capacity; "-" for no limit.
func capacityText(v float64, show func(float64) string) string {
	if v == 0 {
		return "-"
	}
	return show(v)
}

// heartbeatText is how long ago the node last renewed its lease.
func heartbeatText(n store.Node) string {
	return time.Since(n.Heartbeat).Round(time.Second).String() + " ago"
}
