// Package objtest is the conformance suite every objstore backend passes:
// Run it from the backend's tests with a fresh, empty store.
package objtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/objstore"
)

// onlyReader hides any Len/Seek/WriterTo of a reader, so that a backend
// sees a stream of unknown length.
type onlyReader struct{ r io.Reader }

func (o onlyReader) Read(p []byte) (int, error) { return o.r.Read(p) }

// Run runs the suite against s, which must be empty. large is the size of
// the object that must take a multipart upload (several of the backend's
// parts).
func Run(t *testing.T, s objstore.Store, large int) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 1))
	random := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	get := func(t *testing.T, key string, off, n int64) []byte {
		t.Helper()
		rc, err := s.Get(ctx, key, off, n)
		if err != nil {
			t.Fatalf("get %s [%d,+%d]: %v", key, off, n, err)
		}
		defer rc.Close()
		b, err := io.ReadAll(rc)
		if err != nil {
			t.Fatalf("read %s: %v", key, err)
		}
		return b
	}

	t.Run("PutGetStat", func(t *testing.T) {
		data := random(1000)
		info, err := s.Put(ctx, "a/small", onlyReader{bytes.NewReader(data)})
		if err != nil {
			t.Fatal(err)
		}
		if info.Key != "a/small" || info.Size != int64(len(data)) {
			t.Fatalf("put info %+v", info)
		}
		if got := get(t, "a/small", 0, -1); !bytes.Equal(got, data) {
			t.Fatalf("get: %d bytes, not what was put", len(got))
		}
		st, err := s.Stat(ctx, "a/small")
		if err != nil || st.Size != int64(len(data)) || st.Key != "a/small" || st.Modified.IsZero() {
			t.Fatalf("stat = %+v, %v", st, err)
		}
	})
	t.Run("Empty", func(t *testing.T) {
		if _, err := s.Put(ctx, "a/empty", onlyReader{bytes.NewReader(nil)}); err != nil {
			t.Fatal(err)
		}
		st, err := s.Stat(ctx, "a/empty")
		if err != nil || st.Size != 0 {
			t.Fatalf("stat = %+v, %v", st, err)
		}
	})
	t.Run("Ranges", func(t *testing.T) {
		data := random(4096)
		if _, err := s.Put(ctx, "a/ranges", bytes.NewReader(data)); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct{ off, n int64 }{{0, 1}, {0, 10}, {100, 1}, {100, 1000}, {4000, -1}, {4095, 1}, {4000, 96}} {
			want := data[c.off:]
			if c.n >= 0 {
				want = want[:c.n]
			}
			if got := get(t, "a/ranges", c.off, c.n); !bytes.Equal(got, want) {
				t.Errorf("range %d+%d: %d bytes, want %d", c.off, c.n, len(got), len(want))
			}
		}
		if _, err := s.Get(ctx, "a/ranges", 5000, 10); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("range past the end: %v, want ErrInvalid", err)
		}
	})
	t.Run("Replace", func(t *testing.T) {
		for i := range 2 {
			data := random(100 + i)
			if _, err := s.Put(ctx, "a/replace", bytes.NewReader(data)); err != nil {
				t.Fatal(err)
			}
			if got := get(t, "a/replace", 0, -1); !bytes.Equal(got, data) {
				t.Fatalf("round %d: not the last put", i)
			}
		}
	})
	t.Run("Missing", func(t *testing.T) {
		if _, err := s.Stat(ctx, "nope"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("stat: %v, want ErrNotFound", err)
		}
		if _, err := s.Get(ctx, "nope", 0, -1); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("get: %v, want ErrNotFound", err)
		}
		if err := s.Delete(ctx, "nope"); err != nil {
			t.Errorf("delete: %v, want nil", err)
		}
	})
	t.Run("Large", func(t *testing.T) {
		data := random(large)
		info, err := s.Put(ctx, "b/large", onlyReader{bytes.NewReader(data)})
		if err != nil {
			t.Fatal(err)
		}
		if info.Size != int64(large) {
			t.Fatalf("size %d, want %d", info.Size, large)
		}
		if got := get(t, "b/large", 0, -1); !bytes.Equal(got, data) {
			t.Fatal("large object differs")
		}
		off := int64(large/2 - 7)
		if got := get(t, "b/large", off, 1<<20); !bytes.Equal(got, data[off:off+1<<20]) {
			t.Fatal("range across parts differs")
		}
	})
	t.Run("FailedPutLeavesNothing", func(t *testing.T) {
		r := io.MultiReader(bytes.NewReader(random(large)), errReader{})
		if _, err := s.Put(ctx, "b/failed", onlyReader{r}); err == nil {
			t.Fatal("put of a failing reader succeeded")
		}
		if _, err := s.Stat(ctx, "b/failed"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("stat after a failed put: %v, want ErrNotFound", err)
		}
	})
	t.Run("ListDelete", func(t *testing.T) {
		var want []string
		for i := range 12 {
			k := fmt.Sprintf("c/%02d/x", i)
			want = append(want, k)
			if _, err := s.Put(ctx, k, bytes.NewReader([]byte{byte(i)})); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.Put(ctx, "cx", bytes.NewReader(nil)); err != nil {
			t.Fatal(err)
		}
		var got []string
		err := s.List(ctx, "c/", func(i objstore.Info) error {
			if i.Size != 1 {
				return fmt.Errorf("%s: size %d", i.Key, i.Size)
			}
			got = append(got, i.Key)
			return nil
		})
		if err != nil || !slices.Equal(got, want) {
			t.Fatalf("list c/ = %v, %v; want %v", got, err, want)
		}
		stop := errors.New("stop")
		n := 0
		if err := s.List(ctx, "c/", func(objstore.Info) error { n++; return stop }); !errors.Is(err, stop) || n != 1 {
			t.Fatalf("list stopped by fn: %v after %d", err, n)
		}
		var wg sync.WaitGroup
		errs := make([]error, len(want))
		for i, k := range want {
			wg.Go(func() { errs[i] = s.Delete(ctx, k) })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		got = nil
		s.List(ctx, "c/", func(i objstore.Info) error { got = append(got, i.Key); return nil })
		if len(got) != 0 {
			t.Fatalf("after delete: %v", got)
		}
		if _, err := s.Stat(ctx, "cx"); err != nil {
			t.Fatalf("cx, outside the prefix: %v", err)
		}
	})
	t.Run("Canceled", func(t *testing.T) {
		cctx, ccancel := context.WithCancel(ctx)
		ccancel()
		if _, err := s.Put(cctx, "d/canceled", bytes.NewReader(random(10))); err == nil {
			t.Fatal("put with a canceled context succeeded")
		}
	})
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("reader broke") }
