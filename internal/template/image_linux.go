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

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/netguard"
)

// FROM an OCI image: the host pulls it (go-containerregistry, through the
// build's PullPolicy: registries at private addresses are refused unless
// allowed, credentials only from the operator's file), flattens its
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
// Its errors name the image and a stable reason, nothing more: the cause
// (which could tell whether something listens at an address) is logged.
func (b *dbuild) pull(ctx context.Context, ref string, line int) (baseInfo, error) {
	where := b.fromWhere(ref, line, true)
	r, err := name.ParseReference(ref)
	if err != nil {
		return baseInfo{}, fmt.Errorf("%s: not a template name or an image reference: %w", where, errdefs.ErrInvalid)
	}
	registry := r.Context().RegistryStr()
	failed := func(err error) (baseInfo, error) {
		if ctx.Err() != nil {
			return baseInfo{}, ctx.Err()
		}
		b.log().Warn("image pull failed", "template", b.name, "image", ref, "registry", registry, "err", err)
		if errors.Is(err, netguard.ErrRefused) {
			return baseInfo{}, errdefs.WithCode(CodeRegistryRefused, fmt.Errorf(
				"%s: registry %s is refused: pulls may not reach loopback, link-local or private addresses unless the operator allows the registry (--registry-allow): %w",
				where, registry, errdefs.ErrPermission))
		}
		return baseInfo{}, errdefs.WithCode(CodeImagePullFailed, fmt.Errorf(
			"%s: cannot pull the image from %s: it does not exist, needs credentials this server does not have, or the registry cannot be reached: %w",
			where, registry, errdefs.ErrInvalid))
	}
	if err := b.opts.Pull.checkRegistry(ctx, registry); err != nil {
		return failed(err)
	}
	b.out.printf("FROM %s: looking the image up at %s", ref, registry)
	img, err := remote.Image(r, remote.WithContext(ctx), remote.WithAuthFromKeychain(b.opts.Pull),
		remote.WithTransport(b.opts.Pull.transport()),
		remote.WithPlatform(v1.Platform{OS: "linux", Architecture: goruntime.GOARCH}))
	if err != nil {
		return failed(err)
	}
	digest, err := img.Digest()
	if err != nil {
		return failed(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return failed(err)
	}
	if cfg.OS != "" && cfg.OS != "linux" {
		return baseInfo{}, fmt.Errorf("%s: the image is for %s, not linux: %w", where, cfg.OS, errdefs.ErrInvalid)
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
		var pullErr error
		rootfs, err = b.makeLayer(ctx, "", "", key, dfStep{Text: "FROM " + ref}, func(rootfs string) error {
			rc := mutate.Extract(img)
			defer rc.Close()
			if err := untar(rc, rootfs); err != nil {
				pullErr = err
				return err
			}
			return prepareImageRootfs(rootfs)
		})
		if pullErr != nil {
			return failed(pullErr)
		}
		if err != nil {
			return baseInfo{}, fmt.Errorf("%s: %w", where, err)
		}
	}
	b.image = &pulledImage{ref: ref, digest: digest.String(), rootfs: rootfs}
	c := cfg.Config
	return baseInfo{Key: key, Env: c.Env, Workdir: c.WorkingDir, User: c.User, Entrypoint: c.Entrypoint, Cmd: c.Cmd,
		Ready: imageHealthcheck(c.Healthcheck)}, nil
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
