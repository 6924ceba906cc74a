package e2b

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/network"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/sandbox/snapshot"
	"github.com/lizard-build/lizard/internal/template"
)

// listedSnapshots stands in for the service's snapshot list (the finder's
// only read); the other calls are not made by these tests.
type listedSnapshots []snapshot.Info

func (l listedSnapshots) List(projectID string) []snapshot.Info {
	var out []snapshot.Info
	for _, sn := range l {
		if sn.ProjectID == projectID {
			out = append(out, sn)
		}
	}
	return out
}

func (listedSnapshots) Take(context.Context, string, string, string, int) (snapshot.Info, error) {
	return snapshot.Info{}, errors.ErrUnsupported
}

func (listedSnapshots) Delete(context.Context, string, string) error {
	return errors.ErrUnsupported
}

func snap(id, project, name, source string, e2b bool, at time.Time) snapshot.Info {
	return snapshot.Info{Snapshot: snapshot.Snapshot{ID: id, Name: name, CreatedAt: at, Saved: sandbox.Saved{ProjectID: project, SourceID: source, E2B: e2b}}}
}

// TestSnapshotFind: a template names a snapshot by its id, or by its name
// (the newest of that name) unless a template has that name; snapshots of
// other projects and of sandboxes not made through E2B are not found.
func TestSnapshotFind(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f := snapshotFinder{
		snapshots: listedSnapshots{
			snap("snap_a", "p", "keep", "sb1", true, t0),
			snap("snap_b", "p", "keep", "sb1", true, t0.Add(time.Second)),
			snap("snap_c", "p", "base", "sb1", true, t0),
			snap("snap_d", "p", "lizards", "sb2", false, t0),
			snap("snap_e", "q", "theirs", "sb3", true, t0),
		},
		templates: fakeTemplates{{Name: "base"}, {Name: "python", Aliases: []string{"python312"}}},
	}
	for _, tc := range []struct {
		ref, want string // want "": none
	}{
		{"snap_a", "snap_a"},
		{"keep", "snap_b"},
		{"snap_c", "snap_c"},
		{"base", ""},
		{"python312", ""},
		{"snap_d", ""},
		{"lizards", ""},
		{"snap_e", ""},
		{"theirs", ""},
		{"nosuch", ""},
	} {
		sn, ok, err := f.find(context.Background(), "p", tc.ref)
		if err != nil || ok != (tc.want != "") || (ok && sn.ID != tc.want) {
			t.Errorf("find(%q) = %s %v %v, want %q", tc.ref, sn.ID, ok, err, tc.want)
		}
	}
}

// TestSnapshotPages: pages of any size cover the snapshots a query matches
// once each, newest first; the filters apply before paging.
func TestSnapshotPages(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var all []snapshot.Info
	for i := range 30 {
		all = append(all, snap(fmt.Sprintf("snap_%02d", i), "p", []string{"a", "b", "Snapshot x"}[i%3], []string{"sb1", "sb2"}[rng.IntN(2)], true,
			t0.Add(time.Duration(rng.IntN(8))*time.Second))) // ties
	}
	for _, q := range []string{"", "sandboxID=sb1", "name=a", "name=snap_07", "sandboxID=sb2&name=b"} {
		r := httptest.NewRequest("GET", "/snapshots?"+q, nil)
		sq, err := parseSnapshotQuery(r)
		if err != nil {
			t.Fatal(err)
		}
		var want []string
		for _, sn := range all {
			if (sq.sandboxID == "" || sn.SourceID == sq.sandboxID) && (sq.name == "" || sn.ID == sq.name || sn.Name == sq.name) {
				want = append(want, sn.ID)
			}
		}
		for _, limit := range []int{1, 4, 100} {
			sq.limit = limit
			got := allPages(t, q, limit, func(after *cursor) ([]snapshot.Info, string) {
				sq.after = after
				return sq.page(slices.Clone(all))
			})
			var ids []string
			for i, sn := range got {
				ids = append(ids, sn.ID)
				if i > 0 && sn.CreatedAt.After(got[i-1].CreatedAt) {
					t.Fatalf("%s limit %d: not newest first at %d", q, limit, i)
				}
			}
			slices.Sort(ids)
			if !slices.Equal(ids, want) || len(want) == 0 {
				t.Errorf("%s limit %d: pages gave %v, want %v", q, limit, ids, want)
			}
		}
	}
	// An E2B name is listed; lizard's default name of an unnamed one is not.
	if got := snapshotOf(all[0]).Names; !slices.Equal(got, []string{"a"}) {
		t.Errorf("names of a named snapshot: %v", got)
	}
	if got := snapshotOf(all[2]).Names; len(got) != 0 {
		t.Errorf("names of an unnamed snapshot: %v", got)
	}
}

// TestFromSnapshot: a create from a snapshot that asks for another
// network, security or volume than the snapshot's copies have is refused,
// naming the field; what they have is accepted.
func TestFromSnapshot(t *testing.T) {
	yes, no := true, false
	open := snapshot.Info{Snapshot: snapshot.Snapshot{ID: "snap_o", Saved: sandbox.Saved{Secure: true}}}
	closed := snapshot.Info{Snapshot: snapshot.Snapshot{ID: "snap_c", Saved: sandbox.Saved{Egress: network.Egress{Restricted: true}}}}
	type net = struct {
		network.Settings
		AllowPublicTraffic *bool  `json:"allowPublicTraffic"`
		MaskRequestHost    string `json:"maskRequestHost"`
	}
	for _, tc := range []struct {
		req     newSandbox
		sn      snapshot.Info
		mention string // "": accepted
	}{
		{newSandbox{}, open, ""},
		{newSandbox{Secure: &yes, AllowInternetAccess: &yes}, open, ""},
		{newSandbox{Secure: &no, AllowInternetAccess: &no}, closed, ""},
		{newSandbox{Secure: &no, AllowInternetAccess: &yes}, closed, ""},
		{newSandbox{Network: &net{}}, open, ""},
		{newSandbox{VolumeMounts: []volumeMount{{Name: "v", Path: "/workspace"}}}, open, "volumeMounts"},
		{newSandbox{Network: &net{Settings: network.Settings{AllowOut: []string{"pypi.org"}}}}, open, "network"},
		{newSandbox{Network: &net{Settings: network.Settings{HTTPSPorts: []int{8443}}}}, open, "network"},
		{newSandbox{Network: &net{AllowPublicTraffic: &no}}, open, "network"},
		{newSandbox{AllowInternetAccess: &no}, open, "allow_internet_access"},
		{newSandbox{Secure: &no, AllowInternetAccess: &yes}, closed, ""},
		{newSandbox{}, closed, "secure"},
		{newSandbox{Secure: &yes}, closed, "secure"},
	} {
		err := fromSnapshot(tc.req, tc.sn)
		if tc.mention == "" {
			if err != nil {
				t.Errorf("%+v from %s: %v", tc.req, tc.sn.ID, err)
			}
			continue
		}
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.HasPrefix(err.Error(), tc.mention) {
			t.Errorf("%+v from %s: %v, want a refusal of %s", tc.req, tc.sn.ID, err, tc.mention)
		}
	}
}

// TestSnapshotNameOfTemplate: a snapshot may not take a template's name,
// which would hide the template from creates.
func TestSnapshotNameOfTemplate(t *testing.T) {
	h := newTestHandlerWith(t, fakeTemplates{{Name: "base"}, template.Template{Name: "python", Aliases: []string{"python312"}}})
	for _, name := range []string{"base", "python312"} {
		w := send(h, testKey, "POST", "/sandboxes/nosuch/snapshots", `{"name":"`+name+`"}`)
		if w.Code != 400 || !strings.Contains(w.Body.String(), "a template has that name") {
			t.Errorf("snapshot named %s: %d %s", name, w.Code, w.Body)
		}
	}
	// A template's name deletes the template (a built-in one cannot be); a
	// name that is neither a template nor a snapshot is not found.
	if w := send(h, testKey, "DELETE", "/templates/base", ""); w.Code != 400 || !strings.Contains(w.Body.String(), "cannot be deleted") {
		t.Errorf("DELETE /templates/base: %d %s", w.Code, w.Body)
	}
	if w := send(h, testKey, "DELETE", "/templates/nosuch", ""); w.Code != 404 {
		t.Errorf("DELETE /templates/nosuch: %d %s", w.Code, w.Body)
	}
}

// allPages follows a listing's pages of limit from the first, checking
// each page's size and token, and returns their items in order.
func allPages[T any](t *testing.T, what string, limit int, page func(after *cursor) ([]T, string)) []T {
	t.Helper()
	var got []T
	var after *cursor
	for n := 0; ; n++ {
		items, next := page(after)
		if len(items) > limit || (next != "" && len(items) != limit) {
			t.Fatalf("%s limit %d: page of %d, next %q", what, limit, len(items), next)
		}
		got = append(got, items...)
		if next == "" {
			return got
		}
		var err error
		if after, err = parseCursor(next); err != nil || n > 100 {
			t.Fatalf("%s: token %q: %v", what, next, err)
		}
	}
}
