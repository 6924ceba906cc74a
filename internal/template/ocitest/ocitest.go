// Package ocitest serves OCI images for tests of FROM <image>: a real
// registry (go-containerregistry's, in memory) on the loopback address,
// a small image made of the host's static busybox, and images of a
// directory's tree (a built template's rootfs standing in for a public
// image).
package ocitest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io"
	"io/fs"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Busybox is where the host's static busybox is (Debian's busybox-static).
const Busybox = "/bin/busybox"

// Registry starts an in-memory registry on 127.0.0.1 for the test's
// duration and returns its host:port.
func Registry(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// PushBusybox pushes a two-layer image to ref (host:port/repo:tag) and
// returns its digest. Layer one: /bin/busybox with sh, wget, httpd, cat and
// echo linked to it, /etc/passwd, /etc/hosts as a link (which a sandbox
// must not follow) and /gone.txt; layer two: /etc/greeting ("from layer
// two") and a whiteout of /gone.txt. Config: PATH=/bin, FOO=from-image,
// WORKDIR /work, CMD ["httpd", "-f", "-p", "8080", "-h", "/www"] after
// /www/index.html ("served from the image") is made by layer two.
func PushBusybox(t *testing.T, ref string) string {
	t.Helper()
	bb, err := os.ReadFile(Busybox)
	if err != nil {
		t.Skipf("no static busybox (apt-get install busybox-static): %v", err)
	}
	one := layer(t, func(w *tar.Writer) {
		dir(w, "bin")
		file(w, "bin/busybox", bb, 0o755)
		for _, l := range []string{"sh", "wget", "httpd", "cat", "echo", "sleep", "ls", "test"} {
			link(w, "bin/"+l, "busybox")
		}
		dir(w, "etc")
		file(w, "etc/passwd", []byte("root:x:0:0:root:/root:/bin/sh\n"), 0o644)
		link(w, "etc/hosts", "/run/hosts")
		file(w, "gone.txt", []byte("removed by layer two\n"), 0o644)
	})
	two := layer(t, func(w *tar.Writer) {
		dir(w, "etc")
		file(w, "etc/greeting", []byte("from layer two\n"), 0o644)
		file(w, ".wh.gone.txt", nil, 0o644)
		dir(w, "www")
		file(w, "www/index.html", []byte("served from the image\n"), 0o644)
	})
	return push(t, ref, v1.Config{
		Env:        []string{"PATH=/bin", "FOO=from-image"},
		WorkingDir: "/work",
		Cmd:        []string{"httpd", "-f", "-p", "8080", "-h", "/www"},
	}, one, two)
}

// push pushes an image of layers with config to ref and returns its
// digest.
func push(t *testing.T, ref string, config v1.Config, layers ...v1.Layer) string {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture, cfg.Config = "linux", "amd64", config
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		t.Fatal(err)
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

func layer(t *testing.T, fill func(*tar.Writer)) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	w := tar.NewWriter(&buf)
	fill(w)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func dir(w *tar.Writer, p string) {
	w.WriteHeader(&tar.Header{Name: p + "/", Typeflag: tar.TypeDir, Mode: 0o755})
}

func file(w *tar.Writer, p string, b []byte, mode int64) {
	w.WriteHeader(&tar.Header{Name: p, Typeflag: tar.TypeReg, Mode: mode, Size: int64(len(b))})
	w.Write(b)
}

func link(w *tar.Writer, p, target string) {
	w.WriteHeader(&tar.Header{Name: p, Typeflag: tar.TypeSymlink, Linkname: target, Mode: 0o777})
}

// PushDir pushes an image of one layer to ref (host:port/repo:tag) and
// returns its digest: the tree of dir, owners and modes kept (hard links
// as copies; devices, sockets and fifos left out), with the files of
// replace (path relative to dir → content) replacing or adding theirs and
// the paths of omit (relative, with what is under them) left out; config
// is the image's configuration (Env, Cmd, …).
func PushDir(t *testing.T, ref, dir string, config v1.Config, replace map[string]string, omit []string) string {
	t.Helper()
	skip := func(rel string) bool {
		for _, o := range omit {
			if rel == o || strings.HasPrefix(rel, o+"/") {
				return true
			}
		}
		return false
	}
	write := func(w io.Writer) error {
		tw := tar.NewWriter(w)
		done := map[string]bool{}
		err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(dir, p)
			if rel == "." {
				return nil
			}
			rel = filepath.ToSlash(rel)
			if skip(rel) {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			link := ""
			switch {
			case fi.Mode()&fs.ModeSymlink != 0:
				if link, err = os.Readlink(p); err != nil {
					return err
				}
			case !fi.IsDir() && !fi.Mode().IsRegular():
				return nil
			}
			h, err := tar.FileInfoHeader(fi, link)
			if err != nil {
				return err
			}
			h.Name = rel
			if fi.IsDir() {
				h.Name += "/"
			}
			content, replaced := replace[rel]
			if replaced {
				h.Size = int64(len(content))
				done[rel] = true
			}
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			if h.Typeflag != tar.TypeReg {
				return nil
			}
			if replaced {
				_, err = io.WriteString(tw, content)
				return err
			}
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(tw, f)
			return err
		})
		if err != nil {
			return err
		}
		for rel, content := range replace {
			if !done[rel] {
				if err := tw.WriteHeader(&tar.Header{Name: rel, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(content))}); err != nil {
					return err
				}
				io.WriteString(tw, content)
			}
		}
		return tw.Close()
	}
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(write(pw)) }()
		return pr, nil
	}, tarball.WithCompressionLevel(gzip.BestSpeed))
	if err != nil {
		t.Fatal(err)
	}
	return push(t, ref, config, l)
}
