//go:build linux

package template

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/slowness"
	"github.com/lizard-build/lizard/internal/template/ocitest"
)

// TestDockerfileFromImage pulls an image from a registry on the loopback
// address, flattens its layers (the whiteout removes a file of the first),
// carries its configuration over, runs a RUN step on it in gVisor, and
// reuses the pulled layer on the next build. A missing image and an
// unreachable registry are clear errors.
func TestDockerfileFromImage(t *testing.T) {
	r, rt := realBaseRegistry(t)
	host := ocitest.Registry(t)
	ref := host + "/lizard/busybox:1"
	digest := ocitest.PushBusybox(t, ref)

	// The registry is on the loopback address: pulls need the operator's
	// leave.
	allowed, err := NewPullPolicy([]string{host}, "")
	if err != nil {
		t.Fatal(err)
	}
	policy := allowed
	build := func(df string) (Template, string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), slowness.Scale(3*time.Minute))
		defer cancel()
		var out bytes.Buffer
		tpl, err := r.BuildDockerfile(ctx, "fromimage", DockerfileOptions{
			Dockerfile: []byte(df), DockerfileName: "Dockerfile", Context: t.TempDir(), Runtime: rt, Pull: policy,
			BuildBridge: rt.net.Bridge, BuildSubnet: rt.net.Subnet, NetnsPrefix: rt.net.NetnsPrefix,
		}, &out)
		t.Logf("build output:\n%s", out.String())
		return tpl, out.String(), err
	}
	df := "FROM " + ref + "\nRUN echo \"$FOO in $(pwd)\" > /out.txt\n"
	tpl, out, err := build(df)
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	if !strings.Contains(out, digest) {
		t.Errorf("progress does not name the image's digest %s", digest)
	}
	read := func(p string) string {
		b, _ := os.ReadFile(filepath.Join(tpl.Rootfs, p))
		return string(b)
	}
	if got := read("out.txt"); got != "from-image in /work\n" {
		t.Errorf("RUN on the image: /out.txt = %q", got)
	}
	if got := read("etc/greeting"); got != "from layer two\n" {
		t.Errorf("second layer: /etc/greeting = %q", got)
	}
	if _, err := os.Lstat(filepath.Join(tpl.Rootfs, "gone.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the whiteout of /gone.txt was not applied: %v", err)
	}
	if fi, err := os.Lstat(filepath.Join(tpl.Rootfs, "etc/hosts")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("/etc/hosts must be a file a sandbox can mount over: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(tpl.Rootfs, ".lizard")); err != nil || !fi.IsDir() {
		t.Errorf("no /.lizard mount point: %v", err)
	}
	if tpl.Workdir != "/work" || tpl.From != ref || !slices.Contains(tpl.Env, "FOO=from-image") ||
		!slices.Equal(tpl.StartCommand, []string{"httpd", "-f", "-p", "8080", "-h", "/www"}) {
		t.Errorf("image configuration not carried over: %+v", tpl)
	}

	// Built again: the image is not unpacked again.
	if _, out, err = build(df + "RUN true\n"); err != nil {
		t.Fatalf("rebuild: %v", err)
	}
	if !strings.Contains(out, "CACHED") || strings.Count(out, "to fetch") != 0 {
		t.Errorf("rebuild fetched the image again:\n%s", out)
	}

	for _, c := range []struct {
		from   string
		policy *PullPolicy
		want   error
		code   string
	}{
		{host + "/lizard/none:1", allowed, errdefs.ErrInvalid, CodeImagePullFailed},
		{ref, nil, errdefs.ErrPermission, CodeRegistryRefused},                                // not allowed
		{"127.0.0.1:9/lizard/busybox:1", allowed, errdefs.ErrPermission, CodeRegistryRefused}, // another port
		{"localhost:9/lizard/busybox:1", nil, errdefs.ErrPermission, CodeRegistryRefused},
		{"169.254.169.254/lizard/busybox:1", nil, errdefs.ErrPermission, CodeRegistryRefused},
		{"Not_A..Reference:", allowed, errdefs.ErrInvalid, ""},
	} {
		policy = c.policy
		_, _, err := build("FROM " + c.from + "\n")
		if !errors.Is(err, c.want) || errdefs.Code(err) != c.code || !strings.Contains(err.Error(), c.from) {
			t.Errorf("FROM %s: %v (code %q), want %v, code %q, naming it", c.from, err, errdefs.Code(err), c.want, c.code)
		}
	}
	if l := buildLeaks(r.Dir(), rt); len(l) > 0 {
		t.Errorf("left behind: %v", l)
	}
}
