//go:build linux

package template

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

const realTemplates = "/var/cache/lizard/templates"

// TestDockerfileBuildReal builds a Dockerfile on the real base template with
// RUN steps in gVisor, rebuilds it after a one-line change (all but the
// last step cached), and checks that a failing RUN reports its exit code
// and output and leaves the template and the host as they were.
func TestDockerfileBuildReal(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("Dockerfile builds need root (gVisor, network namespaces)")
	}
	runsc := os.Getenv("LIZARD_RUNSC")
	if runsc == "" {
		var err error
		if runsc, err = exec.LookPath("runsc"); err != nil {
			t.Skip("runsc (gVisor) not installed")
		}
	}
	if _, err := os.Stat(filepath.Join(realTemplates, "base", metadataFile)); err != nil {
		t.Skipf("the base template is not built in %s (lizard template build base)", realTemplates)
	}
	dir := t.TempDir()
	// The real base, without copying it: FROM base reads it through the link.
	if err := os.Symlink(filepath.Join(realTemplates, "base"), filepath.Join(dir, "base")); err != nil {
		t.Fatal(err)
	}
	r := NewRegistry(dir)
	bctx := t.TempDir()
	os.WriteFile(filepath.Join(bctx, "hello.txt"), []byte("hello\n"), 0o644)

	df := `FROM base
ARG WHO=world
RUN mkdir -p /opt && echo "made for $WHO" > /opt/made.txt
COPY --chown=user:user hello.txt /opt/
ENV GREETING=hi
WORKDIR /opt/work
USER user
RUN whoami > /tmp/who.txt && pwd >> /tmp/who.txt
CMD ["python3", "-m", "http.server", "8000"]
RUN echo v1 > /tmp/last.txt
`
	build := func(df string) (Template, string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		var out bytes.Buffer
		tpl, err := r.BuildDockerfile(ctx, "custom", DockerfileOptions{
			Dockerfile: []byte(df), DockerfileName: "Dockerfile", Context: bctx,
			BuildArgs: map[string]string{"WHO": "test"}, Runsc: runsc,
		}, &out)
		t.Logf("build output:\n%s", out.String())
		return tpl, out.String(), err
	}

	tpl, out, err := build(df)
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	if strings.Contains(out, "CACHED") {
		t.Errorf("first build reported cached steps")
	}
	rootfs := tpl.Rootfs
	mustRead := func(p, want string) {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(rootfs, p))
		if err != nil || string(b) != want {
			t.Errorf("%s = %q, %v; want %q", p, b, err, want)
		}
	}
	mustRead("opt/made.txt", "made for test\n")
	mustRead("opt/hello.txt", "hello\n")
	mustRead("tmp/who.txt", "user\n/opt/work\n")
	mustRead("tmp/last.txt", "v1\n")
	if fi, err := os.Stat(filepath.Join(rootfs, "opt/hello.txt")); err != nil || fi.Sys().(*syscall.Stat_t).Uid != 1000 || fi.Sys().(*syscall.Stat_t).Gid != 1000 {
		t.Errorf("COPY --chown=user:user: %v %+v", err, fi)
	}
	if fi, err := os.Stat(filepath.Join(rootfs, "tmp/who.txt")); err != nil || fi.Sys().(*syscall.Stat_t).Uid != 1000 {
		t.Errorf("file made by RUN as USER user is not user's: %v", err)
	}
	if v, _ := lookupEnv(tpl.Env, "GREETING"); v != "hi" {
		t.Errorf("Env = %q", tpl.Env)
	}
	if _, ok := lookupEnv(tpl.Env, "WHO"); ok {
		t.Errorf("ARG WHO is in the template's env")
	}
	if tpl.Workdir != "/opt/work" || tpl.User != "user" || !slices.Equal(tpl.StartCommand, []string{"python3", "-m", "http.server", "8000"}) || tpl.From != "base" {
		t.Errorf("template = %+v", tpl)
	}

	// A one-line change at the end: every earlier step is cached.
	tpl2, out, err := build(strings.Replace(df, "echo v1", "echo v2", 1))
	if err != nil {
		t.Fatalf("rebuild: %v", err)
	}
	var cached, ran []string
	for _, l := range strings.Split(out, "\n") {
		if i := strings.Index(l, "] step "); i >= 0 && (strings.Contains(l, " RUN ") || strings.Contains(l, " COPY ")) {
			if strings.HasSuffix(l, " CACHED") {
				cached = append(cached, l[i+2:])
			} else if !strings.Contains(l, " done") {
				ran = append(ran, l[i+2:])
			}
		}
	}
	if len(cached) != 3 || len(ran) != 1 || !strings.Contains(ran[0], "echo v2") {
		t.Errorf("rebuild: cached %q, ran %q; want 3 cached and only the last RUN run", cached, ran)
	}
	mustRead2 := func(p, want string) {
		if b, _ := os.ReadFile(filepath.Join(tpl2.Rootfs, p)); string(b) != want {
			t.Errorf("after rebuild %s = %q, want %q", p, b, want)
		}
	}
	mustRead2("tmp/last.txt", "v2\n")
	mustRead2("opt/made.txt", "made for test\n")

	// A failing RUN: its exit code and output in the error, the template
	// untouched, nothing left behind.
	_, out, err = build(strings.Replace(df, "echo v1 > /tmp/last.txt", "echo boom >&2; exit 3", 1))
	if err == nil || !strings.Contains(err.Error(), "exit code 3") || !strings.Contains(err.Error(), "boom") || !strings.Contains(err.Error(), "Dockerfile:10") {
		t.Errorf("failing RUN: err = %v", err)
	}
	if !strings.Contains(out, "RUN failed (exit code 3)") {
		t.Errorf("progress does not report the failure")
	}
	if now, err := r.Get("custom"); err != nil || now.Version != tpl2.Version {
		t.Errorf("after a failed build the template is %+v, %v; want version %s", now, err, tpl2.Version)
	}
	if leaks := dockerBuildLeaks(dir); len(leaks) > 0 {
		t.Errorf("left behind: %q", leaks)
	}
}

// dockerBuildLeaks lists what Dockerfile builds may leave on the host.
func dockerBuildLeaks(dir string) []string {
	var out []string
	for _, pattern := range []string{
		filepath.Join(dir, ".build-*"), filepath.Join(dir, ".old-*"), filepath.Join(dir, ".layers", ".tmp-*"),
		"/run/netns/lizard-lzb*", "/sys/fs/cgroup/*" + buildCgroup, "/sys/fs/cgroup" + buildCgroup, buildRunscRt,
		"/sys/class/net/" + buildBridge, "/sys/class/net/lzv*",
	} {
		ms, _ := filepath.Glob(pattern)
		for _, m := range ms {
			if strings.HasPrefix(m, "/sys/class/net/lzv") {
				// Sandboxes of a running server have veths too: only the
				// build bridge's ports are ours.
				if l, err := os.Readlink(filepath.Join(m, "master")); err != nil || filepath.Base(l) != buildBridge {
					continue
				}
			}
			out = append(out, m)
		}
	}
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil && bytes.Contains(b, []byte(buildRunscRt)) {
		out = append(out, "mount under "+buildRunscRt)
	}
	if b, err := exec.Command("nft", "list", "tables").Output(); err == nil && bytes.Contains(b, []byte("lizard_"+buildBridge)) {
		out = append(out, "nftables table lizard_"+buildBridge)
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && bytes.Contains(b, []byte(buildRunscRt)) {
			out = append(out, "process "+e.Name())
		}
	}
	return out
}
