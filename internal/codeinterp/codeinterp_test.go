package codeinterp

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

// TestProgramCompiles: the embedded server is valid Python (the template's
// interpreter is Debian's python3, as on the hosts lizard supports).
func TestProgramCompiles(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatal("python3 is needed to check the embedded server:", err)
	}
	src := filepath.Join(t.TempDir(), "server.py")
	if err := os.WriteFile(src, Program(), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(py, "-m", "py_compile", src).CombinedOutput(); err != nil {
		t.Fatalf("py_compile: %v\n%s", err, out)
	}
}

func TestCommands(t *testing.T) {
	if !slices.Contains(StartCommand(), SandboxPath) || !slices.Contains(StartCommand(), TokenFile) {
		t.Errorf("start command %q does not run %s with %s", StartCommand(), SandboxPath, TokenFile)
	}
	if rc := ReadyCommand(); rc[len(rc)-1] != "http://127.0.0.1:49999/health" {
		t.Errorf("ready command %q", rc)
	}
	if r := Revision(); len(r) != 12 || r != Revision() {
		t.Errorf("revision %q", r)
	}
}
