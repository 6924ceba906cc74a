package template

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestDesktopRecipe(t *testing.T) {
	rec := builtins["desktop"]
	if !slices.Contains(rec.Env, "DISPLAY=:0") {
		t.Errorf("desktop env %v has no DISPLAY=:0: the SDKs' xdotool calls carry none", rec.Env)
	}
	// The chromium wrapper must win over /usr/bin/chromium.
	for _, kv := range rec.Env {
		if p, ok := strings.CutPrefix(kv, "PATH="); ok && !strings.HasPrefix(p, "/usr/local/sbin:/usr/local/bin:") {
			t.Errorf("PATH %q does not put /usr/local/bin before /usr/bin", p)
		}
	}
	if slices.Contains(builtins["base"].Env, "DISPLAY=:0") {
		t.Error("withEnv changed base's environment too")
	}

	rootfs := t.TempDir()
	for _, s := range desktopPost {
		if err := s.Run(context.Background(), rootfs, nil); err != nil {
			t.Fatalf("%s: %v", s.Desc, err)
		}
	}
	for _, p := range []string{"usr/local/bin/chromium", "usr/local/bin/lizard-desktop"} {
		st, err := os.Stat(filepath.Join(rootfs, p))
		if err != nil || st.Mode().Perm() != 0o755 {
			t.Errorf("%s: %v, mode %v", p, err, st)
		}
		if out, err := exec.Command("sh", "-n", filepath.Join(rootfs, p)).CombinedOutput(); err != nil {
			t.Errorf("sh -n %s: %v: %s", p, err, out)
		}
	}
	b, _ := os.ReadFile(filepath.Join(rootfs, "usr/local/bin/chromium"))
	for _, flag := range []string{"--no-sandbox", "--disable-gpu", "--user-data-dir=", "exec /usr/bin/chromium"} {
		if !strings.Contains(string(b), flag) {
			t.Errorf("chromium wrapper lacks %s", flag)
		}
	}
	// Unknown subcommands are a usage error, not a start.
	cmd := exec.Command("sh", filepath.Join(rootfs, "usr/local/bin/lizard-desktop"), "nope")
	if out, err := cmd.CombinedOutput(); cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != 2 || !strings.Contains(string(out), "usage") {
		t.Errorf("lizard-desktop nope: %v: %s", err, out)
	}
}
