package disk

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"

	"github.com/lizard-build/lizard/internal/errdefs"
)

func TestGuard(t *testing.T) {
	dir := t.TempDir()
	u, err := Stat(dir)
	if err != nil || u.Total == 0 {
		t.Fatalf("stat: %+v %v", u, err)
	}
	var nilGuard *Guard
	if err := nilGuard.Check(); err != nil {
		t.Fatalf("nil guard: %v", err)
	}
	if err := (&Guard{Dir: dir}).Check(); err != nil {
		t.Fatalf("no watermark: %v", err)
	}
	if u.Free() < 1 {
		// Asking for more than is free is refused, naming the watermark.
		err := (&Guard{Dir: dir, MinFree: u.Free() + (1-u.Free())/2}).Check()
		if !errors.Is(err, errdefs.ErrNoSpace) || errdefs.Code(err) != "insufficient_storage" || !strings.Contains(err.Error(), "watermark") {
			t.Fatalf("above free: %v", err)
		}
	}
	if err := (&Guard{Dir: dir, MinFree: u.Free() / 2}).Check(); err != nil {
		t.Fatalf("below free: %v", err)
	}
}

func TestClassify(t *testing.T) {
	dir := t.TempDir()
	if err := Classify(dir, nil); err != nil {
		t.Fatal(err)
	}
	enospc := fmt.Errorf("write x: %w", syscall.ENOSPC)
	if err := Classify(dir, enospc); !errors.Is(err, errdefs.ErrNoSpace) || errdefs.Code(err) != "insufficient_storage" {
		t.Fatalf("ENOSPC: %v", err)
	}
	other := errors.New("runsc: something else")
	u, _ := Stat(dir)
	if err := Classify(dir, other); u.Avail >= FullBelow && err != other {
		t.Fatalf("other error on a roomy disk became %v", err)
	}
}
