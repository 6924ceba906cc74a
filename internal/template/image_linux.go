//go:build linux

package template

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	goruntime "runtime"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// FROM an OCI image: the host pulls it (go-containerregistry; credentials
// from the Docker config, as docker and crane use them), flattens its
// layers into one rootfs — a layer of the cache keyed by the image's
// digest, so the next build does not pull it again — and the build goes on
// from there with the image's configuration (ENV, WORKDIR, USER,
// ENTRYPOINT, CMD, HEALTHCHECK). The rootfs gets what lizard mounts over
// (/.lizard, /etc/hosts, /etc/resolv.conf, /tmp).

// pulledImage is the image a build starts from.
type pulledImage struct {
	ref    string
	digest string
	rootfs string
}

// pull pulls image ref into the layer cache and returns its configuration.
func (b *dbuild) pull(ctx context.Context, ref string, line int) (baseInfo, error) {
	fail := func(format string, args ...any) (baseInfo, error) {
		return baseInfo{}, fmt.Errorf("%s:%d: FROM %s: "+format, append([]any{b.opts.DockerfileName, line, ref}, args...)...)
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		return fail("not a template name or an image reference: %v: %w", err, errdefs.ErrInvalid)
	}
	b.out.printf("FROM %s: looking the image up at %s", ref, r.Context().RegistryStr())
	img, err := remote.Image(r, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain),
		remote.WithPlatform(v1.Platform{OS: "linux", Architecture: goruntime.GOARCH}))
	if err != nil {
		return fail("cannot pull the image: %v: %w", err, pullClass(err))
	}
	digest, err := img.Digest()
	if err != nil {
		return fail("image digest: %v: %w", err, pullClass(err))
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return fail("image configuration: %v: %w", err, pullClass(err))
	}
	if cfg.OS != "" && cfg.OS != "linux" {
		return fail("the image is for %s, not linux: %w", cfg.OS, errdefs.ErrInvalid)
	}
	key := fromKey("image "+r.Context().Name(), digest.String(), "")
	rootfs, ok := b.cached(key)
	if ok {
		b.out.printf("FROM %s: %s CACHED", ref, digest)
	} else {
		layers, _ := img.Layers()
		var size int64
		for _, l := range layers {
			if n, err := l.Size(); err == nil {
				size += n
			}
		}
		b.out.printf("FROM %s: %s, %d layers, %s to fetch", ref, digest, len(layers), fmtBytes(size))
		rootfs, err = b.makeLayer(ctx, "", "", key, dfStep{Text: "FROM " + ref}, func(rootfs string) error {
			rc := mutate.Extract(img)
			defer rc.Close()
			if err := untar(rc, rootfs); err != nil {
				return fmt.Errorf("unpack the image: %w", pullClass(err))
			}
			return prepareImageRootfs(rootfs)
		})
		if err != nil {
			return fail("%w", err)
		}
	}
	b.image = &pulledImage{ref: ref, digest: digest.String(), rootfs: rootfs}
	c := cfg.Config
	return baseInfo{Key: key, Env: c.Env, Workdir: c.WorkingDir, User: c.User, Entrypoint: c.Entrypoint, Cmd: c.Cmd,
		Ready: imageHealthcheck(c.Healthcheck)}, nil
}

// pullClass is the error class of a failed pull: what the registry says
// is missing is not found, what it refuses is a permission error, and
// anything else (an unreachable registry, a broken image) is the
// Dockerfile's: it names an image this host cannot use.
func pullClass(err error) error {
	var terr *transport.Error
	if errors.As(err, &terr) {
		switch terr.StatusCode {
		case 404:
			return errdefs.ErrNotFound
		case 401, 403:
			return errdefs.ErrPermission
		}
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return errdefs.ErrInvalid
}

// imageHealthcheck is the ready command of an image's HEALTHCHECK.
func imageHealthcheck(h *v1.HealthConfig) []string {
	if h == nil || len(h.Test) < 2 {
		return nil // none, inherited or NONE
	}
	switch h.Test[0] {
	case "CMD":
		return append([]string(nil), h.Test[1:]...)
	case "CMD-SHELL":
		return append(append([]string(nil), defaultShell...), h.Test[1])
	}
	return nil
}

// prepareImageRootfs makes what a sandbox mounts over, and what its agent
// and start command need, in an image's rootfs.
func prepareImageRootfs(rootfs string) error {
	for _, d := range []struct {
		path string
		mode fs.FileMode
	}{{".lizard", 0o755}, {"etc", 0o755}, {"proc", 0o555}, {"sys", 0o555}, {"dev", 0o755}, {"tmp", 0o777 | fs.ModeSticky}} {
		p := filepath.Join(rootfs, d.path)
		if fi, err := os.Lstat(p); err == nil && fi.IsDir() {
			continue
		}
		os.RemoveAll(p) // a link or a file where a directory must be
		if err := os.Mkdir(p, 0o755); err != nil {
			return err
		}
		if err := os.Chmod(p, d.mode); err != nil {
			return err
		}
	}
	for _, f := range []struct{ path, content string }{{"etc/hosts", hostsFile}, {"etc/resolv.conf", ""}} {
		p := filepath.Join(rootfs, f.path)
		if fi, err := os.Lstat(p); err == nil && fi.Mode().IsRegular() {
			continue
		}
		os.RemoveAll(p) // e.g. a link to /run/systemd/resolve/...
		if err := os.WriteFile(p, []byte(f.content), 0o644); err != nil {
			return err
		}
	}
	return nil
}
