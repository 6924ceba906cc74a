package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/objstore"
	"github.com/lizard-build/lizard/internal/objstore/s3"
	"github.com/lizard-build/lizard/internal/objstore/vgwtest"
)

// The durable measurements (--object-store, a versitygw on loopback): pause
// → durable, the image's size beside what was uploaded, and resume from
// the object store → first exec beside resume from the local image, for
// an idle sandbox and one holding 256 MiB.

type durableRow struct {
	name                      string
	durable, local, fromStore []time.Duration
	image, stored             int64 // of the last pause: its size, its new blobs
}

// withObjectStore runs f with a server whose object store is a versitygw
// of the bench's own on loopback, and that store.
func withObjectStore(ctx context.Context, cfg config, f func(srv *server, st objstore.Store) error) error {
	gw, err := vgwtest.Start(ctx)
	if err != nil {
		return err
	}
	defer gw.Close()
	creds := filepath.Join(os.TempDir(), fmt.Sprintf("lizard-bench-creds-%d", os.Getpid()))
	if err := os.WriteFile(creds, []byte("[default]\naws_access_key_id = "+gw.AccessKey+"\naws_secret_access_key = "+gw.SecretKey+"\n"), 0o600); err != nil {
		return err
	}
	defer os.Remove(creds)
	url := gw.URL("bench") + "&credentials-file=" + creds
	st, err := s3.Open(url)
	if err != nil {
		return err
	}
	srv, err := startServer(ctx, cfg, "--object-store", url)
	if err != nil {
		return err
	}
	defer srv.stop()
	return f(srv, st)
}

func benchDurable(ctx context.Context, cfg config, w io.Writer, n int) error {
	return withObjectStore(ctx, cfg, func(srv *server, st objstore.Store) error {
		return benchDurableIn(w, srv, st, n)
	})
}

func benchDurableIn(w io.Writer, srv *server, st objstore.Store, n int) error {
	var rows []durableRow
	for _, big := range []bool{false, true} {
		r, err := benchDurableOne(srv, st, n, big)
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "measured %s\n", r.name)
		rows = append(rows, r)
	}
	changed, err := benchDurableChanged(srv, st, n)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "durable (versitygw on loopback)\tn\tpause→durable p50\tp95\tresume local→exec p50\tfrom object store→exec p50\tp95\timage\tuploaded\t")
	for _, r := range rows {
		d, l, f := stats(r.durable), stats(r.local), stats(r.fromStore)
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%.1f MiB\t%.1f MiB\t\n", r.name, len(r.durable), ms(d[1]), ms(d[2]),
			ms(l[1]), ms(f[1]), ms(f[2]), float64(r.image)/(1<<20), float64(r.stored)/(1<<20))
	}
	tw.Flush()
	fmt.Fprintln(w, "pause→durable: from POST pause until GET shows durableAt (upload of zstd chunks in the background); uploaded: the new blobs of the last pause (the first pause stores the whole image); from object store: the local image removed before the resume")
	fmt.Fprintln(w)
	printChanged(w, changed)
	return nil
}

func benchDurableOne(s *server, st objstore.Store, n int, big bool) (durableRow, error) {
	r := durableRow{name: "idle"}
	if big {
		r.name = "256 MiB"
	}
	id, kill, err := createHolding(s, big)
	if err != nil {
		return r, err
	}
	defer kill()
	image := filepath.Join(s.dataDir, "sandboxes", id, "checkpoint")
	for i := range 2 * n {
		// Even runs resume from the local image, odd ones from the store.
		before := blobSet(st)
		t := time.Now()
		if err := s.post("/api/sandboxes/"+id+"/pause", nil, nil); err != nil {
			return r, err
		}
		if err := waitDurable(s, id); err != nil {
			return r, err
		}
		r.durable = append(r.durable, time.Since(t))
		r.image, r.stored = dirSize(image), 0
		for k, size := range blobSet(st) {
			if _, ok := before[k]; !ok {
				r.stored += size
			}
		}
		remote := i%2 == 1
		if remote {
			if err := os.RemoveAll(image); err != nil {
				return r, err
			}
		}
		t = time.Now()
		if err := s.post("/api/sandboxes/"+id+"/resume", nil, nil); err != nil {
			return r, err
		}
		if err := s.execTrue(id); err != nil {
			return r, err
		}
		if remote {
			r.fromStore = append(r.fromStore, time.Since(t))
		} else {
			r.local = append(r.local, time.Since(t))
		}
		if err := waitRetired(st, id); err != nil {
			return r, err
		}
	}
	return r, nil
}

// waitRetired waits until the pause image of sandbox id, resumed, is
// retired in the background (its manifest gone, its blobs kept as the base
// of its next upload), so that the next pause's upload is measured alone.
func waitRetired(st objstore.Store, id string) error {
	key := "images/sandboxes/" + id + "/manifest.json"
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if _, err := st.Stat(context.Background(), key); errors.Is(err, errdefs.ErrNotFound) {
			return nil
		}
	}
	return fmt.Errorf("%s still there a minute after the resume", key)
}

// holdChanging keeps 256 MiB of incompressible memory and, each time
// /tmp/change holds a fraction, overwrites that fraction of it (one run at
// a random offset) with new random bytes, then removes the file.
const holdChanging = `nohup python3 -c '
import os, random, time
b = bytearray(os.urandom(256 << 20))
while True:
    try:
        f = float(open("/tmp/change").read())
    except (OSError, ValueError):
        time.sleep(0.02)
        continue
    n = int(len(b) * f)
    at = random.randrange(len(b) - n + 1)
    b[at:at + n] = os.urandom(n)
    os.remove("/tmp/change")
' >/dev/null 2>&1 & sleep 3`

// changeMemory has the holder of sandbox id change frac of its memory and
// waits until it did.
func changeMemory(s *server, id string, frac float64) error {
	cmd := fmt.Sprintf("echo %g > /tmp/change; for i in $(seq 600); do [ -e /tmp/change ] || exit 0; sleep 0.05; done; exit 1", frac)
	var out struct {
		ExitCode int `json:"exitCode"`
	}
	if err := s.call("POST", "/api/sandboxes/"+id+"/exec", map[string]any{"cmd": cmd}, &out); err != nil {
		return err
	}
	if out.ExitCode != 0 {
		return fmt.Errorf("the holder did not change %g of its memory in 30 s", frac)
	}
	return nil
}

// changedRow is pauses of a 256 MiB sandbox after it changed a fraction
// of its memory since its last pause.
type changedRow struct {
	frac            float64
	local, durable  []time.Duration
	uploaded, image []int64
}

// benchDurableChanged measures, for a sandbox holding 256 MiB, a pause
// after a resume that changed 0%, 1%, 10% and 100% of that memory: the
// local pause (the POST), pause → durable, and the bytes the upload stored
// (new blobs: the rest are the chunks of the resumed image, its base).
func benchDurableChanged(s *server, st objstore.Store, n int) ([]changedRow, error) {
	id, err := s.create()
	if err != nil {
		return nil, err
	}
	defer s.kill(id)
	if err := s.post("/api/sandboxes/"+id+"/exec", map[string]any{"cmd": holdChanging}, nil); err != nil {
		return nil, err
	}
	// The first pause uploads the whole image: it is no row.
	if err := s.post("/api/sandboxes/"+id+"/pause", nil, nil); err != nil {
		return nil, err
	}
	if err := waitDurable(s, id); err != nil {
		return nil, err
	}
	image := filepath.Join(s.dataDir, "sandboxes", id, "checkpoint")
	var rows []changedRow
	for _, frac := range []float64{0, 0.01, 0.1, 1} {
		r := changedRow{frac: frac}
		for range n {
			if err := s.post("/api/sandboxes/"+id+"/resume", nil, nil); err != nil {
				return nil, err
			}
			if err := waitRetired(st, id); err != nil {
				return nil, err
			}
			if frac > 0 {
				if err := changeMemory(s, id, frac); err != nil {
					return nil, err
				}
			}
			before := blobSet(st)
			t := time.Now()
			if err := s.post("/api/sandboxes/"+id+"/pause", nil, nil); err != nil {
				return nil, err
			}
			r.local = append(r.local, time.Since(t))
			if err := waitDurable(s, id); err != nil {
				return nil, err
			}
			r.durable = append(r.durable, time.Since(t))
			var added int64
			for k, size := range blobSet(st) {
				if _, ok := before[k]; !ok {
					added += size
				}
			}
			r.uploaded = append(r.uploaded, added)
			r.image = append(r.image, dirSize(image))
		}
		rows = append(rows, r)
	}
	return rows, nil
}

// blobSet is the blobs in st, with their sizes.
func blobSet(st objstore.Store) map[string]int64 {
	out := map[string]int64{}
	st.List(context.Background(), "blobs/", func(i objstore.Info) error { out[i.Key] = i.Size; return nil })
	return out
}

func median(xs []int64) int64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

func printChanged(w io.Writer, rows []changedRow) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "pause again (256 MiB)\tn\tlocal pause p50\tpause→durable p50\tp95\tvs local pause\timage\tuploaded p50\t")
	for _, r := range rows {
		l, d := stats(r.local), stats(r.durable)
		fmt.Fprintf(tw, "changed %g%%\t%d\t%s\t%s\t%s\t%.2fx\t%.1f MiB\t%.1f MiB\t\n", 100*r.frac, len(r.durable), ms(l[1]), ms(d[1]), ms(d[2]),
			float64(d[1])/float64(l[1]), float64(median(r.image))/(1<<20), float64(median(r.uploaded))/(1<<20))
	}
	tw.Flush()
	fmt.Fprintln(w, "a pause after a resume that changed that much of the sandbox's 256 MiB (one run at a random offset); local pause: the POST; uploaded: new blobs (the rest are the resumed image's, kept as the base of its next upload)")
}

func dirSize(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if i, err := d.Info(); err == nil {
				n += i.Size()
			}
		}
		return nil
	})
	return n
}

// waitDurable waits until sandbox id's pause image is in the object store.
func waitDurable(s *server, id string) error {
	for t := time.Now(); ; time.Sleep(20 * time.Millisecond) {
		var info struct {
			DurableAt *string `json:"durableAt"`
		}
		if err := s.call("GET", "/api/sandboxes/"+id, nil, &info); err != nil {
			return err
		}
		if info.DurableAt != nil {
			return nil
		}
		if time.Since(t) > 10*time.Minute {
			return fmt.Errorf("%s not durable after 10 minutes", id)
		}
	}
}
