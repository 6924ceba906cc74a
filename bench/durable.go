package main

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

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
	image, stored             int64 // of the last pause
}

func benchDurable(ctx context.Context, cfg config, w io.Writer, n int) error {
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
	var rows []durableRow
	for _, big := range []bool{false, true} {
		r, err := benchDurableOne(srv, st, n, big)
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "measured %s\n", r.name)
		rows = append(rows, r)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "durable (versitygw on loopback)\tn\tpause→durable p50\tp95\tresume local→exec p50\tfrom object store→exec p50\tp95\timage\tuploaded\t")
	for _, r := range rows {
		d, l, f := stats(r.durable), stats(r.local), stats(r.fromStore)
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%.1f MiB\t%.1f MiB\t\n", r.name, len(r.durable), ms(d[1]), ms(d[2]),
			ms(l[1]), ms(f[1]), ms(f[2]), float64(r.image)/(1<<20), float64(r.stored)/(1<<20))
	}
	tw.Flush()
	fmt.Fprintln(w, "pause→durable: from POST pause until GET shows durableAt (upload of zstd chunks in the background); uploaded: the blobs' stored bytes; from object store: the local image removed before the resume")
	fmt.Fprintln(w)
	return benchTemplateFetch(w, srv, st, n)
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
		t := time.Now()
		if err := s.post("/api/sandboxes/"+id+"/pause", nil, nil); err != nil {
			return r, err
		}
		if err := waitDurable(s, id); err != nil {
			return r, err
		}
		r.durable = append(r.durable, time.Since(t))
		r.image, r.stored = dirSize(image), 0
		st.List(context.Background(), "blobs/", func(i objstore.Info) error { r.stored += i.Size; return nil })
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
		// The resumed image's objects go in the background: wait, so that
		// the next pause's upload is measured alone.
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			left := 0
			st.List(context.Background(), "", func(objstore.Info) error { left++; return nil })
			if left == 0 {
				break
			}
		}
	}
	return r, nil
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
