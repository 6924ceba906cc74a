package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/network"
)

const (
	pkgSuite    = "bookworm"
	pkgCacheDir = "/var/cache/lizard/pkgtest"
	// The server started in the root uses its own bridge and subnet.
	pkgBridge = "lizardp0"
	pkgSubnet = "10.253.0.0/16"
)

// TestDebianPackage tests the Debian package `make package` builds: installed
// with apt-get into a fresh Debian 12 root made by debootstrap, its files are
// where they belong, its systemd unit passes `systemd-analyze verify`, and
// the installed `lizard serve` starts in that root and answers its API.
//
// It needs root, debootstrap, unshare and chroot, the host's Debian mirror
// (from /etc/apt/sources.list*), and runsc. The debootstrap download and apt's
// package cache live under /var/cache/lizard/pkgtest, so a second run
// downloads little.
func TestDebianPackage(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: debootstrap, chroot and lizard serve")
	}
	for _, c := range []string{"debootstrap", "unshare", "chroot", "make", "systemd-analyze"} {
		if _, err := exec.LookPath(c); err != nil {
			t.Skipf("%s not installed (make deps)", c)
		}
	}
	runsc := os.Getenv("LIZARD_RUNSC")
	if runsc == "" {
		runsc, _ = exec.LookPath("runsc")
	}
	if runsc == "" {
		t.Skip("runsc not installed (make deps)")
	}
	mirror, err := hostMirror()
	if err != nil {
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), budget(15*time.Minute))
	defer cancel()

	deb := buildPackage(t, ctx)
	root := bootstrap(t, ctx, mirror)

	// Install with apt-get, which fetches the package's dependencies from
	// the host's mirror; systemd too, for the unit's verification (a
	// minimal root has no targets to check it against).
	os.WriteFile(filepath.Join(root, "etc/apt/sources.list"), []byte(fmt.Sprintf("deb %s %s main\n", mirror, pkgSuite)), 0o644)
	copyFile(t, "/etc/resolv.conf", filepath.Join(root, "etc/resolv.conf"))
	copyFile(t, deb, filepath.Join(root, "tmp/lizard.deb"))
	inRoot(t, ctx, root, "apt-get -q update && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends systemd /tmp/lizard.deb")

	t.Run("files", func(t *testing.T) {
		for _, f := range []struct {
			path string
			mode os.FileMode
		}{
			{"usr/bin/lizard", 0o755},
			{"usr/bin/lizard-agent", 0o755},
			{"lib/systemd/system/lizard.service", 0o644},
			{"lib/systemd/system/lizard-drain.service", 0o644},
			{"usr/lib/lizard/node-hook", 0o755},
			{"usr/share/doc/lizard/examples/cluster.conf", 0o644},
			{"usr/share/doc/lizard/examples/cluster.env", 0o644},
			{"etc/lizard/lizard.toml", 0o644},
			{"usr/share/doc/lizard/CONFIG.md", 0o644},
			{"usr/share/doc/lizard/OPERATIONS.md", 0o644},
			{"var/lib/lizard", os.ModeDir | 0o700},
		} {
			fi, err := os.Stat(filepath.Join(root, f.path))
			if err != nil {
				t.Errorf("/%s: %v", f.path, err)
				continue
			}
			if got := fi.Mode() & (os.ModeDir | os.ModePerm); got != f.mode {
				t.Errorf("/%s: mode %v, want %v", f.path, got, f.mode)
			}
		}
		want, _ := os.ReadFile("../../deploy/lizard.toml")
		if got, _ := os.ReadFile(filepath.Join(root, "etc/lizard/lizard.toml")); !bytes.Equal(got, want) {
			t.Error("/etc/lizard/lizard.toml is not deploy/lizard.toml")
		}
		conffiles, _ := os.ReadFile(filepath.Join(root, "var/lib/dpkg/info/lizard.conffiles"))
		if !slices.Contains(strings.Fields(string(conffiles)), "/etc/lizard/lizard.toml") {
			t.Errorf("/etc/lizard/lizard.toml is not a conffile: %q", conffiles)
		}
		status := inRoot(t, ctx, root, "dpkg-query -W -f='${db:Status-Abbrev} ${Version}' lizard")
		if !strings.HasPrefix(status, "ii ") {
			t.Errorf("dpkg status of lizard: %q", status)
		}
		// The dependencies came with it.
		inRoot(t, ctx, root, "command -v debootstrap && command -v ip && command -v nft && command -v mkfs.ext4")
		// The installed binary runs and knows its config keys.
		if out := inRoot(t, ctx, root, "lizard config example"); out != string(want) {
			t.Errorf("installed lizard config example differs from the packaged config")
		}
	})

	t.Run("unit", func(t *testing.T) {
		verifyUnits(t, ctx, root, "lizard.service")
		unitHas(t, root, "lizard.service",
			"ExecStart=/usr/bin/lizard serve --config /etc/lizard/lizard.toml",
			"ExecStartPre=/usr/bin/lizard template build base --if-missing --config /etc/lizard/lizard.toml",
			"Restart=on-failure",
			"KillMode=process",
		)
	})

	// Cluster mode as deploy/systemd/cluster.conf says to set it up: the
	// drop-in and the settings file in place, both units still verify, and
	// the drain unit runs the packaged hook.
	t.Run("cluster units", func(t *testing.T) {
		inRoot(t, ctx, root, "install -D -m 0644 /usr/share/doc/lizard/examples/cluster.conf /etc/systemd/system/lizard.service.d/cluster.conf"+
			" && install -m 0600 /usr/share/doc/lizard/examples/cluster.env /etc/lizard/cluster.env"+
			" && sh -n /usr/lib/lizard/node-hook")
		defer inRoot(t, ctx, root, "rm -rf /etc/systemd/system/lizard.service.d /etc/lizard/cluster.env")
		verifyUnits(t, ctx, root, "lizard.service", "lizard-drain.service")
		unitHas(t, root, "lizard-drain.service",
			"ExecStart=/usr/lib/lizard/node-hook start 300",
			"ExecStop=/usr/lib/lizard/node-hook stop",
			"EnvironmentFile=/etc/lizard/cluster.env",
			"After=lizard.service network-online.target",
		)
	})

	t.Run("serve", func(t *testing.T) {
		serveInRoot(t, ctx, root, runsc)
	})
}

// verifyUnits runs `systemd-analyze verify` on units installed in root,
// which must say nothing.
func verifyUnits(t *testing.T, ctx context.Context, root string, units ...string) {
	t.Helper()
	out, err := exec.CommandContext(ctx, "systemd-analyze", append([]string{"verify", "--root=" + root}, units...)...).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("systemd-analyze verify %v: %v\n%s", units, err, out)
	}
}

// unitHas checks that the unit installed in root has each line.
func unitHas(t *testing.T, root, unit string, lines ...string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "lib/systemd/system", unit))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range lines {
		if !slices.Contains(strings.Split(string(b), "\n"), line) {
			t.Errorf("%s lacks %q", unit, line)
		}
	}
}

// buildPackage runs `make package` into a temporary directory and returns
// the .deb.
func buildPackage(t *testing.T, ctx context.Context) string {
	dist := t.TempDir()
	cmd := exec.CommandContext(ctx, "make", "-C", "../..", "package", "DIST="+dist)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make package: %v\n%s", err, out)
	}
	debs, _ := filepath.Glob(filepath.Join(dist, "lizard_*.deb"))
	if len(debs) != 1 {
		t.Fatalf("make package made %v", debs)
	}
	return debs[0]
}

// bootstrap makes a fresh minimal Debian root. The packages debootstrap
// downloads are kept in a tarball in the cache.
func bootstrap(t *testing.T, ctx context.Context, mirror string) string {
	if err := os.MkdirAll(filepath.Join(pkgCacheDir, "apt-archives", "partial"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(pkgCacheDir, "apt-lists", "partial"), 0o755)
	tarball := filepath.Join(pkgCacheDir, pkgSuite+"-minbase.tgz")
	if _, err := os.Stat(tarball); err != nil {
		t.Logf("downloading %s from %s into %s (once)", pkgSuite, mirror, tarball)
		work := t.TempDir()
		tmp := tarball + ".tmp"
		out, err := exec.CommandContext(ctx, "debootstrap", "--variant=minbase", "--make-tarball="+tmp, pkgSuite, work, mirror).CombinedOutput()
		if err != nil {
			os.Remove(tmp)
			t.Fatalf("debootstrap --make-tarball: %v\n%s", err, lastLines(out))
		}
		if err := os.Rename(tmp, tarball); err != nil {
			t.Fatal(err)
		}
	}
	root := filepath.Join(t.TempDir(), "root")
	out, err := exec.CommandContext(ctx, "debootstrap", "--variant=minbase", "--unpack-tarball="+tarball, pkgSuite, root, mirror).CombinedOutput()
	if err != nil {
		t.Fatalf("debootstrap: %v\n%s", err, lastLines(out))
	}
	return root
}

// inRoot runs a shell script chrooted into root, in a mount namespace of
// its own (gone with it) holding /proc, /sys, /dev and apt's caches, and
// returns its output.
func inRoot(t *testing.T, ctx context.Context, root, script string) string {
	t.Helper()
	out, err := rootCmd(ctx, root, "", script).CombinedOutput()
	if err != nil {
		t.Fatalf("in the root: %s: %v\n%s", script, err, lastLines(out))
	}
	return string(out)
}

// rootCmd is the command inRoot runs; runsc, when set, is bind-mounted at
// /usr/local/bin/runsc in the root.
func rootCmd(ctx context.Context, root, runsc, script string) *exec.Cmd {
	setup := fmt.Sprintf(`set -e
r=%[1]q
mount -t proc proc "$r/proc"
mount --rbind /sys "$r/sys"
mount --rbind /dev "$r/dev"
mount -t tmpfs tmpfs "$r/run"
mount --bind %[2]q "$r/var/cache/apt/archives"
mount --bind %[3]q "$r/var/lib/apt/lists"
`, root, filepath.Join(pkgCacheDir, "apt-archives"), filepath.Join(pkgCacheDir, "apt-lists"))
	if runsc != "" {
		setup += fmt.Sprintf("touch \"$r/usr/local/bin/runsc\"\nmount --bind %q \"$r/usr/local/bin/runsc\"\n", runsc)
	}
	setup += "exec chroot \"$r\" /bin/sh -ec \"$1\"\n"
	cmd := exec.CommandContext(ctx, "unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", setup, "sh", script)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C"}
	return cmd
}

// serveInRoot starts the unit's ExecStart in the root, with the host's
// runsc and ports of its own, and checks that the API answers.
func serveInRoot(t *testing.T, ctx context.Context, root, runsc string) {
	unit, err := os.ReadFile(filepath.Join(root, "lib/systemd/system/lizard.service"))
	if err != nil {
		t.Fatal(err)
	}
	var execStart string
	for _, l := range strings.Split(string(unit), "\n") {
		if v, ok := strings.CutPrefix(l, "ExecStart="); ok {
			execStart = v
		}
	}
	if execStart == "" {
		t.Fatal("no ExecStart in the unit")
	}
	api, proxy := freeAddr(t), freeAddr(t)
	// The config file sets the bridge and subnet, as an operator would.
	cfg := filepath.Join(root, "etc/lizard/lizard.toml")
	orig, _ := os.ReadFile(cfg)
	conf := string(orig) + fmt.Sprintf("\nbridge = %q\nsubnet = %q\nlisten = %q\nproxy-listen = %q\n", pkgBridge, pkgSubnet, api, proxy)
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	defer removeNetwork(t)

	var log bytes.Buffer
	cmd := rootCmd(ctx, root, runsc, "exec "+execStart)
	cmd.Env = append(cmd.Env, "LIZARD_API_KEY=lz_pkgtest_key_0123456789abcdef")
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(budget(15 * time.Second)):
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("lizard serve in the root:\n%s", log.String())
		}
	}()
	deadline := time.Now().Add(budget(60 * time.Second))
	for {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("lizard serve exited: %v", err)
		default:
		}
		req, _ := http.NewRequest("GET", "http://"+api+"/api/projects", nil)
		req.Header.Set("X-API-Key", "lz_pkgtest_key_0123456789abcdef")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("GET /api/projects with the key the first start made: %s", resp.Status)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no answer from lizard serve in the root within %v: %v", budget(60*time.Second), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Its state went where the package's config says.
	if _, err := os.Stat(filepath.Join(root, "var/lib/lizard/lizard.db")); err != nil {
		t.Errorf("database not in the root's /var/lib/lizard: %v", err)
	}
}

// removeNetwork takes down the bridge and firewall table the server made.
func removeNetwork(t *testing.T) {
	m, err := network.New(network.Config{Bridge: pkgBridge, Subnet: netip.MustParsePrefix(pkgSubnet)})
	if err == nil {
		err = m.Remove()
	}
	if err != nil {
		t.Errorf("remove the test network: %v", err)
	}
}

// hostMirror returns the host's Debian mirror for bookworm from
// /etc/apt/sources.list and sources.list.d (one-line and deb822 formats).
func hostMirror() (string, error) {
	files, _ := filepath.Glob("/etc/apt/sources.list.d/*")
	files = append([]string{"/etc/apt/sources.list"}, files...)
	for _, f := range files {
		if !strings.HasSuffix(f, ".list") && !strings.HasSuffix(f, ".sources") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if m := mirrorIn(string(b)); m != "" {
			return m, nil
		}
	}
	return "", fmt.Errorf("no Debian %s mirror in /etc/apt/sources.list*", pkgSuite)
}

// mirrorIn finds a `deb` source of bookworm in one sources file.
func mirrorIn(text string) string {
	var uris, suites []string
	isDeb := false
	stanza := func() string {
		if isDeb && slices.Contains(suites, pkgSuite) && len(uris) > 0 {
			return uris[0]
		}
		return ""
	}
	sc := bufio.NewScanner(strings.NewReader(text + "\n\n"))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			if m := stanza(); m != "" {
				return m
			}
			uris, suites, isDeb = nil, nil, false
			continue
		}
		if strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		switch {
		case f[0] == "deb": // one-line: deb [options] URI suite components
			f = f[1:]
			if len(f) > 0 && strings.HasPrefix(f[0], "[") {
				for len(f) > 0 && !strings.HasSuffix(f[0], "]") {
					f = f[1:]
				}
				f = f[1:]
			}
			if len(f) >= 2 && f[1] == pkgSuite {
				return f[0]
			}
		case strings.EqualFold(f[0], "Types:"):
			isDeb = slices.Contains(f[1:], "deb")
		case strings.EqualFold(f[0], "URIs:"):
			uris = f[1:]
		case strings.EqualFold(f[0], "Suites:"):
			suites = f[1:]
		}
	}
	return ""
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(dst) // resolv.conf may be a dangling link
	if err := os.WriteFile(dst, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func lastLines(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-30):], "\n")
}

func TestMirrorIn(t *testing.T) {
	for _, tc := range []struct{ text, want string }{
		{"deb http://deb.debian.org/debian bookworm main\n", "http://deb.debian.org/debian"},
		{"# deb http://no/ bookworm main\ndeb [arch=amd64 signed-by=/k.gpg] http://m.example/debian bookworm main contrib\n", "http://m.example/debian"},
		{"deb http://sec/ bookworm-security main\ndeb-src http://src/ bookworm main\n", ""},
		{"Types: deb\n# a comment\nURIs: http://a.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\n", "http://a.example/debian"},
		{"Types: deb-src\nURIs: http://src/\nSuites: bookworm\n\nTypes: deb\nURIs: http://b.example/\nSuites: bookworm-security\n", ""},
		{"Types: deb\nURIs: https://deb.nodesource.com/node_20.x\nSuites: nodistro\n\nTypes: deb\nURIs: http://c.example/debian\nSuites: bookworm\n", "http://c.example/debian"},
	} {
		if got := mirrorIn(tc.text); got != tc.want {
			t.Errorf("mirrorIn(%q) = %q, want %q", tc.text, got, tc.want)
		}
	}
}
