//go:build linux

package tmpldist

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lizard-build/lizard/internal/durable"
	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/objstore/s3"
	"github.com/lizard-build/lizard/internal/objstore/vgwtest"
	"github.com/lizard-build/lizard/internal/runtime"
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

// TestPublishFetch: a template built on node a without the API (as the
// CLI does) is published by a's template loop; node b, with a registry of
// its own, lists it before it holds it, fetches it on its first look-up
// (the same digest and files, a version that verifies), never publishes
// its copy, evicts it once over its cache bound, and fetches it again; a
// delete through a makes b drop it.
func TestPublishFetch(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root (Dockerfile builds, tar keeping owners)")
	}
	ctx := context.Background()
	host := ocitest.Registry(t)
	ref := host + "/lizard/busybox:1"
	ocitest.PushBusybox(t, ref)
	policy, err := template.NewPullPolicy([]string{host}, "")
	if err != nil {
		t.Fatal(err)
	}
	gw := vgwtest.New(t)
	for _, e := range gw.Env() {
		k, v, _ := strings.Cut(e, "=")
		t.Setenv(k, v)
	}
	obj, err := s3.Open(gw.URL("dist"))
	if err != nil {
		t.Fatal(err)
	}
	db, err := sqlite.Open(filepath.Join(t.TempDir(), "lizard.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	images := durable.New(obj, nil)
	const project = "prj_dist"

	regA := template.NewRegistry(t.TempDir())
	pa, err := regA.Project(project)
	if err != nil {
		t.Fatal(err)
	}
	built, err := pa.BuildDockerfile(ctx, "web", template.DockerfileOptions{
		Dockerfile: []byte("FROM " + ref + "\nENV HELLO=world\n"), DockerfileName: "Dockerfile", Context: t.TempDir(),
		Runtime: noRun{}, Pull: policy,
	}, io.Discard)
	if err != nil {
		t.Fatalf("build: %v", err)
	}
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
	rebuilt, err := pa.BuildDockerfile(ctx, "web", template.DockerfileOptions{
		Dockerfile: []byte("FROM " + ref + "\nENV HELLO=again\n"), DockerfileName: "Dockerfile", Context: t.TempDir(),
		Runtime: noRun{}, Pull: policy,
	}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
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
