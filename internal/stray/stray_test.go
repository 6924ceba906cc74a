package stray

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

// TestRemoveDirKillsWhatIsLeft: a cgroup that still holds a process is
// removed: RemoveDir kills what its cgroup.procs lists and waits for it.
func TestRemoveDirKillsWhatIsLeft(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: makes a cgroup")
	}
	root := "/sys/fs/cgroup/pids" // cgroup v1
	if _, err := os.Stat(root); err != nil {
		root = "/sys/fs/cgroup" // v2
	}
	dir := filepath.Join(root, "lizard-stray-test-"+strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skipf("cannot make a cgroup here: %v", err)
	}
	t.Cleanup(func() { os.Remove(dir) })
	cmd := exec.Command("sleep", "1000")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }() // reaps it once killed
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		cmd.Process.Kill()
		t.Fatal(err)
	}
	if err := RemoveDir(dir); err != nil {
		cmd.Process.Kill()
		t.Fatalf("RemoveDir of a cgroup with a process in it: %v", err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("the cgroup is still there: %v", err)
	}
	if err := <-exited; err == nil {
		t.Fatal("the process in the cgroup was not killed")
	}
	if err := RemoveDir(dir); err != nil {
		t.Fatalf("RemoveDir of a missing directory: %v", err)
	}
}
