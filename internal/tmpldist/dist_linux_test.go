//go:build linux

package tmpldist

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/durable"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/objstore/s3"
	"github.com/lizard-build/lizard/internal/objstore/vgwtest"
	"github.com/lizard-build/lizard/internal/runtime"
	"github.com/lizard-build/lizard/internal/slowness"
	"github.com/lizard-build/lizard/internal/store/sqlite"
	"github.com/lizard-build/lizard/internal/template"
	"github.com/lizard-build/lizard/internal/template/ocitest"
)

// noRun is the runtime of builds without RUN steps: it is never asked to
// run anything.
type noRun struct{}

func (noRun) Run(context.Context, runtime.RunSpec) (int, error) {
	return 0, errors.New("this build has no RUN step")
}

// fixture is what a test of two nodes' Dists shares: a registry of OCI
// images holding busybox (ref), an object store (versitygw), a database.
type fixture struct {
	db      *sqlite.Store
	images  *durable.Images
	policy  *template.PullPolicy
	ref     string
	project string
}

func newFixture(t *testing.T) fixture {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root (Dockerfile builds, tar keeping owners)")
	}
	host := ocitest.Registry(t)
	ref := host + "/lizard/busybox:1"
	ocitest.PushBusybox(t, ref)
	policy, err := template.NewPullPolicy([]string{host}, "")
	if err != nil {
		t.Fatal(err)
	}
	gw := vgwtest.New(t)
	gw.SetEnv(t)
	obj, err := s3.Open(gw.URL("dist"))
	if err != nil {
		t.Fatal(err)
	}
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "lizard.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return fixture{db: db, images: durable.New(obj, nil), policy: policy, ref: ref, project: "prj_dist"}
}

// build builds project's template name in reg FROM busybox with env.
func (fx fixture) build(t *testing.T, reg *template.Registry, name, env string) template.Template {
	t.Helper()
	p, err := reg.Project(fx.project)
	if err != nil {
		t.Fatal(err)
	}
	built, err := p.BuildDockerfile(context.Background(), name, template.DockerfileOptions{
		Dockerfile: []byte("FROM " + fx.ref + "\nENV " + env + "\n"), DockerfileName: "Dockerfile", Context: t.TempDir(),
		Runtime: noRun{}, Pull: fx.policy,
	}, io.Discard)
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	return built
}

// TestPublishFetch: a template built on node a without the API (as the
// CLI does) is published by a's template loop; node b, with a registry of
// its own, lists it before it holds it, fetches it on its first look-up
// (the same digest and files, a version that verifies), never publishes
// its copy, evicts it once over its cache bound, and fetches it again; a
// delete through a makes b drop it.
func TestPublishFetch(t *testing.T) {
	ctx := context.Background()
	fx := newFixture(t)
	db, images, project := fx.db, fx.images, fx.project

	regA := template.NewRegistry(t.TempDir())
	built := fx.build(t, regA, "web", "HELLO=world")
	a, err := New(Config{Registry: regA, Images: images, Records: db, Node: "a", Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	a.PublishNew(ctx)
	rec, err := db.TemplateVersion(ctx, project, "web")
	if err != nil || rec.Digest != built.Digest || rec.Node != "a" {
		t.Fatalf("record after a's loop: %+v %v, want digest %s from a", rec, err, built.Digest)
	}

	regB := template.NewRegistry(t.TempDir())
	b, err := New(Config{Registry: regB, Images: images, Records: db, Node: "b", Dir: t.TempDir(), CacheBytes: 1})
	if err != nil {
		t.Fatal(err)
	}
	b.SetInUse(func(string) bool { return false })
	list, err := b.ListFor(project)
	if err != nil || !listed(list, "web") {
		t.Fatalf("b's list before it holds web: %v %v", names(list), err)
	}
	fetchOnce := func() template.Template {
		t.Helper()
		got, err := b.Lookup(project, "web")
		if err != nil {
			t.Fatalf("lookup on b: %v", err)
		}
		if got.Digest != built.Digest || !strings.HasPrefix(got.Rootfs, regB.Dir()) || !slices.Contains(got.Env, "HELLO=world") {
			t.Fatalf("fetched %+v, want digest %s in b's registry with HELLO=world", got, built.Digest)
		}
		if _, err := template.VerifyVersion(filepath.Dir(got.Rootfs)); err != nil {
			t.Fatalf("fetched version does not verify: %v", err)
		}
		if g, err := os.ReadFile(filepath.Join(got.Rootfs, "etc", "greeting")); err != nil || string(g) != "from layer two\n" {
			t.Fatalf("fetched rootfs: %q %v", g, err)
		}
		return got
	}
	got := fetchOnce()
	b.PublishNew(ctx)
	if rec, _ := db.TemplateVersion(ctx, project, "web"); rec.Node != "a" {
		t.Fatalf("b published its fetched copy: %+v", rec)
	}
	// Over the bound (1 byte) and not in use: evicted, name and version.
	b.Evict("")
	if _, err := regB.Lookup(project, "web"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("b's registry after eviction: %v, want not found", err)
	}
	if _, err := os.Stat(filepath.Dir(got.Rootfs)); !os.IsNotExist(err) {
		t.Fatalf("evicted version still there: %v", err)
	}
	fetchOnce()

	// A newer build on a (another ENV) is published; b's look-up gets it.
	rebuilt := fx.build(t, regA, "web", "HELLO=again")
	if err := a.Publish(ctx, rebuilt); err != nil {
		t.Fatal(err)
	}
	cur, err := b.Lookup(project, "web")
	if err != nil || cur.Digest != rebuilt.Digest {
		t.Fatalf("b after a rebuild on a: %+v %v, want digest %s", cur, err, rebuilt.Digest)
	}

	// The older version, for a sandbox recorded on it that moves to b:
	// fetched (b evicted its copy) and placed beside the current one,
	// which stays current; a version no node published is not found.
	b.SetInUse(func(rootfs string) bool { return rootfs == cur.Rootfs })
	if _, err := regB.LookupVersion(project, "web", built.Digest); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("b holds the old version before it is asked for: %v", err)
	}
	old, err := b.LookupVersion(project, "web", built.Digest)
	if err != nil || old.Digest != built.Digest || !strings.HasPrefix(old.Rootfs, regB.Dir()) || !slices.Contains(old.Env, "HELLO=world") {
		t.Fatalf("old version on b: %+v %v, want digest %s in b's registry with HELLO=world", old, err, built.Digest)
	}
	if _, err := template.VerifyVersion(filepath.Dir(old.Rootfs)); err != nil {
		t.Fatalf("fetched old version does not verify: %v", err)
	}
	if got, err := regB.Lookup(project, "web"); err != nil || got.Digest != rebuilt.Digest {
		t.Fatalf("b's current version after the old one was fetched: %+v %v, want %s", got, err, rebuilt.Digest)
	}
	if again, err := b.LookupVersion(project, "web", built.Digest); err != nil || again.Rootfs != old.Rootfs {
		t.Fatalf("old version asked again: %+v %v, want b's copy %s", again, err, old.Rootfs)
	}
	if _, err := b.LookupVersion(project, "web", "sha256:"+strings.Repeat("0", 64)); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("a version no node published: %v, want not found", err)
	}
	pb, err := regB.Project(project)
	if err != nil {
		t.Fatal(err)
	}
	if removed, err := pb.Prune(func(string) bool { return false }); err != nil || !slices.Contains(removed, filepath.Dir(old.Rootfs)) {
		t.Fatalf("prune on b: removed %v %v, want the old version %s (current: %s)", removed, err, filepath.Dir(old.Rootfs), cur.Rootfs)
	}

	// Deleted through a: b no longer lists it nor finds it.
	if err := a.Delete(ctx, project, "web"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Lookup(project, "web"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("b after a delete through a: %v, want not found", err)
	}
	if list, err := b.ListFor(project); err != nil || listed(list, "web") {
		t.Fatalf("b's list after the delete: %v %v", names(list), err)
	}
}

// TestPublishOnce: a version published twice at once (its build's publish
// and the template loop's) is archived and uploaded once; the second
// publish finds it in the store. Two uploads at once each wrote their
// blobs again, over whatever the store held by then.
func TestPublishOnce(t *testing.T) {
	ctx := context.Background()
	fx := newFixture(t)
	reg := template.NewRegistry(t.TempDir())
	built := fx.build(t, reg, "web", "HELLO=world")
	var a *Dist
	var creates atomic.Int32
	second := make(chan struct{}, 1)
	secondDone := make(chan error, 1)
	run := func(cmd *exec.Cmd) error {
		if slices.Contains(cmd.Args, "--create") {
			if creates.Add(1) == 1 {
				// The first archive waits for the second publish to
				// archive too, which it must not.
				go func() { secondDone <- a.Publish(ctx, built) }()
				select {
				case <-second:
				case <-time.After(slowness.Scale(300 * time.Millisecond)):
				}
			} else {
				second <- struct{}{}
			}
		}
		return cmd.Run()
	}
	a, err := New(Config{Registry: reg, Images: fx.images, Records: fx.db, Node: "a", Dir: t.TempDir(), Run: run})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Publish(ctx, built); err != nil {
		t.Fatalf("first publish: %v", err)
	}
	if err := <-secondDone; err != nil {
		t.Fatalf("second publish: %v", err)
	}
	if n := creates.Load(); n != 1 {
		t.Fatalf("the version was archived %d times, want once", n)
	}
	if rec, err := fx.db.TemplateVersion(ctx, fx.project, "web"); err != nil || rec.Digest != built.Digest {
		t.Fatalf("record: %+v %v", rec, err)
	}
}

func listed(ts []template.Template, name string) bool {
	for _, t := range ts {
		if t.Name == name {
			return true
		}
	}
	return false
}

func names(ts []template.Template) []string {
	var out []string
	for _, t := range ts {
		out = append(out, t.Name)
	}
	return out
}

// TestCollect: of a template's published versions, the current one is
// kept, an older one while a sandbox or snapshot record was made on it or
// for the grace after its publish, and deleted otherwise (its image gone);
// images that are not template versions are left alone.
func TestCollect(t *testing.T) {
	ctx := context.Background()
	fx := newFixture(t)
	projects := func(context.Context) ([]string, error) { return []string{fx.project}, nil }
	reg := template.NewRegistry(t.TempDir())
	d, err := New(Config{Registry: reg, Images: fx.images, Records: fx.db, Node: "a", Dir: t.TempDir(), Projects: projects})
	if err != nil {
		t.Fatal(err)
	}
	old := fx.build(t, reg, "web", "V=1")
	if err := d.Publish(ctx, old); err != nil {
		t.Fatal(err)
	}
	cur := fx.build(t, reg, "web", "V=2")
	if err := d.Publish(ctx, cur); err != nil {
		t.Fatal(err)
	}
	other := t.TempDir()
	if err := os.WriteFile(filepath.Join(other, "f"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := fx.images.Upload(ctx, "sandboxes/sb1", other); err != nil {
		t.Fatal(err)
	}
	oldDir := filepath.Base(filepath.Dir(old.Rootfs))
	exists := func(tt template.Template) bool {
		_, err := fx.images.Stat(ctx, imageName(tt.Name, tt.Digest))
		if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatal(err)
		}
		return err == nil
	}
	for _, tc := range []struct {
		what  string
		used  map[string]bool
		grace time.Duration
		gone  bool
	}{
		{"published within the grace", nil, time.Hour, false},
		{"a record made on it", map[string]bool{oldDir: true}, 0, false},
		{"nothing uses it", nil, 0, true},
	} {
		used := func(context.Context) (map[string]bool, error) { return tc.used, nil }
		deleted, err := d.Collect(ctx, used, tc.grace)
		if err != nil {
			t.Fatalf("%s: %v", tc.what, err)
		}
		if exists(old) == tc.gone || len(deleted) != map[bool]int{true: 1}[tc.gone] {
			t.Fatalf("%s: deleted %v, old version's image there %v; want gone %v", tc.what, deleted, exists(old), tc.gone)
		}
		if !exists(cur) {
			t.Fatalf("%s: the current version's image was deleted", tc.what)
		}
	}
	if _, err := fx.images.Stat(ctx, "sandboxes/sb1"); err != nil {
		t.Fatalf("a pause image after the collection: %v", err)
	}
	// Without a project list, it refuses rather than guess.
	bare, err := New(Config{Registry: reg, Images: fx.images, Records: fx.db, Node: "b", Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bare.Collect(ctx, func(context.Context) (map[string]bool, error) { return nil, nil }, 0); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("collect without a project list: %v, want invalid", err)
	}
}
