// Package ocitest serves OCI images for tests of FROM <image>: a real
// registry (go-containerregistry's, in memory) on the loopback address,
// and a small image made of the host's static busybox.
package ocitest

import (
	"archive/tar"
	"bytes"
	"io"
	"log"
	"net/http/httptest"
	"os"
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
	img, err := mutate.AppendLayers(empty.Image, one, two)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", "amd64"
	cfg.Config.Env = []string{"PATH=/bin", "FOO=from-image"}
	cfg.Config.WorkingDir = "/work"
	cfg.Config.Cmd = []string{"httpd", "-f", "-p", "8080", "-h", "/www"}
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
