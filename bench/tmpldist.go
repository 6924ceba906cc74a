package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/lizard-build/lizard/internal/objstore"
)

// The first use of a template on a node that lacks it (--object-store):
// a Dockerfile template built through the API is published; its local
// copy is then removed, as on a node that never had it, and a create →
// first exec fetches it (download, unpack, verify against its digest)
// before it boots. Beside it, create → exec on the node that holds it.

func benchTemplateFetch(w io.Writer, s *server, st objstore.Store, n int) error {
	name := fmt.Sprintf("bench-dist-%d", os.Getpid())
	if err := s.call("POST", "/api/templates", map[string]any{"name": name,
		"dockerfile": "FROM base\nRUN head -c 64M /dev/urandom > /payload && echo ok > /built.txt\n"}, nil); err != nil {
		return fmt.Errorf("build: %w", err)
	}
	defer func() {
		s.removeTemplate(name)
		// Its versions and build layers stay until the server prunes
		// them; the bench's sandboxes are gone, and its project's
		// templates directory (in the template cache, which outlives the
		// bench) goes with them.
		links, _ := filepath.Glob(filepath.Join(s.templateDir, ".projects", "*", ".lock-"+name))
		for _, l := range links {
			os.RemoveAll(filepath.Dir(l))
		}
	}()
	// The local copies the measurements take away are moved aside, not
	// deleted, until the end: on an ext4 without a journal (these
	// machines' root) the kernel reuses no inode deleted in the last
	// minute or more and checks each one it passes, so a fetch right
	// after deleting a copy of the same 13,000 files extracts several
	// times slower (tar: 0.8 s, 5.5 s after such a delete) — a cost of
	// the bench's own delete, which a node that lacks the template has
	// not made.
	aside, err := os.MkdirTemp(s.templateDir, ".bench-aside-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(aside)
	var stored int64
	st.List(context.Background(), "blobs/", func(i objstore.Info) error { stored += i.Size; return nil })
	var size int64
	var fetch, held []time.Duration
	for i := range n {
		// As on a node that lacks it: no local copy.
		links, _ := filepath.Glob(filepath.Join(s.templateDir, ".projects", "*", name))
		versions, _ := filepath.Glob(filepath.Join(s.templateDir, ".projects", "*", ".v", name+"@*"))
		if len(links) != 1 || len(versions) == 0 {
			return fmt.Errorf("local copy of %s: links %v, versions %v", name, links, versions)
		}
		size = dirSize(versions[0])
		if err := os.Remove(links[0]); err != nil {
			return err
		}
		for j, v := range versions {
			if err := os.Rename(v, filepath.Join(aside, fmt.Sprintf("%d-%d", i, j))); err != nil {
				return err
			}
		}
		for i, into := range []*[]time.Duration{&fetch, &held} {
			t := time.Now()
			var sb struct {
				SandboxID string `json:"sandboxId"`
			}
			if err := s.call("POST", "/api/sandboxes", map[string]any{"template": name}, &sb); err != nil {
				return fmt.Errorf("create (%d): %w", i, err)
			}
			if err := s.execTrue(sb.SandboxID); err != nil {
				return err
			}
			*into = append(*into, time.Since(t))
			s.kill(sb.SandboxID)
		}
	}
	return printStatsTable(w, "templates everywhere (versitygw on loopback)", []statsRow{
		{fmt.Sprintf("create→exec, template fetched first (%.0f MiB, %.0f MiB stored)", float64(size)/(1<<20), float64(stored)/(1<<20)), fetch},
		{"create→exec, template held", held},
	})
}
