package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/sandbox/sandboxtest"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/template"
)

// versionTemplates is a node's templates: current is the template's
// current version; versions are the versions LookupVersion brings (by
// digest), or err.
type versionTemplates struct {
	current  template.Template
	versions map[string]template.Template
	err      error
	asked    []string
}

func (v *versionTemplates) Lookup(project, name string) (template.Template, error) {
	return v.current, nil
}

func (v *versionTemplates) LookupVersion(project, name, digest string) (template.Template, error) {
	v.asked = append(v.asked, project+"/"+name+"@"+digest)
	if v.err != nil {
		return template.Template{}, v.err
	}
	t, ok := v.versions[digest]
	if !ok {
		return template.Template{}, fmt.Errorf("no %s: %w", digest, errdefs.ErrNotFound)
	}
	return t, nil
}

func TestVersionDir(t *testing.T) {
	hex := strings.Repeat("ab", 32)
	for _, tc := range []struct {
		rootfs, dir, name, digest string
		ok                        bool
	}{
		{"/t/.projects/p/.v/web@sha256-" + hex + "/rootfs", "web@sha256-" + hex, "web", "sha256:" + hex, true},
		{"/t/.v/base@sha256-" + hex + "/rootfs", "base@sha256-" + hex, "base", "sha256:" + hex, true},
		{"/t/base/rootfs", "", "", "", false},               // the older layout
		{"/t/.v/base@sha256-abc/rootfs", "", "", "", false}, // not a digest
		{"", "", "", "", false},
	} {
		dir, name, digest, ok := versionDir(tc.rootfs)
		if dir != tc.dir || name != tc.name || digest != tc.digest || ok != tc.ok {
			t.Errorf("versionDir(%q) = %q %q %q %v, want %q %q %q %v", tc.rootfs, dir, name, digest, ok, tc.dir, tc.name, tc.digest, tc.ok)
		}
	}
}

// TestHereRootfs: a sandbox or snapshot recorded on a template version
// that starts on a node gets that version (the recorded path, else the
// version by its digest), the current one only when the version can be
// had nowhere, and an error when fetching it fails otherwise; the version
// is kept from pruning until released.
func TestHereRootfs(t *testing.T) {
	base := t.TempDir()
	hexOld, hexNew := strings.Repeat("0a", 32), strings.Repeat("0b", 32)
	path := func(node, hex string) string {
		return filepath.Join(base, node, ".projects", "p", ".v", "web@sha256-"+hex, "rootfs")
	}
	here := path("b", hexOld) // the old version, as this node would hold it
	current := template.Template{Name: "web", Rootfs: path("b", hexNew), Digest: "sha256:" + hexNew}
	tpls := &versionTemplates{current: current, versions: map[string]template.Template{
		"sha256:" + hexOld: {Name: "web", Rootfs: here, Digest: "sha256:" + hexOld},
	}}
	s := New(Config{Templates: tpls})

	// Recorded on another node: the same version by its digest, pinned
	// until released.
	got, release, err := s.hereRootfs("p", "web", path("a", hexOld), true)
	if err != nil || got != here {
		t.Fatalf("hereRootfs of a's old version: %q %v, want %q", got, err, here)
	}
	if len(tpls.asked) != 1 || tpls.asked[0] != "p/web@sha256:"+hexOld {
		t.Fatalf("asked for %v, want p/web@sha256:%s", tpls.asked, hexOld)
	}
	if !s.UsesRootfs(here) {
		t.Fatalf("the version being brought here is not in use: prune could remove it")
	}
	release()
	if s.UsesRootfs(here) {
		t.Fatalf("the version is still in use after release")
	}

	// Recorded on this node, and here: the recorded path, nothing asked.
	if err := os.MkdirAll(here, 0o755); err != nil {
		t.Fatal(err)
	}
	tpls.asked = nil
	if got, release, err := s.hereRootfs("p", "web", here, false); err != nil || got != here || len(tpls.asked) != 0 {
		t.Fatalf("hereRootfs of a version here: %q %v (asked %v), want %q", got, err, tpls.asked, here)
	} else {
		release()
	}

	// Published nowhere (a built-in each node builds for itself): the
	// current version.
	if got, release, err := s.hereRootfs("p", "web", path("a", strings.Repeat("0c", 32)), true); err != nil || got != current.Rootfs {
		t.Fatalf("hereRootfs of a version nowhere: %q %v, want the current %q", got, err, current.Rootfs)
	} else {
		release()
	}
	// A snapshot of this node's own whose version is gone (no fallback):
	// fetched by its digest when published, else template_not_found, not
	// another version.
	if got, release, err := s.hereRootfs("p", "web", path("b2", hexOld), false); err != nil || got != here {
		t.Fatalf("hereRootfs of this node's lost version, published: %q %v, want %q", got, err, here)
	} else {
		release()
	}
	for _, rec := range []string{path("b", strings.Repeat("0c", 32)), filepath.Join(base, "b", "web", "rootfs")} {
		if got, _, err := s.hereRootfs("p", "web", rec, false); !errors.Is(err, errdefs.ErrNotFound) || errdefs.Code(err) != "template_not_found" {
			t.Fatalf("hereRootfs(%q) of a version gone for good, no fallback: %q %v, want template_not_found", rec, got, err)
		}
	}
	// Nothing recorded, or a path of the older layout: the current one.
	for _, rec := range []string{"", filepath.Join(base, "a", "web", "rootfs")} {
		if got, release, err := s.hereRootfs("p", "web", rec, true); err != nil || got != current.Rootfs {
			t.Fatalf("hereRootfs(%q): %q %v, want the current %q", rec, got, err, current.Rootfs)
		} else {
			release()
		}
	}

	// The object store fails (or the copy is corrupt): an error, not
	// another version.
	tpls.err = fmt.Errorf("object store down: %w", errdefs.ErrUnavailable)
	if got, _, err := s.hereRootfs("p", "web", path("a", strings.Repeat("0d", 32)), true); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("hereRootfs with the store down: %q %v, want unavailable", got, err)
	}
	if len(s.pinned) != 0 {
		t.Fatalf("pins left: %v", s.pinned)
	}
}

// TestTemplateVersionsUsed: the versions of every sandbox and snapshot
// record (running, paused, of any node) are in use; records with no
// version, or of the older layout, name none.
func TestTemplateVersionsUsed(t *testing.T) {
	ctx := context.Background()
	st, p := sandboxtest.ProjectStore(t)
	hexA, hexB := strings.Repeat("0a", 32), strings.Repeat("0b", 32)
	spec := func(rootfs string) json.RawMessage {
		b, _ := json.Marshal(map[string]string{"rootfs": rootfs})
		return b
	}
	for i, rootfs := range []string{"/a/.projects/p/.v/web@sha256-" + hexA + "/rootfs", "", "/a/web/rootfs"} {
		if err := st.PutSandbox(ctx, store.Sandbox{ID: fmt.Sprintf("sb%d", i), ProjectID: p.ID, Template: "web", Size: "small",
			Status: "paused", Spec: spec(rootfs), StartedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.PutSnapshot(ctx, store.Snapshot{ID: "snap", ProjectID: p.ID, Spec: spec("/c/.v/base@sha256-" + hexB + "/rootfs"), CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	used, err := TemplateVersionsUsed(ctx, st)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"web@sha256-" + hexA: true, "base@sha256-" + hexB: true}
	if len(used) != len(want) || !used["web@sha256-"+hexA] || !used["base@sha256-"+hexB] {
		t.Fatalf("versions in use: %v, want %v", used, want)
	}
}
