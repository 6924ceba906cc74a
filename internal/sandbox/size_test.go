package sandbox

import (
	"errors"
	"testing"

	"github.com/lizard-build/lizard/internal/errdefs"
)

func TestLookupSize(t *testing.T) {
	for name, cpus := range map[string]float64{"": 4, "nano": 0.5, "mini": 1, "small": 2, "medium": 4, "large": 8, "big": 16} {
		s, err := LookupSize(name)
		if err != nil || s.CPUs != cpus || s.MemoryMB != int64(cpus*2048) {
			t.Errorf("%q: %+v %v", name, s, err)
		}
	}
	if _, err := LookupSize("huge"); !errors.Is(err, errdefs.ErrInvalid) || errdefs.Code(err) != "invalid_size" {
		t.Errorf("unknown size: %v", err)
	}
}

func TestMergeEnv(t *testing.T) {
	got := mergeEnv([]string{"PATH=/bin", "A=1"}, map[string]string{"A": "2", "B": "3"})
	if got["PATH"] != "/bin" || got["A"] != "2" || got["B"] != "3" {
		t.Fatalf("%v", got)
	}
}
