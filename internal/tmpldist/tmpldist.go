// Package tmpldist makes template versions available on every node of a
// cluster through the object store (--object-store): a node that builds a
// template (built-in or Dockerfile, through the CLI or the API) publishes
// the version, an archive of its directory stored as a durable image named
// by its content digest, and records it as the name's current version in
// the store (store.TemplateVersions, per project); a node asked for a
// template it lacks, or holds an older version of, fetches the version on
// first use, verifies it against its digest (template.AdoptVersion) and
// keeps it in a cache bounded in size (--template-cache-gb), evicting the
// least recently used versions that no sandbox, paused sandbox or snapshot
// of the node uses. Dist stands in front of the registry for the sandbox
// service, the API and E2B's control plane: lookups fetch, lists show the
// project's templates however many nodes hold them.
//
// Without an object store, Dist is the registry.
package tmpldist

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/lizard-build/lizard/internal/durable"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/template"
)

// archiveFile is the one file of a published version's image: a tar of
// the version directory (rootfs, template.json, manifest) with owners,
// modes, devices, hard links and extended attributes.
const archiveFile = "version.tar"

// CodeCorrupt is the API code of a fetched version that is not what its
// digest says (as durable's corrupt objects).
const CodeCorrupt = "corrupt_object"

// Timeouts: what a database look-up and a fetch may take.
const (
	recordTimeout = 10 * time.Second
	fetchTimeout  = 30 * time.Minute
)

// Config wires a Dist.
type Config struct {
	Registry *template.Registry
	// Images is the object store's images; nil: no object store (Dist is
	// the registry).
	Images *durable.Images
	// Records is where published versions are recorded.
	Records store.TemplateVersions
	// Projects lists the ids of every project (Collect reads their
	// records).
	Projects func(context.Context) ([]string, error)
	// Node names this node in the records.
	Node string
	// Dir is Dist's own directory (the cache index, archives on their
	// way), on the data disk.
	Dir string
	// CacheBytes bounds the fetched versions kept (0: no bound).
	CacheBytes int64
	// Run runs tar to its end (the server's reaper); nil: cmd.Run.
	Run    func(*exec.Cmd) error
	Logger *slog.Logger
}

// Dist is the registry as the cluster shares it. Its methods are safe for
// concurrent use.
type Dist struct {
	cfg     Config
	log     *slog.Logger
	cache   *cache
	started time.Time

	inUse func(rootfs string) bool // set by SetInUse

	mu      sync.Mutex
	fetches map[string]*fetch // by project/name@digest
	// publishing holds the images being published, each closed when its
	// publish ends (publishTurn).
	publishing map[string]chan struct{}

	// seen holds the versions PublishNew found published (by
	// project/name@digest): not asked about again until it is emptied,
	// every seenFor calls (a record deleted meanwhile is seen then).
	seen      map[string]bool
	seenCalls int
}

const seenFor = 30

type fetch struct {
	done chan struct{}
	t    template.Template
	err  error
}

// New returns the Dist of cfg.
func New(cfg Config) (*Dist, error) {
	d := &Dist{cfg: cfg, log: cfg.Logger, started: time.Now(), fetches: map[string]*fetch{}, publishing: map[string]chan struct{}{}, seen: map[string]bool{}}
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	if cfg.Run == nil {
		d.cfg.Run = (*exec.Cmd).Run
	}
	if cfg.Images == nil {
		return d, nil
	}
	if cfg.Records == nil {
		return nil, fmt.Errorf("templates in the object store: the store cannot record template versions: %w", errdefs.ErrInvalid)
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, err
	}
	// Archives of an earlier process that died on the way.
	if old, _ := filepath.Glob(filepath.Join(cfg.Dir, "work-*")); len(old) > 0 {
		for _, o := range old {
			os.RemoveAll(o)
		}
	}
	c, err := openCache(filepath.Join(cfg.Dir, "cache.json"), cfg.CacheBytes)
	if err != nil {
		return nil, fmt.Errorf("template cache: %w", err)
	}
	d.cache = c
	return d, nil
}

// Enabled reports whether templates go through the object store.
func (d *Dist) Enabled() bool { return d.cfg.Images != nil }

// SetInUse gives Dist the sandbox service's test of a rootfs in use, which
// eviction honours; until then nothing is evicted.
func (d *Dist) SetInUse(inUse func(rootfs string) bool) {
	d.mu.Lock()
	d.inUse = inUse
	d.mu.Unlock()
}

// recordKey is the (project, name) a template's record has: built-in
// templates are recorded once for every project.
func recordKey(project, name string) (string, string) {
	if template.IsBuiltin(name) {
		return "", template.Resolve(name)
	}
	return project, name
}

// imageName names a version's image: by its digest and name.
func imageName(name, digest string) string {
	return "templates/" + strings.Replace(digest, ":", "-", 1) + "/" + name
}

// Lookup returns template name as project sees it (see
// template.Registry.Lookup). With an object store, a template this node
// does not hold, or holds an older version of than the one published, is
// fetched first; a built-in template the node holds is its own.
func (d *Dist) Lookup(project, name string) (template.Template, error) {
	local, lerr := d.cfg.Registry.Lookup(project, name)
	if !d.Enabled() || template.NeedsCodeInterpreter(template.Resolve(name)) {
		return local, lerr
	}
	if lerr != nil && !errors.Is(lerr, errdefs.ErrNotFound) {
		return local, lerr
	}
	builtin := template.IsBuiltin(name)
	if builtin && lerr == nil {
		return local, nil
	}
	rp, rn := recordKey(project, name)
	ctx, cancel := context.WithTimeout(context.Background(), recordTimeout)
	rec, err := d.cfg.Records.TemplateVersion(ctx, rp, rn)
	cancel()
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
		if lerr == nil && d.cache.has(dirOf(local.Rootfs)) {
			// Fetched here, and no longer published: deleted through
			// another node.
			return template.Template{}, errdefs.WithCode(template.CodeNotFound, fmt.Errorf("template %q (deleted): %w", name, errdefs.ErrNotFound))
		}
		return local, lerr
	case err != nil:
		if lerr == nil {
			d.log.Warn("templates: published versions unknown; using this node's", "template", name, "err", err)
			return local, nil
		}
		return template.Template{}, fmt.Errorf("template %q: not on this node, and its published version is unknown: %w", name, errors.Join(err, errdefs.ErrUnavailable))
	}
	// This node's own is current, or a newer build not published yet.
	if lerr == nil && (local.Digest == rec.Digest || (!d.cache.has(dirOf(local.Rootfs)) && local.BuiltAt.After(rec.UpdatedAt))) {
		d.cache.touch(dirOf(local.Rootfs), time.Now())
		return local, nil
	}
	t, err := d.fetch(rp, rn, rec, true)
	if err != nil {
		return template.Template{}, err
	}
	if builtin {
		return d.cfg.Registry.Lookup(project, name) // aliases
	}
	return t, nil
}

// LookupVersion returns the version with digest of template name (not an
// alias) as project sees it, current or not, for a sandbox or snapshot
// recorded on it that moves to this node: this node's copy, or, with an
// object store, the copy the node that built it published, fetched and
// verified and placed beside the current version, which stays current
// (template.AddVersion), in the cache. errdefs.ErrNotFound: this node
// holds none and no node published it (a built-in template every node
// builds for itself).
func (d *Dist) LookupVersion(project, name, digest string) (template.Template, error) {
	t, err := d.cfg.Registry.LookupVersion(project, name, digest)
	if !d.Enabled() {
		return t, err
	}
	if err == nil {
		d.cache.touch(dirOf(t.Rootfs), time.Now())
		return t, nil
	}
	if !errors.Is(err, errdefs.ErrNotFound) {
		return t, err
	}
	rp, rn := recordKey(project, name)
	ctx, cancel := context.WithTimeout(context.Background(), recordTimeout)
	_, serr := d.cfg.Images.Stat(ctx, imageName(rn, digest))
	cancel()
	if serr != nil {
		return template.Template{}, fmt.Errorf("template %q version %s: not on this node, nor in the object store: %w", name, digest, serr)
	}
	return d.fetch(rp, rn, store.TemplateVersion{ProjectID: rp, Name: rn, Digest: digest}, false)
}

// fetch brings version rec of project's template name to this node, once
// however many creates ask at a time, and makes it the current version if
// current (else it is placed beside it).
func (d *Dist) fetch(project, name string, rec store.TemplateVersion, current bool) (template.Template, error) {
	key := project + "/" + name + "@" + rec.Digest
	if !current {
		key += " beside"
	}
	d.mu.Lock()
	f, ok := d.fetches[key]
	if !ok {
		f = &fetch{done: make(chan struct{})}
		d.fetches[key] = f
		go func() {
			f.t, f.err = d.doFetch(project, name, rec, current)
			d.mu.Lock()
			delete(d.fetches, key)
			d.mu.Unlock()
			close(f.done)
		}()
	}
	d.mu.Unlock()
	<-f.done
	return f.t, f.err
}

func (d *Dist) doFetch(project, name string, rec store.TemplateVersion, current bool) (template.Template, error) {
	reg, err := d.cfg.Registry.For(project, name)
	if err != nil {
		return template.Template{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), fetchTimeout)
	defer cancel()
	start := time.Now()
	img := imageName(name, rec.Digest)
	d.log.Info("templates: fetching a version published by another node", "project", project, "template", name, "digest", rec.Digest, "node", rec.Node, "current", current)
	place := reg.AdoptVersion
	if !current {
		place = reg.AddVersion
	}
	t, err := place(ctx, name, rec.Digest, func(dir string) error {
		// The archive streams from the object store into tar, never on
		// disk whole; a corrupt chunk stops it, and place throws dir away.
		pr, pw := io.Pipe()
		streamed := make(chan error, 1)
		go func() {
			err := d.cfg.Images.Stream(ctx, img, archiveFile, pw)
			pw.CloseWithError(err)
			streamed <- err
		}()
		err := d.tar("extract", "-", dir, pr)
		if err == nil {
			// What tar left unread after its end-of-archive blocks: the
			// stream checks the file's digest at its end.
			io.Copy(io.Discard, pr)
		}
		pr.CloseWithError(errTarStopped) // unblocks the stream when tar failed
		if serr := <-streamed; serr != nil && !errors.Is(serr, errTarStopped) {
			return serr // the stream's error, which tar saw as a read error
		}
		return err
	})
	if errors.Is(err, errdefs.ErrInvalid) {
		// The archive was whole (its digests matched) but is not the
		// version it names.
		err = errdefs.WithCode(CodeCorrupt, fmt.Errorf("template %q version %s from the object store (%s) is not that version: %v; it is not used: %w",
			name, rec.Digest, img, err, errdefs.ErrConflict))
	}
	if err != nil {
		d.log.Error("templates: fetch failed", "project", project, "template", name, "digest", rec.Digest, "err", err)
		return template.Template{}, fmt.Errorf("fetch template %q: %w", name, err)
	}
	dir := dirOf(t.Rootfs)
	if err := d.cache.add(cacheEntry{Project: project, Name: t.Name, Dir: dir, Size: t.SizeBytes, LastUsed: time.Now()}); err != nil {
		d.log.Warn("templates: write the cache index", "err", err)
	}
	d.log.Info("templates: fetched", "project", project, "template", name, "digest", rec.Digest, "took", time.Since(start).Round(time.Millisecond))
	d.Evict(dir)
	return t, nil
}

// Evict evicts fetched versions, least recently used first, while they
// take more than the cache's bound; keep (a version directory) stays.
func (d *Dist) Evict(keep string) {
	if !d.Enabled() {
		return
	}
	d.mu.Lock()
	inUse := d.inUse
	d.mu.Unlock()
	if inUse == nil {
		return
	}
	gone, err := d.cache.evict(keep, func(e cacheEntry) (bool, error) {
		reg, err := d.cfg.Registry.For(e.Project, e.Name)
		if err != nil {
			return false, err
		}
		return reg.Evict(e.Name, e.Dir, inUse)
	})
	for _, e := range gone {
		d.log.Info("templates: evicted from the cache", "project", e.Project, "template", e.Name, "dir", e.Dir, "size", e.Size)
	}
	if err != nil {
		d.log.Warn("templates: eviction", "err", err)
	}
}

// errTarStopped ends a stream into tar that tar stopped reading (it failed:
// its own error is the one to report).
var errTarStopped = errors.New("tar stopped reading")

// tar runs GNU tar on the version directory dir: op "create" writes
// archive from it, "extract" unpacks into it the archive read from in
// (archive "-"), as root keeping owners, modes, devices, hard links and
// extended attributes.
func (d *Dist) tar(op, archive, dir string, in io.Reader) error {
	args := []string{"--" + op, "--file", archive, "--directory", dir, "--numeric-owner", "--xattrs", "--xattrs-include=*"}
	if op == "create" {
		args = append(args, "rootfs", "template.json", "manifest")
	} else {
		args = append(args, "--same-owner", "--same-permissions")
	}
	cmd := exec.Command("tar", args...)
	cmd.Stdin = in
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := d.cfg.Run(cmd); err != nil {
		return fmt.Errorf("tar --%s %s: %v: %s", op, archive, err, tail(out.String()))
	}
	return nil
}

// tail is the end of a command's output, for an error.
func tail(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 2000 {
		s = "…" + s[len(s)-2000:]
	}
	return s
}

// Publish makes version t durable in the object store (unless it is
// there) and records it as its name's current version.
func (d *Dist) Publish(ctx context.Context, t template.Template) error {
	if !d.Enabled() {
		return nil
	}
	if t.Digest == "" {
		return fmt.Errorf("publish template %q: its version has no digest (made before digests; rebuild it): %w", t.Name, errdefs.ErrInvalid)
	}
	img := imageName(t.Name, t.Digest)
	release, err := d.publishTurn(ctx, img)
	if err != nil {
		return fmt.Errorf("publish template %q: %w", t.Name, err)
	}
	defer release()
	if _, err := d.cfg.Images.Stat(ctx, img); errors.Is(err, errdefs.ErrNotFound) {
		work, err := os.MkdirTemp(d.cfg.Dir, "work-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(work)
		if err := d.tar("create", filepath.Join(work, archiveFile), dirOf(t.Rootfs), nil); err != nil {
			return fmt.Errorf("publish template %q: %w", t.Name, err)
		}
		if _, err := d.cfg.Images.Upload(ctx, img, work); err != nil {
			return fmt.Errorf("publish template %q: %w", t.Name, err)
		}
	} else if err != nil {
		return fmt.Errorf("publish template %q: %w", t.Name, err)
	}
	info := t
	info.Rootfs, info.Aliases = "", nil
	b, err := json.Marshal(info)
	if err != nil {
		return err
	}
	rp, rn := recordKey(t.Project, t.Name)
	if err := d.cfg.Records.PutTemplateVersion(ctx, store.TemplateVersion{
		ProjectID: rp, Name: rn, Digest: t.Digest, Info: b, Node: d.cfg.Node, UpdatedAt: time.Now().UTC(),
	}); err != nil {
		return fmt.Errorf("publish template %q: record: %w", t.Name, err)
	}
	d.log.Info("templates: published", "project", t.Project, "template", t.Name, "digest", t.Digest, "image", img)
	return nil
}

// publishTurn waits until no other Publish of image img runs on this node
// and holds img's turn until release: a version published twice at once
// (by its build and by the template loop) is archived and uploaded once,
// and the second publish finds it in the store. (Two at once uploaded it
// twice, the second writing its blobs again after the first had recorded
// the version, while other nodes fetched it.)
func (d *Dist) publishTurn(ctx context.Context, img string) (release func(), err error) {
	for {
		d.mu.Lock()
		busy, ok := d.publishing[img]
		if !ok {
			mine := make(chan struct{})
			d.publishing[img] = mine
			d.mu.Unlock()
			return func() {
				d.mu.Lock()
				delete(d.publishing, img)
				d.mu.Unlock()
				close(mine)
			}, nil
		}
		d.mu.Unlock()
		select {
		case <-busy:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// PublishNew publishes what was built on this node and is not published:
// a project's template with no record, or a newer build than the record's;
// a built-in template with no record that was built while this process
// ran (built-in templates a node had before it started are its own: every
// node builds them). Fetched versions are never published again. One
// caller at a time (the server's template loop).
func (d *Dist) PublishNew(ctx context.Context) {
	if !d.Enabled() {
		return
	}
	if d.seenCalls++; d.seenCalls%seenFor == 0 {
		clear(d.seen)
	}
	ts, err := d.cfg.Registry.ListAll()
	if err != nil {
		d.log.Warn("templates: list to publish", "err", err)
		return
	}
	for _, t := range ts {
		if t.Digest == "" || t.OnDemand || d.cache.has(dirOf(t.Rootfs)) {
			continue
		}
		rp, rn := recordKey(t.Project, t.Name)
		key := rp + "/" + rn + "@" + t.Digest
		if d.seen[key] {
			continue
		}
		rec, err := d.cfg.Records.TemplateVersion(ctx, rp, rn)
		if err == nil && rec.Digest == t.Digest {
			d.seen[key] = true
		}
		switch {
		case errors.Is(err, errdefs.ErrNotFound):
			if rp == "" && !t.BuiltAt.After(d.started) {
				continue
			}
		case err != nil:
			d.log.Warn("templates: published versions unknown", "err", err)
			return
		case rec.Digest == t.Digest || !t.BuiltAt.After(rec.UpdatedAt) || rp == "":
			continue
		}
		if err := d.Publish(ctx, t); err != nil {
			d.log.Error("templates: publish", "project", t.Project, "template", t.Name, "err", err)
			continue
		}
		d.seen[key] = true
	}
}

// ListFor returns the templates project sees: those of this node (see
// template.Registry.ListFor) and, with an object store, those published
// by any node, as their records describe them.
func (d *Dist) ListFor(project string) ([]template.Template, error) {
	local, err := d.cfg.Registry.ListFor(project)
	if err != nil || !d.Enabled() {
		return local, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), recordTimeout)
	defer cancel()
	recs, err := d.cfg.Records.TemplateVersions(ctx, project)
	var builtins []store.TemplateVersion
	if err == nil {
		builtins, err = d.cfg.Records.TemplateVersions(ctx, "")
	}
	if err != nil {
		d.log.Warn("templates: published versions unknown; listing this node's", "err", err)
		return local, nil
	}
	recs = append(recs, builtins...)
	published := map[string]store.TemplateVersion{}
	for _, r := range recs {
		published[r.Name] = r
	}
	out := make([]template.Template, 0, len(local)+len(recs))
	seen := map[string]bool{}
	for _, t := range local {
		_, ok := published[t.Name]
		if t.Project != "" && !ok && d.cache.has(dirOf(t.Rootfs)) {
			continue // fetched, and deleted through another node
		}
		out = append(out, t)
		seen[t.Name] = true
	}
	for _, r := range recs {
		if seen[r.Name] {
			continue
		}
		var t template.Template
		if err := json.Unmarshal(r.Info, &t); err != nil {
			d.log.Warn("templates: unreadable record", "template", r.Name, "err", err)
			continue
		}
		t.Name, t.Project, t.Digest, t.Rootfs = r.Name, r.ProjectID, r.Digest, ""
		out = append(out, t)
	}
	return out, nil
}

// Builtins returns the names of the built-in templates.
func (d *Dist) Builtins() []string { return d.cfg.Registry.Builtins() }

// Delete removes project's template name on this node and, with an object
// store, its record, so that no node lists or fetches it any more (nodes
// that fetched it drop it on their next look-up). Its objects stay until
// Collect finds no sandbox or snapshot made on them.
func (d *Dist) Delete(ctx context.Context, project, name string) error {
	lerr := d.cfg.Registry.Delete(ctx, project, name)
	if !d.Enabled() || template.IsBuiltin(name) {
		return lerr
	}
	if lerr != nil && !errors.Is(lerr, errdefs.ErrNotFound) {
		return lerr
	}
	_, err := d.cfg.Records.TemplateVersion(ctx, project, name)
	if errors.Is(err, errdefs.ErrNotFound) {
		return lerr
	}
	if err != nil {
		return err
	}
	return d.cfg.Records.DeleteTemplateVersion(ctx, project, name)
}

// CollectGrace is how long a published version is kept however unused: a
// publish uploads the image before it records it.
const CollectGrace = time.Hour

// Collect deletes from the object store the published versions nothing
// may need any more: a version is kept while it is the current version of
// a template of any project (its record), while used names it (the
// version directories, <name>@sha256-<hex>, that the cluster's sandbox
// and snapshot records were made on: a paused sandbox or a snapshot that
// moves to another node fetches its version by its digest), and for grace
// after it was published. used is read after the records, so that a
// version that stopped being current meanwhile is seen in use by the
// sandboxes made on it. Every node may run it; it is idempotent. It
// returns the images deleted.
func (d *Dist) Collect(ctx context.Context, used func(context.Context) (map[string]bool, error), grace time.Duration) ([]string, error) {
	if !d.Enabled() {
		return nil, nil
	}
	if d.cfg.Projects == nil {
		return nil, fmt.Errorf("collect template versions: no project list: %w", errdefs.ErrInvalid)
	}
	keep := map[string]bool{}
	projects, err := d.cfg.Projects(ctx)
	if err != nil {
		return nil, fmt.Errorf("collect template versions: %w", err)
	}
	for _, p := range append([]string{""}, projects...) {
		recs, err := d.cfg.Records.TemplateVersions(ctx, p)
		if err != nil {
			return nil, fmt.Errorf("collect template versions: %w", err)
		}
		for _, r := range recs {
			keep[imageName(r.Name, r.Digest)] = true
		}
	}
	inUse, err := used(ctx)
	if err != nil {
		return nil, fmt.Errorf("collect template versions: %w", err)
	}
	var unused []string
	now := time.Now()
	err = d.cfg.Images.List(ctx, "templates/", func(name string, written time.Time) error {
		// templates/sha256-<hex>/<name> is version directory <name>@sha256-<hex>.
		parts := strings.Split(name, "/")
		if len(parts) != 3 {
			return nil // not a version's image: leave it
		}
		if keep[name] || inUse[parts[2]+"@"+parts[1]] || now.Sub(written) < grace {
			return nil
		}
		unused = append(unused, name)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("collect template versions: %w", err)
	}
	var deleted []string
	for _, name := range unused {
		if err := d.cfg.Images.Delete(ctx, name); err != nil {
			return deleted, fmt.Errorf("collect template versions: %w", err)
		}
		d.log.Info("templates: deleted a published version nothing uses", "image", name)
		deleted = append(deleted, name)
	}
	return deleted, nil
}
