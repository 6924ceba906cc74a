package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// rawRunsc drives runsc directly with a minimal bundle over the base
// template: the floor that lizard's numbers are compared with.
type rawRunsc struct {
	runsc, root, dir, rootfs string
}

func newRawRunsc(cfg config) (*rawRunsc, error) {
	rootfs := filepath.Join(cfg.templateDir, "base", "rootfs")
	if _, err := os.Stat(rootfs); err != nil {
		return nil, fmt.Errorf("base template: %w", err)
	}
	dir, err := os.MkdirTemp("", "lizard-bench-raw-")
	if err != nil {
		return nil, err
	}
	return &rawRunsc{runsc: cfg.runsc, root: filepath.Join(dir, "runsc"), dir: dir, rootfs: rootfs}, nil
}

func (r *rawRunsc) cmd(ctx context.Context, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, r.runsc, append([]string{"--root", r.root, "--platform", "systrap", "--network", "none"}, args...)...)
}

// start creates and starts a container running sleep (or argv), as
// lizard's create does with its agent: one runsc run, a create and a start
// in one runsc process.
func (r *rawRunsc) start(ctx context.Context, argv ...string) (string, error) {
	return r.launch(ctx, false, argv...)
}

// launch is start; twoRuns makes it a runsc create, then a runsc start
// (the way the tests' slowness reference was measured).
func (r *rawRunsc) launch(ctx context.Context, twoRuns bool, argv ...string) (string, error) {
	id, err := r.prepare(argv...)
	if err != nil {
		return "", err
	}
	cdir := filepath.Join(r.dir, id)
	log, err := os.Create(filepath.Join(cdir, "console.log"))
	if err != nil {
		return "", err
	}
	defer log.Close()
	cmd := []string{"run", "--detach"}
	if twoRuns {
		cmd = []string{"create"}
	}
	c := r.cmd(ctx, append(append([]string{"--overlay2", "root:dir=" + filepath.Join(cdir, "overlay")}, cmd...), "--bundle", filepath.Join(cdir, "bundle"), id)...)
	c.Stdout, c.Stderr = log, log
	if err := c.Run(); err != nil {
		return id, fmt.Errorf("runsc %s: %v", cmd[0], err)
	}
	if twoRuns {
		if out, err := r.cmd(ctx, "start", id).CombinedOutput(); err != nil {
			return id, fmt.Errorf("runsc start: %v %s", err, out)
		}
	}
	return id, nil
}

// prepare writes a new container's bundle and returns its id.
func (r *rawRunsc) prepare(argv ...string) (string, error) {
	if len(argv) == 0 {
		argv = []string{"/bin/sleep", "infinity"}
	}
	b := make([]byte, 6)
	rand.Read(b)
	id := "raw" + hex.EncodeToString(b)
	cdir := filepath.Join(r.dir, id)
	for _, d := range []string{"bundle", "overlay"} {
		if err := os.MkdirAll(filepath.Join(cdir, d), 0o700); err != nil {
			return "", err
		}
	}
	spec := map[string]any{
		"ociVersion": "1.0.2",
		"process":    map[string]any{"args": argv, "cwd": "/", "env": []string{"PATH=/usr/bin:/bin"}},
		"root":       map[string]any{"path": r.rootfs},
		"hostname":   id,
		"mounts":     []map[string]any{{"destination": "/proc", "type": "proc", "source": "proc"}},
		"linux": map[string]any{
			"namespaces":  []map[string]string{{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}, {"type": "network"}},
			"cgroupsPath": "/lizard-bench/" + id,
		},
	}
	b, _ = json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(cdir, "bundle", "config.json"), b, 0o600); err != nil {
		return "", err
	}
	return id, nil
}

func (r *rawRunsc) exec(ctx context.Context, id string, stdin io.Reader, argv ...string) error {
	c := r.cmd(ctx, append([]string{"exec", id}, argv...)...)
	c.Stdin = stdin
	var out bytes.Buffer
	c.Stdout, c.Stderr = &out, &out
	if err := c.Run(); err != nil {
		return fmt.Errorf("runsc exec %v: %v %s", argv, err, out.Bytes())
	}
	return nil
}

func (r *rawRunsc) execOut(ctx context.Context, id string, stdout io.Writer, argv ...string) error {
	c := r.cmd(ctx, append([]string{"exec", id}, argv...)...)
	c.Stdout = stdout
	if err := c.Run(); err != nil {
		return fmt.Errorf("runsc exec %v: %v", argv, err)
	}
	return nil
}

func (r *rawRunsc) destroy(id string) {
	r.cmd(context.Background(), "delete", "--force", id).Run()
	os.RemoveAll(filepath.Join(r.dir, id))
}

func (r *rawRunsc) cleanup() {
	// runsc pins a shared empty network namespace in its root directory.
	for unix.Unmount(filepath.Join(r.root, "null-netns"), unix.MNT_DETACH) == nil {
	}
	os.RemoveAll(r.dir)
	matches, _ := filepath.Glob("/sys/fs/cgroup/*/lizard-bench")
	for _, m := range matches {
		os.Remove(m)
	}
	if m, _ := filepath.Glob("/sys/fs/cgroup/lizard-bench"); len(m) > 0 {
		os.Remove(m[0])
	}
}
