package volume

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// TestLend: the files of a volume no sandbox holds are lent mounted on the
// host, and no sandbox attaches it, no resize or delete runs, until the
// call is over; what it wrote is there for the next holder; a held volume
// is not lent, its holder named instead.
func TestLend(t *testing.T) {
	m, pid := newManager(t)
	ctx := context.Background()
	v, err := m.Create(ctx, pid, "lent", 1, "", false)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Delete(ctx, pid, v.ID)
	if len(v.Token) != 64 {
		t.Fatalf("token %q", v.Token)
	}
	if got, err := m.Token(ctx, pid, "lent"); err != nil || got.Token != v.Token {
		t.Fatalf("Token: %q %v, want the one made with it", got.Token, err)
	}
	short := func() context.Context {
		c, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		t.Cleanup(cancel)
		return c
	}
	called := false
	holder, err := m.Lend(ctx, pid, "lent", true, func(dir string) error {
		called = true
		if !mounted(m.mountDir(v.ID)) {
			t.Error("lent but not mounted")
		}
		if _, _, err := m.Attach(short(), pid, v.ID, "sb1"); !errors.Is(err, errdefs.ErrTimeout) {
			t.Errorf("attach of a lent volume: %v, want a wait until its deadline", err)
		}
		if err := m.Delete(short(), pid, v.ID); !errors.Is(err, errdefs.ErrTimeout) {
			t.Errorf("delete of a lent volume: %v", err)
		}
		if _, err := m.Resize(short(), pid, v.ID, 2); !errors.Is(err, errdefs.ErrTimeout) {
			t.Errorf("resize of a lent volume: %v", err)
		}
		// Another call of Lend runs beside it.
		if _, err := m.Lend(ctx, pid, v.ID, false, func(string) error { return nil }); err != nil {
			t.Errorf("a second lend: %v", err)
		}
		if !mounted(m.mountDir(v.ID)) {
			t.Error("the second lend's end unmounted it under the first")
		}
		return os.WriteFile(filepath.Join(dir, "note"), []byte("from the API"), 0o644)
	})
	if err != nil || holder != "" || !called {
		t.Fatalf("Lend: %q %v (called %v)", holder, err, called)
	}
	if mounted(m.mountDir(v.ID)) {
		t.Fatal("still mounted after the lend")
	}
	_, dir, err := m.Attach(ctx, pid, v.ID, "sb1")
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "note")); err != nil || string(b) != "from the API" {
		t.Fatalf("the holder reads %q %v", b, err)
	}
	holder, err = m.Lend(ctx, pid, v.ID, true, func(string) error {
		t.Error("a held volume was lent")
		return nil
	})
	if err != nil || holder != "sb1" {
		t.Fatalf("Lend of a held volume: %q %v", holder, err)
	}
	if err := m.Detach(ctx, "sb1"); err != nil {
		t.Fatal(err)
	}
	fnErr := errors.New("fn failed")
	if _, err := m.Lend(ctx, pid, v.ID, false, func(string) error { return fnErr }); !errors.Is(err, fnErr) {
		t.Fatalf("fn's error: %v", err)
	}
	if _, err := m.Lend(ctx, pid, "nosuch", false, func(string) error { return nil }); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Lend of a missing volume: %v", err)
	}
}
