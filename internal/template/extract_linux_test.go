//go:build linux

package template

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// TestExtractArchive: an uploaded archive (gzipped or plain) is unpacked
// with its modes; entries that would land outside the directory are
// refused, and nothing is written outside it.
func TestExtractArchive(t *testing.T) {
	type entry struct {
		name, link, content string
		typ                 byte
		mode                int64
	}
	archive := func(gz bool, entries ...entry) string {
		var buf bytes.Buffer
		var w *tar.Writer
		var zw *gzip.Writer
		if gz {
			zw = gzip.NewWriter(&buf)
			w = tar.NewWriter(zw)
		} else {
			w = tar.NewWriter(&buf)
		}
		for _, e := range entries {
			w.WriteHeader(&tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: e.mode, Size: int64(len(e.content)),
				Uid: os.Getuid(), Gid: os.Getgid()})
			w.Write([]byte(e.content))
		}
		w.Close()
		if zw != nil {
			zw.Close()
		}
		p := filepath.Join(t.TempDir(), "files")
		if err := os.WriteFile(p, buf.Bytes(), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, gz := range []bool{true, false} {
		dir := t.TempDir()
		err := ExtractArchive(archive(gz,
			entry{name: "app/", typ: tar.TypeDir, mode: 0o755},
			entry{name: "app/run.sh", typ: tar.TypeReg, mode: 0o750, content: "#!/bin/sh\n"},
			entry{name: "app/link", typ: tar.TypeSymlink, link: "run.sh", mode: 0o777},
		), dir)
		if err != nil {
			t.Fatalf("gzip %v: %v", gz, err)
		}
		fi, err := os.Stat(filepath.Join(dir, "app", "run.sh"))
		if err != nil || fi.Mode().Perm() != 0o750 {
			t.Fatalf("gzip %v: run.sh %v %v", gz, fi, err)
		}
		if l, err := os.Readlink(filepath.Join(dir, "app", "link")); err != nil || l != "run.sh" {
			t.Fatalf("gzip %v: link %q %v", gz, l, err)
		}
	}
	outside := t.TempDir()
	for name, entries := range map[string][]entry{
		"dot-dot": {{name: "../../" + filepath.Base(outside) + "/evil", typ: tar.TypeReg, mode: 0o644, content: "x"}},
		"through a link": {
			{name: "out", typ: tar.TypeSymlink, link: outside, mode: 0o777},
			{name: "out/evil", typ: tar.TypeReg, mode: 0o644, content: "x"},
		},
	} {
		dir := filepath.Join(t.TempDir(), "ctx")
		os.Mkdir(dir, 0o755)
		if err := ExtractArchive(archive(true, entries...), dir); err == nil {
			t.Errorf("%s: extracted", name)
		}
		if _, err := os.Stat(filepath.Join(outside, "evil")); err == nil {
			t.Fatalf("%s: a file was written outside the directory", name)
		}
	}
	notTar := filepath.Join(t.TempDir(), "x")
	os.WriteFile(notTar, []byte("hello"), 0o600)
	if err := ExtractArchive(notTar, t.TempDir()); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("not an archive: %v, want ErrInvalid", err)
	}
}
