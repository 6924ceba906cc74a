// Package template builds and serves the root filesystems sandboxes boot from.
//
// A template is a directory tree (its rootfs) that gVisor mounts read-only as
// a sandbox's root; gVisor puts a per-sandbox writable overlay on top, so one
// rootfs serves any number of sandboxes. Templates live in a Registry
// directory. Every build of a template is a version, kept in a directory of
// its own; the template's name is a symbolic link to its current version:
//
//	<dir>/<name>                            link to .v/<name>@<unique>, the current version
//	<dir>/.v/<name>@<unique>/rootfs         a version's root filesystem
//	<dir>/.v/<name>@<unique>/template.json  its metadata (version, digest, size, build time, env)
//	<dir>/.v/<name>@<unique>/manifest       every entry of its rootfs (type, mode, owner, size, SHA-256)
//	<dir>/.build-<name>-<n>/                a build in progress (ignored by Get and List)
//	<dir>/.link-<name>-<n>                  a new link of <name> about to be renamed over it
//	<dir>/.lock-<name>                      flock(2) lock serializing builds of <name>
//
// <unique> is "sha256-<hex>", from the version's digest (see Version and
// digestOf): the SHA-256 of its manifest and its config, so the same bits
// have the same directory name on every node, and a build that makes the
// bits of a version the registry holds switches to that version rather
// than store a second copy. Versions made before digests keep their
// names, the build's UTC time and a random suffix, and have no manifest;
// "legacy-<n>" is a template of the older layout, where <dir>/<name> was itself the directory
// holding rootfs and template.json (Get and List still read such a
// directory, and the next build of the name moves it under .v).
//
// A version counts only once its template.json exists: builds write the
// metadata last and then rename the whole build directory under .v, and
// only then switch <dir>/<name> to it, by renaming a new link over the old
// one, so a crashed or cancelled build never looks like a template and
// readers always see one whole version. A rebuild leaves the previous
// versions where they are, since running sandboxes and snapshots still use
// them (Get gives the rootfs path of the version it read); Prune removes
// those nothing uses any more.
//
// The registry knows how to build a fixed set of built-in templates (see
// Builtins), all Debian bookworm made with debootstrap and apt-get: "base"
// (python3, curl, ca-certificates, procps and iproute2, an unprivileged user
// "user" (uid/gid 1000, home /home/user) and an empty /.lizard directory that
// the runtime uses as a mount point), "python" (base with pip and venv),
// "node" (base with nodejs and npm) and "interpreter" (what the SDKs'
// CodeSandbox needs: Jupyter's ipykernel with numpy, pandas and matplotlib,
// and nodejs). Some have aliases ("python312", "node22") that Get, Build and
// EnsureBuilt accept in place of the name. Derived built-ins (derived.go,
// "code-interpreter-v1") are another built-in's rootfs with a start
// command of their own; building one builds its base.
package template

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/runtime"
)

// CodeNotFound is the API code of errors about templates that do not exist.
const CodeNotFound = "template_not_found"

const (
	metadataFile = "template.json"
	rootfsDir    = "rootfs"
)

// Template is one built template.
type Template struct {
	Name string `json:"name"`
	// Project is the project the template belongs to; "" for the
	// built-in templates, which every project sees.
	Project string `json:"project,omitempty"`
	// Version identifies the build, e.g. "bookworm-20260101T120000Z".
	Version string `json:"version"`
	// Digest names the version's content on every node (see
	// Version.Digest); "" for a version made before digests.
	Digest string `json:"digest,omitempty"`
	// Rootfs is the root filesystem directory of the version read: an
	// absolute path without symbolic links, which keeps naming that
	// version after rebuilds, for as long as it exists (see Prune).
	Rootfs string `json:"rootfs"`
	// SizeBytes is the sum of the sizes of the regular files in Rootfs
	// (hard links counted once), measured when the template was built.
	SizeBytes int64     `json:"sizeBytes"`
	BuiltAt   time.Time `json:"builtAt"`
	// Env is the template's default environment ("KEY=value"); may be empty.
	Env []string `json:"env,omitempty"`
	// Aliases are the other names of the template (see Resolve).
	Aliases []string `json:"aliases,omitempty"`
	// Versions are the versions of the main software in the rootfs, read
	// from its package database at build time: "debian" (12.x), "python",
	// "node", ... (upstream versions, e.g. "3.11.2").
	Versions map[string]string `json:"versions,omitempty"`
	// Of templates built from a Dockerfile: the template FROM named, and
	// the WORKDIR, USER and ENTRYPOINT+CMD in effect at its end ("" and nil
	// when the Dockerfile set none).
	From         string   `json:"from,omitempty"`
	Workdir      string   `json:"workdir,omitempty"`
	User         string   `json:"user,omitempty"`
	StartCommand []string `json:"startCommand,omitempty"`
	// Entrypoint and Cmd are the start command's ENTRYPOINT and CMD parts
	// (what a Dockerfile FROM this template inherits).
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
	// ReadyCommand tells when the start command is ready: it exits 0
	// (a Dockerfile's HEALTHCHECK CMD, or the build's ready command). nil:
	// ready once the command listens on a new TCP port.
	ReadyCommand []string `json:"readyCommand,omitempty"`
	// OnDemand: the ready state of the start command is made by the
	// template's first create, which waits for it, not in the background
	// when a server starts (derived built-ins, which every server has).
	OnDemand bool `json:"-"`
}

// EnvMap returns an environment of KEY=VALUE entries (a template's Env)
// as a map; an entry without '=' is skipped.
func EnvMap(env []string) map[string]string {
	out := make(map[string]string, len(env))
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			out[k] = v
		}
	}
	return out
}

// Key names the template among every project's: its name for a built-in
// one, "<project>~<name>" for a project's own.
func (t Template) Key() string {
	if t.Project == "" {
		return t.Name
	}
	return t.Project + "~" + t.Name
}

// metadata is the on-disk form of template.json. The rootfs path is not
// stored: it follows from where the directory is, so a registry directory
// can be moved.
type metadata struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	// Digest: see Version.Digest; written by seal once the rootfs is
	// final.
	Digest    string    `json:"digest,omitempty"`
	SizeBytes int64     `json:"size_bytes"`
	BuiltAt   time.Time `json:"built_at"`
	Env       []string  `json:"env,omitempty"`
	// Versions: see Template.Versions.
	Versions map[string]string `json:"versions,omitempty"`
	// Informational: how the template was built.
	Suite    string   `json:"suite,omitempty"`
	Mirror   string   `json:"mirror,omitempty"`
	Packages []string `json:"packages,omitempty"`
	// Revision: the recipe's Revision the template was built at.
	Revision int `json:"recipe_revision,omitempty"`
	// Dockerfile builds: see Template; Layer is the key of the build's
	// last step.
	From         string   `json:"from,omitempty"`
	Layer        string   `json:"layer,omitempty"`
	Workdir      string   `json:"workdir,omitempty"`
	User         string   `json:"user,omitempty"`
	StartCommand []string `json:"startCommand,omitempty"`
	Entrypoint   []string `json:"entrypoint,omitempty"`
	Cmd          []string `json:"cmd,omitempty"`
	ReadyCommand []string `json:"readyCommand,omitempty"`
}

// Registry is a directory of templates. Its methods are safe for concurrent
// use, also across processes: builds of one name are serialized with a lock
// file.
type Registry struct {
	dir string

	// Mirror is the Debian mirror used by Build; "" means the host's (see
	// HostMirror).
	Mirror string
	// Debootstrap is the debootstrap program; "" means "debootstrap" from
	// PATH, falling back to /usr/sbin/debootstrap.
	Debootstrap string
	// RunCommand runs the host commands of Build and EnsureBuilt
	// (debootstrap's first stage, cp, the build network's ip and nft) to
	// their end; nil means cmd.Run. A server passes its reaper's Run, so
	// that its child subreaper does not take their exit statuses.
	RunCommand RunFunc
	// Runtime runs the built-in recipes' steps that run the rootfs's own
	// programs (debootstrap's second stage, apt-get and the packages'
	// scripts, useradd, npm, the checks), each a container on the build
	// network BuildNetwork, as Dockerfile RUN steps run. Build and
	// EnsureBuilt of a built-in template fail without it.
	Runtime      runtime.Runner
	BuildNetwork BuildNetwork
	// SeedMaxAge, when positive, lets a build of a built-in template start
	// from the debootstrapped tree an earlier build left (seed_linux.go)
	// if that tree is younger than this, instead of running debootstrap
	// again: every built-in recipe debootstraps the same suite and
	// packages, so `make templates` runs it once, not once per template.
	SeedMaxAge time.Duration

	// Of a project's registry (see Project): the top registry, holding
	// the built-in templates, and the project.
	parent  *Registry
	project string
}

// NewRegistry returns the registry kept in dir (e.g.
// /var/cache/lizard/templates). The directory is created on the first build;
// a missing directory is an empty registry.
func NewRegistry(dir string) *Registry {
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	return &Registry{dir: filepath.Clean(dir)}
}

// Dir returns the registry's directory (absolute).
func (r *Registry) Dir() string { return r.dir }

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// validName reports whether name can be a template directory: it must not
// be able to escape the registry or clash with its hidden entries.
func validName(name string) bool { return nameRE.MatchString(name) }

func notFound(name string, why string) error {
	if why != "" {
		return errdefs.WithCode(CodeNotFound, fmt.Errorf("template %q (%s): %w", name, why, errdefs.ErrNotFound))
	}
	return errdefs.WithCode(CodeNotFound, fmt.Errorf("template %q: %w", name, errdefs.ErrNotFound))
}

// versionsDir is the registry's subdirectory holding the versions.
const versionsDir = ".v"

// Get returns the current version of the built template name, which may be
// an alias (the template returned has its real name). A name that was
// never built, whose build has not finished, or that is not a valid name is
// an error wrapping errdefs.ErrNotFound with code "template_not_found".
func (r *Registry) Get(name string) (Template, error) {
	name = Resolve(name)
	if d, ok := derived[name]; ok {
		return r.getDerived(name, d)
	}
	if !validName(name) {
		return Template{}, notFound(name, "")
	}
	return r.read(name, filepath.Join(r.dir, name))
}

// read is readTemplate for a template of r's project.
func (r *Registry) read(name, dir string) (Template, error) {
	t, err := readTemplate(name, dir)
	if err != nil {
		return Template{}, err
	}
	t.Project = r.project
	return t, nil
}

// readTemplate reads template name from dir: <dir>/<name> (a link to a
// version, or a directory of the older layout) or a version directory.
// dir's symbolic links are resolved once, first, so that the metadata and
// the rootfs come from one version even while the name is switched.
func readTemplate(name, dir string) (Template, error) {
	vdir, err := filepath.EvalSymlinks(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return Template{}, notFound(name, "")
	}
	if err != nil {
		return Template{}, fmt.Errorf("template %q: %w", name, err)
	}
	if st, err := os.Stat(vdir); err != nil || !st.IsDir() {
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return Template{}, fmt.Errorf("template %q: %w", name, err)
		}
		return Template{}, notFound(name, "")
	}
	m, err := readMetadata(name, vdir)
	if err != nil {
		return Template{}, err
	}
	rootfs := filepath.Join(vdir, rootfsDir)
	st, err := os.Lstat(rootfs)
	if err != nil || !st.IsDir() {
		return Template{}, notFound(name, "rootfs missing")
	}
	return Template{
		Name:      name,
		Version:   m.Version,
		Digest:    m.Digest,
		Rootfs:    rootfs,
		SizeBytes: m.SizeBytes,
		BuiltAt:   m.BuiltAt,
		Env:       m.Env,
		Aliases:   AliasesOf(name),
		Versions:  m.Versions,

		From:         m.From,
		Workdir:      m.Workdir,
		User:         m.User,
		StartCommand: m.StartCommand,
		Entrypoint:   m.Entrypoint,
		Cmd:          m.Cmd,
		ReadyCommand: m.ReadyCommand,
	}, nil
}

// recipeChanged says whether built-in template name's current version was
// built from another package list or at another Revision than its
// recipe's: a recipe that gains packages (and the steps that come with
// them) or changes what its steps write is built again by EnsureBuilt, so
// a machine that keeps its templates does not go on with the old ones.
// Templates without a recipe, and versions whose list cannot be read, are
// taken as current.
func (r *Registry) recipeChanged(name string) bool {
	rec, ok := builtins[name]
	if !ok || r.project != "" {
		return false
	}
	vdir, err := filepath.EvalSymlinks(filepath.Join(r.dir, name))
	if err != nil {
		return false
	}
	m, err := readMetadata(name, vdir)
	if err != nil || len(m.Packages) == 0 {
		return false
	}
	return !slices.Equal(m.Packages, rec.allPackages()) || m.Revision != rec.Revision
}

// readMetadata reads vdir/template.json of template name.
func readMetadata(name, vdir string) (metadata, error) {
	b, err := os.ReadFile(filepath.Join(vdir, metadataFile))
	if errors.Is(err, fs.ErrNotExist) {
		return metadata{}, notFound(name, "")
	}
	if err != nil {
		return metadata{}, fmt.Errorf("template %q: %w", name, err)
	}
	var m metadata
	if err := json.Unmarshal(b, &m); err != nil {
		return metadata{}, fmt.Errorf("template %q: corrupt %s: %v: %w", name, metadataFile, err, errdefs.ErrUnavailable)
	}
	return m, nil
}

// List returns the current versions of the built templates sorted by name.
// Unfinished builds and entries that are not templates are left out, and
// so are the registry's hidden entries (.v, .build-*, .link-*, .lock-*,
// .layers, ...), whose names are not valid template names.
func (r *Registry) List() ([]Template, error) {
	ents, err := os.ReadDir(r.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return []Template{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list templates: %w", err)
	}
	out := []Template{}
	for _, e := range ents {
		linkOrDir := e.IsDir() || e.Type()&fs.ModeSymlink != 0
		if !linkOrDir || !validName(e.Name()) || Resolve(e.Name()) != e.Name() {
			continue
		}
		if _, ok := derived[e.Name()]; ok {
			continue // a directory in the way of a derived template
		}
		t, err := r.Get(e.Name())
		if err != nil {
			continue // unfinished, broken or not a template
		}
		out = append(out, t)
	}
	out = withDerived(out)
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Builtins returns the names of the templates Build can build, sorted.
func (r *Registry) Builtins() []string {
	names := make([]string, 0, len(builtins)+len(derived))
	for n := range builtins {
		names = append(names, n)
	}
	for n := range derived {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func (r *Registry) notBuiltin(name string) error {
	return errdefs.WithCode(CodeNotFound, fmt.Errorf("template %q is not a built-in template (can build: %s): %w",
		name, strings.Join(r.Builtins(), ", "), errdefs.ErrNotFound))
}

// EnsureBuilt returns template name (or alias), building it first when it is
// missing.
// Progress of a build is written to progress (may be nil).
func (r *Registry) EnsureBuilt(ctx context.Context, name string, progress io.Writer) (Template, error) {
	name = Resolve(name)
	if t, err := r.Get(name); err == nil {
		if !r.recipeChanged(name) {
			return t, nil
		}
		if progress != nil {
			fmt.Fprintf(progress, "[%s] the recipe changed since %s: building it again\n", name, t.Version)
		}
		return r.Build(ctx, name, progress)
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return Template{}, err
	}
	if d, ok := derived[name]; ok {
		return r.buildDerived(ctx, name, d, progress, true)
	}
	if _, ok := builtins[name]; !ok {
		return Template{}, r.notBuiltin(name)
	}
	return r.build(ctx, name, progress, true)
}

// Build builds the built-in template name or alias (see Builtins) as a new
// version of it, which becomes the current one only once it is complete;
// the version it replaces stays until Prune removes it. Builds need root
// and debootstrap. Progress is written to progress (may be nil). A failed or
// cancelled build leaves nothing behind.
func (r *Registry) Build(ctx context.Context, name string, progress io.Writer) (Template, error) {
	name = Resolve(name)
	if d, ok := derived[name]; ok {
		return r.buildDerived(ctx, name, d, progress, false)
	}
	if _, ok := builtins[name]; !ok {
		return Template{}, r.notBuiltin(name)
	}
	return r.build(ctx, name, progress, false)
}

// writeMetadata writes dir/template.json atomically.
func writeMetadata(dir string, m metadata) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	tmp := filepath.Join(dir, metadataFile+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, metadataFile))
}
