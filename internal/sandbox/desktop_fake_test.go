package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// desktopScript stands in for the desktop template's lizard-desktop (the
// e2e tests run the real one): it keeps its state in $HOME/desktop and
// prints it as the real one does.
const desktopScript = `#!/bin/sh
f="$HOME/desktop"
case "$1" in
start) [ -f "$f" ] || echo "running $2 $3" > "$f" ;;
stop) rm -f "$f" ;;
status) ;;
*) echo "usage" >&2; exit 2 ;;
esac
if [ -f "$f" ]; then cat "$f"; else echo stopped; fi
`

// TestFakeDesktop: start publishes the desktop's two pages with tokens of
// their own and keeps its size; status reads it; stop takes the pages off
// and keeps the tokens; a sandbox without lizard-desktop has no desktop.
func TestFakeDesktop(t *testing.T) {
	env := newFakeEnv(t)
	s := env.service(t, nil)
	ctx := context.Background()
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "lizard-desktop"), []byte(desktopScript), 0o755); err != nil {
		t.Fatal(err)
	}
	path := bin + ":/usr/local/bin:/usr/bin:/bin"

	plain := env.create(t, s, CreateRequest{})
	if _, err := s.StartDesktop(ctx, env.p.ID, plain.ID, DesktopSize{1024, 768}); !errors.Is(err, errdefs.ErrInvalid) || errdefs.Code(err) != "desktop_not_supported" {
		t.Fatalf("a sandbox without lizard-desktop: %v, want desktop_not_supported", err)
	}

	rec := env.create(t, s, CreateRequest{Envs: map[string]string{"PATH": path}})
	d, err := s.StartDesktop(ctx, env.p.ID, rec.ID, DesktopSize{1280, 800})
	if err != nil || !d.Running || d.Size == nil || *d.Size != (DesktopSize{1280, 800}) || d.Token == "" || d.ViewOnlyToken == "" || d.Token == d.ViewOnlyToken {
		t.Fatalf("StartDesktop: %+v %v", d, err)
	}
	if tok, err := s.PreviewToken(rec.ID, DesktopPort); err != nil || tok != d.Token {
		t.Fatalf("the desktop's page: token %q %v, want %q", tok, err, d.Token)
	}
	// A running desktop keeps its size.
	if again, err := s.StartDesktop(ctx, env.p.ID, rec.ID, DesktopSize{800, 600}); err != nil || *again.Size != (DesktopSize{1280, 800}) || again.Token != d.Token {
		t.Fatalf("a second start: %+v %v", again, err)
	}
	if st, err := s.DesktopState(ctx, env.p.ID, rec.ID); err != nil || !st.Running || *st.Size != (DesktopSize{1280, 800}) {
		t.Fatalf("DesktopState: %+v %v", st, err)
	}
	if err := s.StopDesktop(ctx, env.p.ID, rec.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PreviewToken(rec.ID, DesktopPort); err == nil {
		t.Fatalf("a stopped desktop's page is still published")
	}
	st, err := s.DesktopState(ctx, env.p.ID, rec.ID)
	if err != nil || st.Running || st.Size == nil || *st.Size != (DesktopSize{1280, 800}) || st.Token != d.Token {
		t.Fatalf("after stop: %+v %v, want stopped with the last size and the same token", st, err)
	}
	if _, err := s.DesktopState(ctx, "prj_other", rec.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("another project's desktop: %v, want ErrNotFound", err)
	}
}
