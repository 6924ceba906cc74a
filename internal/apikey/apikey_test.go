package apikey

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/store"
	"github.com/lizard-build/lizard/internal/store/sqlite"
)

// counting is the real store, counting the calls that reach it.
type counting struct {
	*sqlite.Store
	calls atomic.Int64
}

func (c *counting) KeyGeneration(ctx context.Context) (int64, error) {
	c.calls.Add(1)
	return c.Store.KeyGeneration(ctx)
}

func (c *counting) ActiveKeys(ctx context.Context) ([]store.ActiveKey, error) {
	c.calls.Add(1)
	return c.Store.ActiveKeys(ctx)
}

func (c *counting) TouchKeys(ctx context.Context, used map[string]time.Time) error {
	c.calls.Add(1)
	return c.Store.TouchKeys(ctx, used)
}

// openDB opens a new SQLite database with one project; the handle closes
// with the test. The path opens other handles (as the CLI would).
func openDB(t *testing.T) (path string, st *sqlite.Store, p store.Project) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "lizard.db")
	st = openHandle(t, path)
	p, err := st.CreateProject(context.Background(), "p", "")
	if err != nil {
		t.Fatal(err)
	}
	return path, st, p
}

func openHandle(t *testing.T, path string) *sqlite.Store {
	t.Helper()
	st, err := sqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func TestSet(t *testing.T) {
	ctx := context.Background()
	path, st, p := openDB(t)
	secret, err := st.CreateKey(ctx, p.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	cs := &counting{Store: st}
	// Polls and flushes only when the test says: a long period, and
	// refresh/flush called directly; a clock that stands still, so that
	// unknown keys reach the store exactly MissChecks times.
	now := time.Now()
	set, err := Open(ctx, Config{Store: cs, Poll: time.Hour, Flush: time.Hour, MissChecks: 2, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	defer set.Close()

	k, err := set.Lookup(secret)
	if err != nil || k.Project != p {
		t.Fatalf("lookup: %+v %v", k, err)
	}
	before := cs.calls.Load()
	for _, bad := range []string{"", "lz_unknown_0123456789", secret + "x"} {
		if _, err := set.Lookup(bad); !errors.Is(err, errdefs.ErrUnauthenticated) {
			t.Fatalf("lookup %q: %v", bad, err)
		}
	}
	if _, err := set.Lookup(secret); err != nil {
		t.Fatal(err)
	}
	// The first two unknown keys each read the generation (it did not
	// move: no reload); the third finds the checks spent.
	if n := cs.calls.Load() - before; n != 2 {
		t.Fatalf("lookups made %d store calls, want 2 (MissChecks)", n)
	}
	before = cs.calls.Load()

	// Another process (the CLI) revokes on the same database.
	cli := openHandle(t, path)
	if err := set.refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if n := cs.calls.Load() - before; n != 1 {
		t.Fatalf("a refresh without changes made %d store calls, want 1 (the generation)", n)
	}
	if err := cli.RevokeKey(ctx, k.ID); err != nil {
		t.Fatal(err)
	}
	second, err := cli.CreateKey(ctx, p.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := set.refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := set.Lookup(secret); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Fatalf("revoked key: %v", err)
	}
	k2, err := set.Lookup(second)
	if err != nil {
		t.Fatalf("new key: %v", err)
	}

	set.flush(ctx)
	ks, _ := cli.Keys(ctx, p.ID)
	if len(ks) != 2 || ks[0].LastUsed == nil || ks[1].ID != k2.ID || ks[1].LastUsed == nil {
		t.Fatalf("last used not recorded: %+v", ks)
	}
}

// TestSetFollows: the running poller picks up a revocation by itself.
func TestSetFollows(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "lizard.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	p, _ := st.CreateProject(ctx, "p", "")
	secret, _ := st.CreateKey(ctx, p.ID, "")
	set, err := Open(ctx, Config{Store: st, Poll: 10 * time.Millisecond, Flush: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	k, err := set.Lookup(secret)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.RevokeKey(ctx, k.ID); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := set.Lookup(secret); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the revocation was not picked up")
		}
		time.Sleep(5 * time.Millisecond)
	}
	set.Close()
	ks, _ := st.Keys(ctx, p.ID)
	if ks[0].LastUsed == nil {
		t.Fatal("Close did not write the last use")
	}
}

// TestSetUnknownKey: a key created by another process works at its first
// use, found by one database check; a flood of unknown keys reaches the
// database at most MissChecks times a second.
func TestSetUnknownKey(t *testing.T) {
	ctx := context.Background()
	path, st, p := openDB(t)
	cs := &counting{Store: st}
	var clock atomic.Int64 // seconds after start
	start := time.Now()
	now := func() time.Time { return start.Add(time.Duration(clock.Load()) * time.Second) }
	set, err := Open(ctx, Config{Store: cs, Poll: time.Hour, Flush: time.Hour, MissChecks: 3, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	defer set.Close()

	cli := openHandle(t, path)
	fresh, err := cli.CreateKey(ctx, p.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	if k, err := set.Lookup(fresh); err != nil || k.Project != p {
		t.Fatalf("a key created by the CLI, at its first use: %+v %v", k, err)
	}

	// A flood from many goroutines: two checks are left this second.
	before := cs.calls.Load()
	var wg sync.WaitGroup
	var accepted atomic.Int64
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				if _, err := set.Lookup(fmt.Sprintf("lz_bad_%d_%d", g, i)); err == nil {
					accepted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if n := cs.calls.Load() - before; n != 2 || accepted.Load() != 0 {
		t.Fatalf("1600 unknown keys: %d store calls (want 2), %d accepted", n, accepted.Load())
	}

	// With the checks spent, a new key waits for the poll, or the next
	// second's checks.
	later, err := cli.CreateKey(ctx, p.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := set.Lookup(later); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Fatalf("a new key with the checks spent: %v, want refused until the next check", err)
	}
	clock.Add(1)
	if _, err := set.Lookup(later); err != nil {
		t.Fatalf("a new key a second later: %v", err)
	}
}
