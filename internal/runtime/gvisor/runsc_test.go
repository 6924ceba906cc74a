package gvisor

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// TestRunscFailureKeepsOutputInLog: a runsc command that fails is
// ErrUnavailable whose client message has nothing of what runsc printed
// (host paths); the whole error, for the log, has it. Runs without runsc:
// a script stands in for it.
func TestRunscFailureKeepsOutputInLog(t *testing.T) {
	dir := t.TempDir()
	fake := filepath.Join(dir, "runsc")
	script := "#!/bin/sh\necho 'open /var/lib/lizard/sandboxes/sbx1/bundle: permission denied' >&2\nexit 1\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	r := &Runtime{cfg: Config{Runsc: fake, RunscRoot: dir, Platform: "systrap", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}}
	err := r.runsc(context.Background(), nil, "start", "sbx1")
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("runsc failure: %v, want ErrUnavailable", err)
	}
	if !strings.Contains(err.Error(), "/var/lib/lizard/sandboxes") {
		t.Fatalf("error %q lost runsc's output (the log needs it)", err)
	}
	if msg := errdefs.ClientMessage(err); strings.Contains(msg, "/var/lib") || strings.Contains(msg, "permission denied") {
		t.Fatalf("client message %q carries runsc's output", msg)
	}
}

// TestCompatibleHidesImagePath: a checkpoint refused here names why to the
// client, not where its image is on this host.
func TestCompatibleHidesImagePath(t *testing.T) {
	r := &Runtime{}
	r.build.once.Do(func() {
		r.build.m = Manifest{RunscVersion: "runsc version release-20250101.0", RunscDigest: "sha256:aa"}
	})
	dir := t.TempDir()
	if err := writeJSON(filepath.Join(dir, manifestFile), Manifest{RunscVersion: "runsc version release-20240101.0", RunscDigest: "sha256:bb"}); err != nil {
		t.Fatal(err)
	}
	err := r.compatible(context.Background(), dir)
	msg := errdefs.ClientMessage(err)
	if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(msg, "release-20240101.0") || strings.Contains(msg, dir) || !strings.Contains(err.Error(), dir) {
		t.Fatalf("refusal %q (client %q): want a conflict naming the build, the image's path in the log only", err, msg)
	}
}
