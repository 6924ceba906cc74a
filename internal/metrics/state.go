package metrics

import (
	"bufio"
	"bytes"
	"os"
	goruntime "runtime"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
)

// Sandbox is what a scrape needs to know of one live sandbox.
type Sandbox struct {
	State    string // the service's status: running, paused, pooled, …
	Template string
	CPUs     float64
	MemoryMB int64
}

// Pool is one snapshot's warm pool.
type Pool struct {
	Ready  int // copies restored and waiting
	Target int // copies it keeps when not paused
}

// Inventory is what the server holds now. The sandbox service implements
// it; it is asked on every scrape.
type Inventory interface {
	Sandboxes() []Sandbox
	WarmPools() []Pool
}

// Reservations is what live sandboxes hold of the node's CPUs and memory.
// An admission component with its own bookkeeping can stand in for
// ReservedBy.
type Reservations interface {
	Reserved() (cpus float64, memoryMB int64)
}

// holding says whether a sandbox in this state holds its size's CPU and
// memory: a paused one has given them back.
func holding(state string) bool { return state != "paused" }

// ReservedBy computes reservations from the sizes of inv's sandboxes.
func ReservedBy(inv Inventory) Reservations { return sizeReservations{inv} }

type sizeReservations struct{ inv Inventory }

func (r sizeReservations) Reserved() (cpus float64, memoryMB int64) {
	for _, sb := range r.inv.Sandboxes() {
		if holding(sb.State) {
			cpus += sb.CPUs
			memoryMB += sb.MemoryMB
		}
	}
	return cpus, memoryMB
}

// StateConfig is what the state collector reads on a scrape.
type StateConfig struct {
	Inventory    Inventory
	Reservations Reservations // nil: ReservedBy(Inventory)
	DataDir      string       // its filesystem's use is exported
	MaxSandboxes int
}

type stateCollector struct {
	cfg StateConfig

	sandboxes, poolReady, poolTarget, pools      *prometheus.Desc
	nodeCPUs, nodeMemory, maxSandboxes           *prometheus.Desc
	reservedCPUs, reservedMemory, disk, diskFree *prometheus.Desc
}

// NewStateCollector makes the collector of what is state rather than
// events; register it with Metrics.Register.
func NewStateCollector(cfg StateConfig) prometheus.Collector {
	if cfg.Reservations == nil {
		cfg.Reservations = ReservedBy(cfg.Inventory)
	}
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	return &stateCollector{
		cfg:            cfg,
		sandboxes:      d("lizard_sandboxes", "Live sandboxes by state and template (warm pool copies are state pooled).", "state", "template"),
		pools:          d("lizard_warm_pools", "Snapshots that keep a warm pool."),
		poolReady:      d("lizard_warm_pool_ready_sandboxes", "Warm pool copies restored and waiting to be claimed, over all pools."),
		poolTarget:     d("lizard_warm_pool_target_sandboxes", "Warm pool copies the pools want, over all pools."),
		nodeCPUs:       d("lizard_node_cpus", "CPUs of this node."),
		nodeMemory:     d("lizard_node_memory_bytes", "Memory of this node."),
		maxSandboxes:   d("lizard_node_max_sandboxes", "Most sandboxes this node runs at once."),
		reservedCPUs:   d("lizard_node_reserved_cpus", "CPUs the live sandboxes' sizes reserve (paused ones reserve none)."),
		reservedMemory: d("lizard_node_reserved_memory_bytes", "Memory the live sandboxes' sizes reserve (paused ones reserve none)."),
		disk:           d("lizard_data_dir_filesystem_bytes", "Size and use of the filesystem holding the data directory.", "kind"),
		diskFree:       d("lizard_data_dir_filesystem_available_bytes", "Space left to lizard on the data directory's filesystem."),
	}
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.sandboxes, c.pools, c.poolReady, c.poolTarget, c.nodeCPUs, c.nodeMemory, c.maxSandboxes, c.reservedCPUs, c.reservedMemory, c.disk, c.diskFree} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	type key struct{ state, template string }
	counts := map[key]int{}
	for _, sb := range c.cfg.Inventory.Sandboxes() {
		counts[key{sb.State, sb.Template}]++
	}
	for k, n := range counts {
		gauge(c.sandboxes, float64(n), k.state, k.template)
	}
	var ready, target int
	pools := c.cfg.Inventory.WarmPools()
	for _, p := range pools {
		ready += p.Ready
		target += p.Target
	}
	gauge(c.pools, float64(len(pools)))
	gauge(c.poolReady, float64(ready))
	gauge(c.poolTarget, float64(target))

	gauge(c.nodeCPUs, float64(goruntime.NumCPU()))
	if mem, ok := memTotal(); ok {
		gauge(c.nodeMemory, float64(mem))
	}
	if c.cfg.MaxSandboxes > 0 {
		gauge(c.maxSandboxes, float64(c.cfg.MaxSandboxes))
	}
	cpus, memMB := c.cfg.Reservations.Reserved()
	gauge(c.reservedCPUs, cpus)
	gauge(c.reservedMemory, float64(memMB<<20))

	var fs unix.Statfs_t
	if c.cfg.DataDir != "" && unix.Statfs(c.cfg.DataDir, &fs) == nil {
		bs := float64(fs.Bsize)
		gauge(c.disk, float64(fs.Blocks)*bs, "size")
		gauge(c.disk, float64(fs.Blocks-fs.Bfree)*bs, "used")
		gauge(c.diskFree, float64(fs.Bavail)*bs)
	}
}

// memTotal is MemTotal of /proc/meminfo in bytes.
func memTotal() (int64, bool) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, false
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == "MemTotal:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			return kb << 10, err == nil
		}
	}
	return 0, false
}
