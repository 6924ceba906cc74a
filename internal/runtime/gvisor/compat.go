package gvisor

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/lizard-build/lizard/internal/agent"
	"github.com/lizard-build/lizard/internal/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Every checkpoint image (pause image, snapshot, fork image, ready state)
// carries a manifest of what restoring it needs: the runsc build that wrote
// it and the CPU features of the host it was written on. gVisor images are
// not portable across runsc builds, and a restore on a CPU missing a feature
// the saved processes use fails or misbehaves. A restore of an image whose
// manifest does not match is refused with 409 incompatible_checkpoint before
// runsc is run, and the image is kept. Images without a manifest (written by
// servers before this one) count as made by the current build.
const manifestFile = "lizard-checkpoint.json"

// Manifest is what an image records of what made it.
type Manifest struct {
	// RunscVersion is the first line of `runsc --version`; RunscDigest the
	// SHA-256 of the runsc binary, which tells builds apart that report the
	// same version (a source build says VERSION_MISSING).
	RunscVersion string `json:"runscVersion"`
	RunscDigest  string `json:"runscDigest"`
	// CPUFeatures are the flags of the host CPU (/proc/cpuinfo) at save time.
	CPUFeatures []string `json:"cpuFeatures,omitempty"`
	// LizardCLI: the saved sandbox had the lizard CLI mounted (at
	// CLIPath), so its restores must have it too; false in images of
	// sandboxes made before the CLI was.
	LizardCLI bool `json:"lizardCli,omitempty"`
	// EgressCA: the saved sandbox had the egress CA's certificate mounted
	// (at agent.EgressCAFile), so its restores must have it too; false in
	// images of sandboxes made before there was one.
	EgressCA bool `json:"egressCa,omitempty"`
	// FilesOnly: the image holds the sandbox's files only (PauseFiles):
	// a boot over them, to which the host's CPU features do not matter.
	FilesOnly bool `json:"filesOnly,omitempty"`
}

// build is the manifest of this server's runsc on this host, computed once.
type build struct {
	once sync.Once
	m    Manifest
	err  error
}

func (r *Runtime) manifest(ctx context.Context) (Manifest, error) {
	r.build.once.Do(func() {
		r.build.m, r.build.err = currentManifest(ctx, r.cfg.Runsc, r.runCmd)
	})
	return r.build.m, r.build.err
}

// currentManifest describes what this host's runsc and CPU give an image.
// run runs a command and waits for it (the reaper's Run in the server, so
// that its status is not reaped away).
func currentManifest(ctx context.Context, runsc string, run func(*exec.Cmd) error) (Manifest, error) {
	var m Manifest
	var out bytes.Buffer
	cmd := exec.CommandContext(context.WithoutCancel(ctx), runsc, "--version")
	cmd.Stdout = &out
	if err := run(cmd); err != nil {
		return m, fmt.Errorf("runsc --version: %w", err)
	}
	m.RunscVersion, _, _ = strings.Cut(strings.TrimSpace(out.String()), "\n")
	f, err := os.Open(runsc)
	if err != nil {
		return m, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return m, fmt.Errorf("hash runsc: %w", err)
	}
	m.RunscDigest = "sha256:" + hex.EncodeToString(h.Sum(nil))
	m.CPUFeatures, err = cpuFeatures()
	return m, err
}

// cpuFeatures are the flags of the first processor in /proc/cpuinfo,
// sorted.
func cpuFeatures() ([]string, error) {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && (strings.TrimSpace(k) == "flags" || strings.TrimSpace(k) == "Features") {
			flags := strings.Fields(v)
			slices.Sort(flags)
			return flags, nil
		}
	}
	return nil, sc.Err()
}

// writeManifest records in image, just saved of sandbox id, what restoring
// it needs.
func (r *Runtime) writeManifest(ctx context.Context, id, image string, filesOnly bool) error {
	m, err := r.manifest(ctx)
	if err != nil {
		return err
	}
	var spec specs.Spec
	if err := readJSON(filepath.Join(r.dir(id), "bundle", "config.json"), &spec); err != nil {
		return fmt.Errorf("the saved sandbox's spec: %w", err)
	}
	m.LizardCLI = hasMount(&spec, CLIPath)
	m.EgressCA = hasMount(&spec, agent.EgressCAFile)
	m.FilesOnly = filesOnly
	return writeJSON(filepath.Join(image, manifestFile), m)
}

// imageMounts says which of the runtime's own optional mounts image's
// sandbox had: the lizard CLI, the egress CA.
func imageMounts(image string) (cli, ca bool, err error) {
	var m Manifest
	if err := readJSON(filepath.Join(image, manifestFile), &m); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return false, false, nil // older than manifests, the CLI and the CA
		}
		return false, false, fmt.Errorf("checkpoint manifest of %s: %w", image, err)
	}
	return m.LizardCLI, m.EgressCA, nil
}

// compatible refuses an image this server cannot restore: written by
// another runsc build, or on a CPU with features this one lacks. An image
// without a manifest counts as made by the current build.
func (r *Runtime) compatible(ctx context.Context, image string) error {
	var img Manifest
	if err := readJSON(filepath.Join(image, manifestFile), &img); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("checkpoint manifest of %s: %w", image, err)
	}
	cur, err := r.manifest(ctx)
	if err != nil {
		return err
	}
	var why []string
	if img.RunscVersion != cur.RunscVersion {
		why = append(why, fmt.Sprintf("made by runsc %q, this server runs %q", img.RunscVersion, cur.RunscVersion))
	} else if img.RunscDigest != cur.RunscDigest {
		why = append(why, fmt.Sprintf("made by runsc build %s, this server runs build %s", img.RunscDigest, cur.RunscDigest))
	}
	var missing []string
	for _, f := range img.CPUFeatures {
		if img.FilesOnly {
			break // no process of it is restored
		}
		if _, ok := slices.BinarySearch(cur.CPUFeatures, f); !ok {
			missing = append(missing, f)
		}
	}
	if len(missing) > 0 {
		why = append(why, "this host's CPU lacks "+strings.Join(missing, " "))
	}
	if len(why) == 0 {
		return nil
	}
	return errdefs.WithCode("incompatible_checkpoint",
		errdefs.WithCause(errdefs.ErrConflict, "the checkpoint cannot be restored here: "+strings.Join(why, "; ")+"; the image is kept", fmt.Errorf("image %s", image)))
}

// RunscDigest is the SHA-256 of this server's runsc binary, as checkpoint
// manifests record it: the build a cluster node reports, since images
// restore only on nodes of the same build.
func (r *Runtime) RunscDigest(ctx context.Context) (string, error) {
	m, err := r.manifest(ctx)
	return m.RunscDigest, err
}
