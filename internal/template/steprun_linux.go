//go:build linux

package template

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/lizard-build/lizard/internal/network"
	"github.com/lizard-build/lizard/internal/runtime"
)

// The build network: RUN steps reach the Debian mirror (apt-get) through a
// bridge and NAT of their own, never the host's network namespace, behind
// the sandboxes' firewall (internal/network): no host service, no
// 169.254.0.0/16, nothing on the bridge. It exists only while a build runs
// RUN steps; builds on one bridge take turns on it (its lock in
// buildStateDir), so one build's teardown never pulls it from under
// another. Servers on one host use bridges and subnets of their own
// (BuildNetwork), and each bridge has its own lock. The steps, Dockerfile
// RUN steps and the built-in recipes' alike, run as containers of the
// node's runtime (DockerfileOptions.Runtime, Registry.Runtime) on that
// network (runStep).
const (
	DefaultBuildBridge = "lizardbuild0"
	buildStateDir      = "/run/lizard"
)

// DefaultBuildSubnet is the build network's subnet unless BuildNetwork
// says otherwise.
var DefaultBuildSubnet = netip.MustParsePrefix("10.247.0.0/16")

// BuildNetworkLock is the lock file builds on bridge take turns with (it
// stays after them; a host's tests remove theirs).
func BuildNetworkLock(bridge string) string {
	return filepath.Join(buildStateDir, "build-network-"+bridge+".lock")
}

func (c BuildNetwork) withDefaults() BuildNetwork {
	if c.Bridge == "" {
		c.Bridge = DefaultBuildBridge
	}
	if !c.Subnet.IsValid() {
		c.Subnet = DefaultBuildSubnet
	}
	return c
}

// stepNet is one build's build network: made on the first step that needs
// it, held (with the bridge's lock) until close.
type stepNet struct {
	cfg    BuildNetwork
	run    RunFunc
	log    *slog.Logger
	printf func(format string, args ...any)

	m    *network.Manager
	lock *os.File
}

// manager returns the build network, making it on first use.
func (n *stepNet) manager(ctx context.Context) (*network.Manager, error) {
	if n.m != nil {
		return n.m, nil
	}
	cfg := n.cfg.withDefaults()
	if err := os.MkdirAll(buildStateDir, 0o755); err != nil {
		return nil, err
	}
	f, err := flock(ctx, BuildNetworkLock(cfg.Bridge), syscall.LOCK_EX, func() {
		n.printf("waiting for another build's steps to finish (builds take turns on the build network)")
	})
	if err != nil {
		return nil, err
	}
	m, err := network.New(network.Config{Bridge: cfg.Bridge, Subnet: cfg.Subnet, DNSUpstream: cfg.DNSUpstream,
		Deny: cfg.Deny, NetnsPrefix: cfg.NetnsPrefix, Run: n.run, Logger: n.log})
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("build network (bridge %s, subnet %s; see --build-bridge, --build-subnet): %w", cfg.Bridge, cfg.Subnet, err)
	}
	n.m, n.lock = m, f
	return m, nil
}

// close removes the build network (bridge, firewall table, resolver) and
// lets other builds have it: steps of all builds on the bridge hold the
// same lock, so none is using it now. It may be called more than once.
func (n *stepNet) close() {
	if n.m != nil {
		if err := n.m.Remove(); err != nil {
			n.printf("warning: removing the build network: %v", err)
		}
		n.m = nil
	}
	if n.lock != nil {
		n.lock.Close()
		n.lock = nil
	}
}

// step is one command a build runs in a container of its own.
type step struct {
	// Rootfs is the container's root, written in place.
	Rootfs   string
	Args     []string
	Env      []string
	Cwd      string
	UID, GID uint32
	// OnLine gets each line of the command's output as it comes.
	OnLine func(string)
}

// runStep runs s with rt (the node's runtime) in a container on the build
// network n whose root is s.Rootfs itself, and returns its exit code and
// its last lines of output. Dockerfile RUN steps and the built-in recipes'
// steps (debootstrap's second stage, apt-get, useradd, npm, checks) all run
// here: one way to run a build's container.
func runStep(ctx context.Context, rt runtime.Runner, n *stepNet, s step) (code int, last []string, err error) {
	netm, err := n.manager(ctx)
	if err != nil {
		return 0, nil, err
	}
	var rnd [6]byte
	rand.Read(rnd[:])
	id := "lzb" + hex.EncodeToString(rnd[:])
	// The step's log lives beside the rootfs, in the build's temporary
	// directory, and goes with the step.
	work := filepath.Join(filepath.Dir(s.Rootfs), ".run")
	if err := os.Mkdir(work, 0o700); err != nil {
		return 0, nil, err
	}
	defer os.RemoveAll(work)

	spec := runtime.RunSpec{
		ID: id, Rootfs: s.Rootfs, Hostname: "build",
		Args: s.Args, Env: s.Env, Cwd: s.Cwd, UID: s.UID, GID: s.GID,
		Resources: runtime.Resources{MemoryMB: 8 << 10, Pids: 16384},
		Network:   netm,
	}
	// gVisor mounts a tmpfs on /tmp unless the spec mounts something there;
	// what a step writes to /tmp belongs to the rootfs, as in Docker.
	if tmpDir, err := resolveInRoot(s.Rootfs, "/tmp"); err == nil {
		if fi, err := os.Lstat(tmpDir); err == nil && fi.IsDir() {
			spec.Mounts = append(spec.Mounts, runtime.Mount{Source: tmpDir, Destination: "/tmp"})
		}
	}
	logPath := filepath.Join(work, "output.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return 0, nil, err
	}
	defer logf.Close()
	spec.Output = logf

	tail := follow(logPath, s.OnLine)
	defer tail.stop()
	code, err = rt.Run(ctx, spec)
	tail.stop()
	return code, tail.last(10), err
}

// follower streams the lines a step writes to its log file.
type follower struct {
	path   string
	onLine func(string)
	quit   chan struct{}
	done   chan struct{}
	once   sync.Once

	mu   sync.Mutex
	tail []string
}

// follow starts passing path's lines to onLine (may be nil) until stop.
func follow(path string, onLine func(string)) *follower {
	f := &follower{path: path, onLine: onLine, quit: make(chan struct{}), done: make(chan struct{})}
	go f.loop()
	return f
}

func (f *follower) loop() {
	defer close(f.done)
	var off int64
	var partial []byte
	read := func(final bool) {
		file, err := os.Open(f.path)
		if err != nil {
			return
		}
		defer file.Close()
		buf := make([]byte, 64<<10)
		for {
			n, err := file.ReadAt(buf, off)
			off += int64(n)
			partial = append(partial, buf[:n]...)
			for {
				i := bytes.IndexByte(partial, '\n')
				if i < 0 {
					break
				}
				f.line(string(partial[:i]))
				partial = partial[i+1:]
			}
			if len(partial) > 64<<10 {
				f.line(string(partial))
				partial = nil
			}
			if err != nil || n == 0 {
				break
			}
		}
		if final && len(partial) > 0 {
			f.line(string(partial))
			partial = nil
		}
	}
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-f.quit:
			read(true)
			return
		case <-t.C:
			read(false)
		}
	}
}

func (f *follower) line(s string) {
	s = strings.TrimRight(s, "\r")
	if i := strings.LastIndexByte(s, '\r'); i >= 0 {
		s = s[i+1:] // progress bars redraw the line
	}
	if strings.TrimSpace(s) == "" {
		return
	}
	f.mu.Lock()
	f.tail = append(f.tail, s)
	if len(f.tail) > tailLines {
		f.tail = f.tail[len(f.tail)-tailLines:]
	}
	f.mu.Unlock()
	if f.onLine != nil {
		f.onLine(s)
	}
}

// stop reads what is left and stops; it may be called more than once.
func (f *follower) stop() {
	f.once.Do(func() { close(f.quit) })
	<-f.done
}

// last returns the last n lines seen.
func (f *follower) last(n int) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.tail) > n {
		return append([]string(nil), f.tail[len(f.tail)-n:]...)
	}
	return append([]string(nil), f.tail...)
}
