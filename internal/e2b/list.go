package e2b

import (
	"encoding/base64"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lizard-build/lizard/internal/api"
	"github.com/lizard-build/lizard/internal/sandbox"
	"github.com/lizard-build/lizard/internal/sandbox/usage"
	"github.com/lizard-build/lizard/internal/store"
)

// Page sizes of GET /v2/sandboxes.
const (
	defaultLimit = 100
	maxLimit     = 100
)

// listQuery is a validated list request.
type listQuery struct {
	states       []string
	metadata     map[string]string
	template     string
	startedAfter time.Time
	pageOrder
}

// cursor is the position in the listing's order after which a page starts:
// the X-Next-Token, opaque to clients.
type cursor struct {
	started time.Time
	id      string
}

func (c cursor) token() string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(c.started.UnixNano(), 10) + "/" + c.id))
}

func parseCursor(tok string) (*cursor, error) {
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err == nil {
		if ns, id, ok := strings.Cut(string(b), "/"); ok && id != "" {
			if n, err := strconv.ParseInt(ns, 10, 64); err == nil {
				return &cursor{started: time.Unix(0, n), id: id}, nil
			}
		}
	}
	return nil, invalid("nextToken %q: not a token this server gave", tok)
}

// parseList reads the query of GET /sandboxes (v1: running sandboxes, no
// pages) and GET /v2/sandboxes.
func parseList(r *http.Request) (listQuery, error) {
	lq := listQuery{pageOrder: pageOrder{limit: defaultLimit}, states: []string{"running", "paused"}}
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return lq, invalid("query %q: %v", r.URL.RawQuery, err)
	}
	v2 := strings.HasPrefix(r.URL.Path, "/v2/")
	if !v2 {
		lq.states, lq.limit = []string{"running"}, 0
	}
	if v := q.Get("metadata"); v != "" {
		pairs, err := url.ParseQuery(v)
		if err != nil {
			return lq, invalid("metadata %q: want URL-encoded key=value pairs joined by &", v)
		}
		lq.metadata = map[string]string{}
		for k, vs := range pairs {
			// The SDK encodes each key and value once more.
			key, err1 := url.QueryUnescape(k)
			val, err2 := url.QueryUnescape(vs[len(vs)-1])
			if err1 != nil || err2 != nil {
				return lq, invalid("metadata %q: bad escape", v)
			}
			lq.metadata[key] = val
		}
	}
	if !v2 {
		return lq, nil
	}
	if v := q.Get("state"); v != "" {
		lq.states = nil
		for _, st := range strings.Split(v, ",") {
			if st != "running" && st != "paused" {
				return lq, invalid("state %q: must be running or paused (comma-separated)", st)
			}
			lq.states = append(lq.states, st)
		}
	}
	lq.template = q.Get("template")
	if lz, ok := templateAliases[lq.template]; ok {
		lq.template = lz
	}
	if v := q.Get("startedAfter"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return lq, invalid("startedAfter %q: want an RFC 3339 time", v)
		}
		lq.startedAfter = t
	}
	switch q.Get("order") {
	case "", "desc":
	case "asc":
		lq.asc = true
	default:
		return lq, invalid("order %q: must be asc or desc", q.Get("order"))
	}
	return lq, lq.parsePage(q)
}

// parsePage reads a page's limit and nextToken from q into po.
func (po *pageOrder) parsePage(q url.Values) error {
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxLimit {
			return invalid("limit %q: must be 1 to %d", v, maxLimit)
		}
		po.limit = n
	}
	if v := q.Get("nextToken"); v != "" {
		c, err := parseCursor(v)
		if err != nil {
			return err
		}
		po.after = c
	}
	return nil
}

func (lq listQuery) match(rec sandbox.Record) bool {
	if !rec.E2B || !slices.Contains(lq.states, state(rec)) {
		return false
	}
	if lq.template != "" && rec.Template != lq.template {
		return false
	}
	if !lq.startedAfter.IsZero() && rec.StartedAt.Before(lq.startedAfter) {
		return false
	}
	for k, v := range lq.metadata {
		if got, ok := rec.Metadata[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// page picks the sandboxes lq matches, in its order, after its cursor, at
// most its limit; next is the token of the page after, "" if none.
func (lq listQuery) page(all []sandbox.Record) (recs []sandbox.Record, next string) {
	for _, rec := range all {
		if lq.match(rec) {
			recs = append(recs, rec)
		}
	}
	pos := func(rec sandbox.Record) cursor { return cursor{started: rec.StartedAt, id: rec.ID} }
	return pageOf(recs, pos, lq.pageOrder)
}

// pageOrder is where a page of a listing is: the order (by time, then id;
// newest first unless asc), the position the previous page ended at (nil
// for the first), and the most items on a page (0: all).
type pageOrder struct {
	asc   bool
	after *cursor
	limit int
}

// before orders positions as po does: by time, then id.
func (po pageOrder) before(a, b cursor) bool {
	if !a.started.Equal(b.started) {
		return a.started.Before(b.started) == po.asc
	}
	return a.id != b.id && (a.id < b.id) == po.asc
}

// pageOf sorts items by pos in po's order and returns those after po's
// cursor, at most its limit; next is the token of the page after, "" if
// none.
func pageOf[T any](items []T, pos func(T) cursor, po pageOrder) (page []T, next string) {
	slices.SortFunc(items, func(a, b T) int {
		if po.before(pos(a), pos(b)) {
			return -1
		}
		return 1
	})
	if po.after != nil {
		i := 0
		for i < len(items) && !po.before(*po.after, pos(items[i])) {
			i++
		}
		items = items[i:]
	}
	if po.limit > 0 && len(items) > po.limit {
		items = items[:po.limit]
		next = pos(items[len(items)-1]).token()
	}
	return items, next
}

// list answers a page of the project's E2B sandboxes, newest first unless
// order=asc; X-Next-Token names the next page when there is one.
func (s *server) list(w http.ResponseWriter, r *http.Request, p store.Project) error {
	lq, err := parseList(r)
	if err != nil {
		return err
	}
	all := s.sandboxes.List(p.ID)
	usageOf := s.latestUsage
	if s.cluster != nil {
		// Every node's sandboxes, each with its node's latest sample.
		ns, err := s.cluster.Sandboxes(r.Context(), p.ID)
		if err != nil {
			return err
		}
		all = make([]sandbox.Record, len(ns))
		samples := make(map[string]*usage.Sample, len(ns))
		for i, n := range ns {
			all[i], samples[n.Record.ID] = n.Record, n.Usage
		}
		usageOf = func(id string) *usage.Sample { return samples[id] }
	}
	recs, next := lq.page(all)
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	vols, err := s.volumeNames(r.Context(), p.ID, recs)
	if err != nil {
		return err
	}
	out := make([]detail, len(recs))
	for i, rec := range recs {
		out[i] = listed(rec, usageOf(rec.ID), vols)
	}
	api.WriteJSON(w, http.StatusOK, out)
	return nil
}

// metric is E2B's SandboxMetric.
type metric struct {
	Timestamp     string  `json:"timestamp"`
	TimestampUnix int64   `json:"timestampUnix"`
	CPUCount      int     `json:"cpuCount"`
	CPUUsedPct    float64 `json:"cpuUsedPct"`
	MemUsed       int64   `json:"memUsed"`
	MemTotal      int64   `json:"memTotal"`
	MemCache      int64   `json:"memCache"`
	DiskUsed      int64   `json:"diskUsed"`
	DiskTotal     int64   `json:"diskTotal"`
}

// metrics answers the sandbox's usage samples (the service's, as GET
// /api/sandboxes/{id}/metrics) between start and end, unix seconds.
func (s *server) metrics(w http.ResponseWriter, r *http.Request, p store.Project) error {
	start, end, err := api.UsageWindow(r)
	if err != nil {
		return err
	}
	rec, err := s.e2bSandbox(p, r.PathValue("id"))
	if err != nil {
		return err
	}
	samples, err := s.usage.Usage(p.ID, rec.ID, start, end)
	if err != nil {
		return err
	}
	out := make([]metric, len(samples))
	for i, u := range samples {
		out[i] = metric{
			Timestamp: u.Time.UTC().Format(time.RFC3339), TimestampUnix: u.Time.Unix(), CPUCount: int(u.CPUCount + 0.999),
			CPUUsedPct: u.CPUUsedPct, MemUsed: u.MemUsed, MemTotal: u.MemTotal, DiskUsed: u.DiskUsed, DiskTotal: u.DiskTotal,
		}
	}
	api.WriteJSON(w, http.StatusOK, out)
	return nil
}
