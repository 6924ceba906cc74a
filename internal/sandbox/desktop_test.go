package sandbox

import (
	"errors"
	"testing"

	"github.com/lizard-build/lizard/internal/errdefs"
)

func TestParseDesktopState(t *testing.T) {
	for line, want := range map[string]struct {
		running bool
		size    DesktopSize
	}{
		"running 1280 800": {true, DesktopSize{1280, 800}},
		"running 640 480 ": {true, DesktopSize{640, 480}},
		"stopped":          {false, DesktopSize{}},
	} {
		running, size, err := parseDesktopState(line)
		if err != nil || running != want.running || size != want.size {
			t.Errorf("parseDesktopState(%q) = %v, %v, %v", line, running, size, err)
		}
	}
	for _, line := range []string{"", "running", "running 0 800", "running x 800", "started 1 2", "stopped now"} {
		if _, _, err := parseDesktopState(line); !errors.Is(err, errdefs.ErrUnavailable) {
			t.Errorf("parseDesktopState(%q) = %v, want ErrUnavailable", line, err)
		}
	}
}

func TestValidDesktopSize(t *testing.T) {
	if got, err := ValidDesktopSize(0, 0); err != nil || got != (DesktopSize{DefaultDesktopWidth, DefaultDesktopHeight}) {
		t.Errorf("default = %v, %v", got, err)
	}
	if got, err := ValidDesktopSize(3840, 2160); err != nil || got != (DesktopSize{3840, 2160}) {
		t.Errorf("3840x2160 = %v, %v", got, err)
	}
	for _, wh := range [][2]int{{1024, 0}, {0, 768}, {639, 480}, {640, 479}, {3841, 800}, {1280, 2161}, {-1, -1}} {
		if _, err := ValidDesktopSize(wh[0], wh[1]); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("ValidDesktopSize(%d, %d) = %v, want ErrInvalid", wh[0], wh[1], err)
		}
	}
}

func TestPreviewTokenOf(t *testing.T) {
	r := Record{PreviewToken: "sandbox", PortTokens: map[int]string{6081: "view"}}
	if got := r.previewTokenOf(6081); got != "view" {
		t.Errorf("port with its own token: %q", got)
	}
	if got := r.previewTokenOf(3000); got != "sandbox" {
		t.Errorf("other port: %q", got)
	}
}
