package desktop

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/sandbox/preview"
	"github.com/lizard-build/lizard/internal/sandbox/sandboxtest"
)

func TestParseState(t *testing.T) {
	for line, want := range map[string]struct {
		running bool
		size    Size
	}{
		"running 1280 800": {true, Size{Width: 1280, Height: 800}},
		"running 640 480 ": {true, Size{Width: 640, Height: 480}},
		"stopped":          {false, Size{}},
	} {
		running, size, err := parseState(line)
		if err != nil || running != want.running || size != want.size {
			t.Errorf("parseState(%q) = %v, %v, %v", line, running, size, err)
		}
	}
	for _, line := range []string{"", "running", "running 0 800", "running x 800", "started 1 2", "stopped now"} {
		if _, _, err := parseState(line); !errors.Is(err, errdefs.ErrUnavailable) {
			t.Errorf("parseState(%q) = %v, want ErrUnavailable", line, err)
		}
	}
}

func TestValidSize(t *testing.T) {
	if got, err := ValidSize(0, 0); err != nil || got != (Size{Width: DefaultWidth, Height: DefaultHeight}) {
		t.Errorf("default = %v, %v", got, err)
	}
	if got, err := ValidSize(3840, 2160); err != nil || got != (Size{Width: 3840, Height: 2160}) {
		t.Errorf("3840x2160 = %v, %v", got, err)
	}
	for _, wh := range [][2]int{{1024, 0}, {0, 768}, {639, 480}, {640, 479}, {3841, 800}, {1280, 2161}, {-1, -1}} {
		if _, err := ValidSize(wh[0], wh[1]); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("ValidSize(%d, %d) = %v, want ErrInvalid", wh[0], wh[1], err)
		}
	}
}

// script stands in for the desktop template's lizard-desktop (the e2e
// tests run the real one): it keeps its state in $HOME/desktop and prints
// it as the real one does.
const script = `#!/bin/sh
f="$HOME/desktop"
case "$1" in
start) [ -f "$f" ] || echo "running $2 $3" > "$f" ;;
stop) rm -f "$f" ;;
status) ;;
*) echo "usage" >&2; exit 2 ;;
esac
if [ -f "$f" ]; then cat "$f"; else echo stopped; fi
`

// TestDesktop, over the fake runtime: start publishes the desktop's two
// pages with tokens of their own and keeps its size; status reads it; stop
// takes the pages off and keeps the tokens; a sandbox without
// lizard-desktop has no desktop; another project's sandbox is not found;
// concurrent starts of one sandbox start one desktop.
func TestDesktop(t *testing.T) {
	env := sandboxtest.NewEnv(t)
	core := sandbox.New(sandbox.Config{Runtime: env.Runtime, Store: env.Store, Templates: env.Templates,
		SnapshotDir: env.SnapshotDir, Logger: sandboxtest.Logger(t)})
	ctx := context.Background()
	if err := core.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(core.Close)
	ports := preview.New(core)
	s := New(core, ports)

	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "lizard-desktop"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	path := bin + ":/usr/local/bin:/usr/bin:/bin"
	pid := env.Project.ID

	plain, err := core.Create(ctx, sandbox.CreateRequest{ProjectID: pid})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Start(ctx, pid, plain.ID, Size{Width: 1024, Height: 768}); !errors.Is(err, errdefs.ErrInvalid) || errdefs.Code(err) != "desktop_not_supported" {
		t.Fatalf("a sandbox without lizard-desktop: %v, want desktop_not_supported", err)
	}

	rec, err := core.Create(ctx, sandbox.CreateRequest{ProjectID: pid, Envs: map[string]string{"PATH": path}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Start(ctx, "prj_other", rec.ID, Size{Width: 1280, Height: 800}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another project's start: %v, want ErrNotFound", err)
	}
	type started struct {
		d   Desktop
		err error
	}
	both := make(chan started, 2)
	for _, w := range []int{1280, 1024} {
		go func() {
			d, err := s.Start(ctx, pid, rec.ID, Size{Width: w, Height: 800})
			both <- started{d, err}
		}()
	}
	first, second := <-both, <-both
	if first.err != nil || second.err != nil {
		t.Fatalf("concurrent starts: %v, %v", first.err, second.err)
	}
	d := first.d
	if !d.Running || d.Size == nil || *d.Size != *second.d.Size || d.Token == "" || d.ViewOnlyToken == "" || d.Token == d.ViewOnlyToken || d.Token != second.d.Token {
		t.Fatalf("concurrent starts: %+v and %+v, want one desktop, the same size and tokens, two tokens", first.d, second.d)
	}
	size := *d.Size
	if tok, err := ports.PreviewToken(rec.ID, Port); err != nil || tok != d.Token {
		t.Fatalf("the desktop's page: token %q %v, want %q", tok, err, d.Token)
	}
	if tok, err := ports.PreviewToken(rec.ID, ViewOnlyPort); err != nil || tok != d.ViewOnlyToken {
		t.Fatalf("the view-only page: token %q %v, want %q", tok, err, d.ViewOnlyToken)
	}
	if got, _ := core.Get(pid, rec.ID); got.Desktop == nil || *got.Desktop != size {
		t.Fatalf("the record keeps %+v, want %+v", got.Desktop, size)
	}
	// A running desktop keeps its size.
	if again, err := s.Start(ctx, pid, rec.ID, Size{Width: 800, Height: 600}); err != nil || *again.Size != size || again.Token != d.Token {
		t.Fatalf("a second start: %+v %v", again, err)
	}
	if st, err := s.State(ctx, pid, rec.ID); err != nil || !st.Running || *st.Size != size {
		t.Fatalf("State: %+v %v", st, err)
	}
	if err := s.Stop(ctx, pid, rec.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := ports.PreviewToken(rec.ID, Port); err == nil {
		t.Fatalf("a stopped desktop's page is still published")
	}
	st, err := s.State(ctx, pid, rec.ID)
	if err != nil || st.Running || st.Size == nil || *st.Size != size || st.Token != d.Token {
		t.Fatalf("after stop: %+v %v, want stopped with the last size and the same token", st, err)
	}
	if _, err := s.State(ctx, "prj_other", rec.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another project's desktop: %v, want ErrNotFound", err)
	}
	if err := s.Stop(ctx, "prj_other", rec.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another project's stop: %v, want ErrNotFound", err)
	}
	if len(s.locks) != 0 {
		t.Fatalf("%d sandbox locks kept after the calls ended", len(s.locks))
	}
	// The next start has the same URLs.
	if again, err := s.Start(ctx, pid, rec.ID, size); err != nil || again.Token != d.Token || again.ViewOnlyToken != d.ViewOnlyToken {
		t.Fatalf("a start after stop: %+v %v, want the same tokens", again, err)
	}
	if err := core.Kill(ctx, pid, rec.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.State(ctx, pid, rec.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("a killed sandbox's desktop: %v, want ErrNotFound", err)
	}
}
