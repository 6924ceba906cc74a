package network

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// errBoundBefore: the namespace directory is not a mount point of its own
// but namespaces are bound in it already, which a bind over it would hide.
var errBoundBefore = errors.New("namespaces are bound in it already; it is left as it is (run `ip netns add` once at boot, before lizard, to make it one)")

// ensureMountPoint makes dir (/run/netns) a shared mount point of its own,
// as iproute2's `ip netns add` does the first time it runs, before any
// namespace is bound in it. Otherwise the first `ip netns add` on the host
// after lizard's first sandbox (an operator's, a CNI plugin's, a test's)
// binds dir over itself and hides the namespaces lizard bound there
// before: their paths then name nothing, and a destroy can neither unmount
// nor remove them ("not mounted", "device or resource busy"). When dir is
// no mount point but holds bound namespaces already (an older server's
// sandboxes), it is left as it is (errBoundBefore): a bind now would hide
// them the same way.
func ensureMountPoint(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if err == nil {
		return nil // a mount point already
	}
	if !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("make %s shared: %w", dir, err)
	}
	if n, err := mountsBelow(dir); err != nil || n > 0 {
		if err != nil {
			return err
		}
		return fmt.Errorf("%s: %w", dir, errBoundBefore)
	}
	if err := unix.Mount(dir, dir, "none", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s over itself: %w", dir, err)
	}
	if err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("make %s shared: %w", dir, err)
	}
	return nil
}

// mountsBelow counts the mount points under dir (not dir itself).
func mountsBelow(dir string) (int, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) > 4 && strings.HasPrefix(fields[4], dir+"/") {
			n++
		}
	}
	return n, sc.Err()
}
