package sandbox

import (
	"fmt"
	"sort"
	"strings"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/runtime"
)

// Size is one of the machine sizes the API offers.
type Size struct {
	Name     string
	CPUs     float64
	MemoryMB int64
	Pids     int64
}

// sizes follows the hosted service's table. Pids caps host processes: under
// gVisor's systrap platform every sandbox process is backed by one.
var sizes = map[string]Size{
	"nano":   {"nano", 0.5, 1024, 1024},
	"mini":   {"mini", 1, 2048, 2048},
	"small":  {"small", 2, 4096, 4096},
	"medium": {"medium", 4, 8192, 4096},
	"large":  {"large", 8, 16384, 8192},
	"big":    {"big", 16, 32768, 8192},
}

// DefaultSize is used when a create names none.
const DefaultSize = "medium"

// LookupSize returns the named size, or ErrInvalid listing the valid names.
func LookupSize(name string) (Size, error) {
	if name == "" {
		name = DefaultSize
	}
	s, ok := sizes[name]
	if !ok {
		names := make([]string, 0, len(sizes))
		for n := range sizes {
			names = append(names, n)
		}
		sort.Slice(names, func(i, j int) bool { return sizes[names[i]].CPUs < sizes[names[j]].CPUs })
		return Size{}, errdefs.WithCode("invalid_size", fmt.Errorf("size %q: must be one of %s: %w", name, strings.Join(names, ", "), errdefs.ErrInvalid))
	}
	return s, nil
}

func (s Size) resources() runtime.Resources {
	return runtime.Resources{CPUs: s.CPUs, MemoryMB: s.MemoryMB, Pids: s.Pids}
}
