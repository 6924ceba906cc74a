package gvisor

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"

	"github.com/lizard-build/lizard/internal/cgroup"
	"github.com/lizard-build/lizard/internal/runtime"
)

var _ runtime.UsageReporter = (*Runtime)(nil)

// Usage implements runtime.UsageReporter: CPU and memory from the
// sandbox's cgroup, network bytes from the host end of its veth (what the
// sandbox received is what the host end sent), disk from the blocks its
// overlay's file holds (it is sparse).
func (r *Runtime) Usage(id string) (runtime.Usage, error) {
	st, err := r.readState(id)
	if err != nil {
		return runtime.Usage{}, err
	}
	cg, err := cgroup.Read(cgroup.Root, r.cgroupPath(id))
	if err != nil {
		return runtime.Usage{}, err
	}
	u := runtime.Usage{CPUNanos: cg.CPUNanos, MemoryBytes: cg.MemoryBytes, MemoryLimit: cg.MemoryLimit, DiskLimit: st.DiskMB << 20}
	// From netlink, which answers for this process's network namespace;
	// /sys/class/net is the one's that mounted sysfs, not this server's
	// when it runs in a namespace of its own (nodes sharing a host).
	veth, err := netlink.LinkByName(st.Endpoint.HostVeth)
	if err != nil {
		return runtime.Usage{}, fmt.Errorf("veth %s: %w", st.Endpoint.HostVeth, err)
	}
	if ls := veth.Attrs().Statistics; ls != nil {
		u.RxBytes, u.TxBytes = ls.TxBytes, ls.RxBytes
	}
	u.DiskBytes = overlayUsed(r.cgroupPath(id), filepath.Join(r.dir(id), "overlay"))
	return u, nil
}

// overlayUsed is the space the sandbox's writable layer takes on disk. runsc
// unlinks the overlay's file ("filestore") in dir right after creating it,
// so it is found among the open files of the sandbox's processes (those of
// its cgroup, cgroupPath); the files still in dir are counted when none
// holds one.
func overlayUsed(cgroupPath, dir string) int64 {
	pids, _ := cgroup.Procs(cgroup.Root, cgroupPath)
	for _, pid := range pids {
		fdDir := "/proc/" + strconv.Itoa(pid) + "/fd"
		fds, err := os.ReadDir(fdDir)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			link, err := os.Readlink(filepath.Join(fdDir, fd.Name()))
			if err != nil || !strings.HasPrefix(link, dir+"/") {
				continue
			}
			var st syscall.Stat_t
			if syscall.Stat(filepath.Join(fdDir, fd.Name()), &st) == nil {
				return st.Blocks * 512
			}
		}
	}
	return diskUsed(dir)
}

// diskUsed is the space the files under dir take on disk.
func diskUsed(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			n += st.Blocks * 512
		}
		return nil
	})
	return n
}
