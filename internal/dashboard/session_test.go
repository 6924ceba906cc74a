package dashboard

import (
	"errors"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
)

func TestSessions(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := NewSessions(time.Hour, 10*time.Minute)
	s.now = func() time.Time { return now }

	id, csrf := s.Create("key-a")
	id2, csrf2 := s.Create("key-a")
	if id == id2 || csrf == csrf2 || len(id) < 40 || id == csrf {
		t.Fatalf("ids and tokens must be distinct random values: %q %q %q %q", id, id2, csrf, csrf2)
	}
	key, c, err := s.Session(id)
	if err != nil || key != "key-a" || c != csrf {
		t.Fatalf("Session: %q %q %v", key, c, err)
	}
	if _, _, err := s.Session("nope"); !errors.Is(err, errdefs.ErrUnauthenticated) || errdefs.Code(err) != "session_expired" {
		t.Fatalf("unknown session: %v", err)
	}

	// Idle: a session used every 9 minutes lives until its TTL.
	for range 6 {
		now = now.Add(9 * time.Minute)
		if _, _, err := s.Session(id); err != nil {
			t.Fatalf("used session at %s: %v", now, err)
		}
	}
	if _, _, err := s.Session(id2); err == nil {
		t.Fatal("a session idle for 54 minutes is still live")
	}
	now = now.Add(6 * time.Minute) // 60 minutes after sign-in
	if _, _, err := s.Session(id); err == nil {
		t.Fatal("a session past its TTL is still live")
	}
	if _, ok := s.Expires(id); ok {
		t.Fatal("an expired session is kept")
	}

	id3, _ := s.Create("key-b")
	s.End(id3)
	s.End(id3)
	if _, _, err := s.Session(id3); err == nil {
		t.Fatal("an ended session is live")
	}
}

func TestAssetsWeight(t *testing.T) {
	a, err := NewAssets()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"index.html", "app.js", "style.css", "vendor/xterm.js", "vendor/xterm.css", "vendor/addon-fit.js"} {
		if a.files[f] == nil {
			t.Errorf("asset %s missing", f)
		}
	}
	// The budget: the page weighs under 1 MB compressed.
	if n := a.CompressedSize(); n >= 1<<20 {
		t.Fatalf("assets weigh %d bytes compressed", n)
	}
	t.Logf("assets: %d bytes gzipped", a.CompressedSize())
}
