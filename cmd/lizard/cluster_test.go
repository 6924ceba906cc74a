package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/store/storetest"
)

// TestClusterFlags: cluster mode's flags are checked before anything
// starts, each refusal naming the flag.
func TestClusterFlags(t *testing.T) {
	noConfig(t)
	dir := t.TempDir()
	good := filepath.Join(dir, "secret")
	if err := os.WriteFile(good, bytes.Repeat([]byte("s"), 32), 0o600); err != nil {
		t.Fatal(err)
	}
	short := filepath.Join(dir, "short")
	if err := os.WriteFile(short, []byte("too short"), 0o600); err != nil {
		t.Fatal(err)
	}
	pg := "postgres://u@127.0.0.1:1/db"
	base := func(extra ...string) []string {
		return append([]string{"serve", "--data-dir", dir, "--internal-listen", "127.0.0.1:7070", "--advertise", "10.0.0.1:7070",
			"--node-name", "a", "--cluster-secret-file", good, "--database", pg}, extra...)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--data-dir", dir, "--internal-listen", "127.0.0.1:7070"}, "needs --database postgres://"},
		{base("--database", ""), "needs --database postgres://"},
		{base("--advertise", ""), "--advertise: required"},
		{base("--advertise", "10.0.0.1"), "--advertise \"10.0.0.1\""},
		{base("--advertise", ":7070"), "--advertise \":7070\""},
		{base("--internal-listen", "nonsense"), "--internal-listen \"nonsense\""},
		{base("--cluster-secret-file", ""), "--cluster-secret-file: required"},
		{base("--cluster-secret-file", short), "9 bytes, need at least 32"},
		{base("--cluster-secret-file", filepath.Join(dir, "missing")), "--cluster-secret-file: open"},
		{base("--node-name", "a b"), "--node-name \"a b\""},
		{base("--node-lease", "100ms"), "--node-lease 100ms"},
		{base("--node-dead-after", "5s"), "--node-dead-after 5s: must be at least --node-lease"},
		{[]string{"serve", "--data-dir", dir, "--advertise", "10.0.0.1:7070"}, "--advertise is a cluster mode flag"},
	} {
		err := Run(context.Background(), tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error with %q", tc.args[1:], err, tc.want)
		}
	}
	// Valid flags pass validation (serve then stops at what the test
	// cannot give it: root, or runsc).
	var f clusterFlags
	f.internalListen, f.advertise, f.secretFile, f.lease, f.deadAfter = "127.0.0.1:7070", "10.0.0.1:7070", good, 10*time.Second, time.Minute
	secret, err := f.validate(pg)
	if err != nil || len(secret) != 32 {
		t.Fatalf("valid cluster flags: %v", err)
	}
	if host, _ := os.Hostname(); f.nodeName != host {
		t.Fatalf("default node name %q, want the hostname %q", f.nodeName, host)
	}
}

// TestNodesCLI: nodes ls, drain (and --undo) and remove on the database a
// cluster shares.
func TestNodesCLI(t *testing.T) {
	ctx := context.Background()
	url, st, p := nodesDB(t)
	f, err := st.RegisterNode(ctx, store.NodeInfo{Name: "node-a", Address: "10.77.0.11:7070", RunscBuild: "sha256:0123456789abcdef0123",
		VCPUs: 64, MemoryMB: 32768, MaxSandboxes: 100}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.RegisterNode(ctx, store.NodeInfo{Name: "node-b", Address: "10.77.0.12:7070"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	err = st.PutSandboxFenced(ctx, f, store.Sandbox{ID: "sb1", ProjectID: p.ID, Template: "base", Size: "s", Status: "running",
		Spec: []byte(`{}`), StartedAt: time.Now(), CPUs: 1.5, MemoryMB: 1536}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := listNodes(ctx, st, &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "NAME") || !strings.Contains(lines[0], "HEARTBEAT") {
		t.Fatalf("nodes ls:\n%s", out.String())
	}
	for _, want := range []string{"node-a", "10.77.0.11:7070", "ready", " 1 ", "1.5/64", "1.5/32 GiB", "sha256:0123456789ab", "s ago"} {
		if !strings.Contains(lines[1], want) {
			t.Errorf("nodes ls: no %q in %q", want, lines[1])
		}
	}
	if !strings.Contains(lines[2], "node-b") || !strings.Contains(lines[2], "0/-") {
		t.Errorf("nodes ls, a node without limits: %q", lines[2])
	}
	if err := Run(ctx, []string{"nodes", "ls", "--database", url}); err != nil {
		t.Fatal(err)
	}

	state := func(name string) string {
		t.Helper()
		return storetest.NodeOf(t, ctx, st, name).State
	}
	if err := Run(ctx, []string{"nodes", "drain", "node-a", "--database", url}); err != nil || state("node-a") != store.NodeDraining {
		t.Fatalf("drain: %v, state %s", err, state("node-a"))
	}
	if err := Run(ctx, []string{"nodes", "drain", "node-a", "--undo", "--database", url}); err != nil || state("node-a") != store.NodeReady {
		t.Fatalf("drain --undo: %v, state %s", err, state("node-a"))
	}
	if err := Run(ctx, []string{"nodes", "remove", "node-a", "--database", url}); err != nil || state("node-a") != store.NodeRemoved {
		t.Fatalf("remove: %v, state %s", err, state("node-a"))
	}
	if o, err := st.SandboxOwner(ctx, "sb1"); err != nil || !o.Lost {
		t.Fatalf("sandbox of the removed node: %+v %v", o, err)
	}
	for _, args := range [][]string{{"nodes", "drain", "nope"}, {"nodes", "remove", "nope"}} {
		if err := Run(ctx, append(args, "--database", url)); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("%v: %v, want ErrNotFound", args, err)
		}
	}
	for _, args := range [][]string{{"nodes"}, {"nodes", "frob"}, {"nodes", "drain"}, {"nodes", "remove", "a", "--undo"}} {
		if err := Run(ctx, append(args, "--database", url)); err == nil || !strings.Contains(err.Error(), "usage") {
			t.Errorf("%v: %v, want the usage", args, err)
		}
	}
	if err := Run(ctx, []string{"nodes", "ls"}); err == nil || !strings.Contains(err.Error(), "--database postgres://") {
		t.Errorf("nodes ls without --database: %v", err)
	}
}
