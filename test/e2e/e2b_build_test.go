package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/lizard-build/lizard/internal/template/ocitest"
)

// TestE2BTemplateBuild runs js/e2b-build/*.test.mjs with each E2B SDK:
// E2B's Template builder, unmodified, builds templates on lizard from
// "python:3.12-slim", an image of the test's own registry (no internet
// here: the built python template's rootfs, without its "user" account, so
// that the build makes it as E2B's does), which --registry-allow lets the
// server pull from. E2B_OTHER_KEY is a key of another project.
func TestE2BTemplateBuild(t *testing.T) {
	files := jsFiles("js/e2b-build/*.test.mjs")
	if len(files) == 0 {
		t.Fatal("no E2B template build test files")
	}
	rootfs := filepath.Join(templateDir(), "python", "rootfs")
	if _, err := os.Stat(filepath.Join(rootfs, "usr", "bin", "python3")); err != nil {
		t.Skipf("the python template is not built (make templates): %v", err)
	}
	host := ocitest.Registry(t)
	image := host + "/library/python:3.12-slim"
	ocitest.PushDir(t, image, rootfs, v1.Config{
		Env: []string{"PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"},
		Cmd: []string{"python3"},
	}, withoutUser(t, rootfs, "user"), []string{"home/user", "etc/sudoers.d/user", // as slim images, without docs:
		"usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale"})
	s := startServer(t, "", "--registry-allow", host)
	other := s.projectKey(t, "e2b-build-other")
	for _, sdk := range e2bSDKs {
		t.Run(sdk, func(t *testing.T) {
			if _, err := os.Stat(filepath.Join("node_modules", sdk)); err != nil {
				t.Fatalf("%s is not installed: run `npm install` in test/e2e (make test does)", sdk)
			}
			ctx, cancel := context.WithTimeout(context.Background(), budget(15*time.Minute))
			defer cancel()
			env := []string{"E2B_SDK=" + sdk, "E2B_API_URL=" + s.url, "E2B_API_KEY=" + s.key, "E2B_SANDBOX_URL=http://" + s.proxy,
				"E2B_TEST_IMAGE=" + image, "E2B_OTHER_KEY=" + other}
			if err := s.runNodeEnv(ctx, env, files...); err != nil {
				t.Fatalf("E2B template build tests with %s failed: %v", sdk, err)
			}
		})
	}
	s.waitNoLeaks(t)
}

// withoutUser is what PushDir replaces to leave account name out of the
// rootfs's account files.
func withoutUser(t *testing.T, rootfs, name string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, f := range []string{"etc/passwd", "etc/group", "etc/shadow", "etc/gshadow"} {
		b, err := os.ReadFile(filepath.Join(rootfs, f))
		if err != nil {
			continue
		}
		var keep []string
		for _, l := range strings.SplitAfter(string(b), "\n") {
			if !strings.HasPrefix(l, name+":") {
				keep = append(keep, l)
			}
		}
		out[f] = strings.Join(keep, "")
	}
	return out
}
