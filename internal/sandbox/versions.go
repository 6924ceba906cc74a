package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
)

// versionDir returns the version directory (<name>@sha256-<hex>) a
// recorded template rootfs (<templates>/….v/<name>@sha256-<hex>/rootfs)
// is in, with the template's name and the version's digest: the same on
// every node. ok is false for "" and for paths of the older layout.
func versionDir(rootfs string) (dir, name, digest string, ok bool) {
	if rootfs == "" {
		return "", "", "", false
	}
	dir = filepath.Base(filepath.Dir(rootfs))
	name, hex, ok := strings.Cut(dir, "@sha256-")
	if !ok || name == "" || len(hex) != 64 {
		return "", "", "", false
	}
	return dir, name, "sha256:" + hex, true
}

// hereRootfs returns this node's path of the template version recorded as
// rootfs, on this node or another, for a sandbox, snapshot or pool of
// project's template tplName that starts here: the recorded path when this
// node has it; else the same version by its digest (Templates.LookupVersion:
// held here, or fetched from the object store beside the current version);
// else, when no node published that version (a built-in template every
// node builds for itself), the template's current version if fallback,
// else a template_not_found error. Nothing recorded is the current
// version. The version is kept from pruning until release is called, by
// when whatever runs on it must be in the service's tables.
func (s *Service) hereRootfs(project, tplName, recorded string, fallback bool) (rootfs string, release func(), err error) {
	release = func() {}
	dir, name, digest, ok := versionDir(recorded)
	if ok {
		release = s.pin(dir)
	}
	if recorded != "" {
		if _, err := os.Stat(recorded); err == nil {
			return recorded, release, nil
		}
		if !ok && !fallback {
			return "", release, errdefs.WithCode("template_not_found", fmt.Errorf("the version of template %q it was made on is gone (%s): %w", tplName, recorded, errdefs.ErrNotFound))
		}
	}
	if ok {
		t, err := s.cfg.Templates.LookupVersion(project, name, digest)
		if err == nil {
			return t.Rootfs, release, nil
		}
		if !errors.Is(err, errdefs.ErrNotFound) {
			release()
			return "", func() {}, fmt.Errorf("template %q version %s: %w", name, digest, err)
		}
		if !fallback {
			release()
			return "", func() {}, errdefs.WithCode("template_not_found", fmt.Errorf("the version of template %q it was made on (%s) is gone from this node and no node published it: %w", tplName, dir, errdefs.ErrNotFound))
		}
		s.log.Warn("template version not on this node nor published: the template's current version is used",
			"template", tplName, "version", dir, "err", err)
		release()
		release = func() {}
	}
	tpl, err := s.cfg.Templates.Lookup(project, tplName)
	if err != nil {
		return "", release, fmt.Errorf("template %q: %w", tplName, err)
	}
	return tpl.Rootfs, release, nil
}

// pin keeps the template versions in directories named dir from pruning
// (UsesRootfs) until the returned func is called.
func (s *Service) pin(dir string) func() {
	s.mu.Lock()
	s.pinned[dir]++
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		if s.pinned[dir]--; s.pinned[dir] <= 0 {
			delete(s.pinned, dir)
		}
		s.mu.Unlock()
	}
}

// TemplateVersionsUsed returns the template version directories
// (<name>@sha256-<hex>) that the sandbox and snapshot records of st were
// made on: those of every node, when st is a cluster's store.
func TemplateVersionsUsed(ctx context.Context, st store.Store) (map[string]bool, error) {
	used := map[string]bool{}
	add := func(spec json.RawMessage) {
		var r struct {
			Rootfs string `json:"rootfs"`
		}
		if json.Unmarshal(spec, &r) == nil {
			if dir, _, _, ok := versionDir(r.Rootfs); ok {
				used[dir] = true
			}
		}
	}
	sbs, err := st.Sandboxes(ctx)
	if err != nil {
		return nil, fmt.Errorf("template versions in use: %w", err)
	}
	for _, sb := range sbs {
		add(sb.Spec)
	}
	sns, err := st.Snapshots(ctx)
	if err != nil {
		return nil, fmt.Errorf("template versions in use: %w", err)
	}
	for _, sn := range sns {
		add(sn.Spec)
	}
	return used, nil
}
