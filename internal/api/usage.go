package api

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
	"github.com/lizard-build/lizard/internal/sandbox/usage"
	"github.com/lizard-build/lizard/internal/store"
)

// usagePoint is one usage sample in the shape of E2B's sandbox metrics,
// plus the network counters lizard adds.
type usagePoint struct {
	Timestamp     string  `json:"timestamp"`
	TimestampUnix int64   `json:"timestampUnix"`
	CPUCount      float64 `json:"cpuCount"`
	CPUUsedPct    float64 `json:"cpuUsedPct"`
	MemUsed       int64   `json:"memUsed"`
	MemTotal      int64   `json:"memTotal"`
	DiskUsed      int64   `json:"diskUsed"`
	DiskTotal     int64   `json:"diskTotal"`
	NetRxBytes    uint64  `json:"netRxBytes"`
	NetTxBytes    uint64  `json:"netTxBytes"`
}

func pointOf(u usage.Sample) usagePoint {
	return usagePoint{
		Timestamp: u.Time.UTC().Format(time.RFC3339), TimestampUnix: u.Time.Unix(),
		CPUCount: u.CPUCount, CPUUsedPct: u.CPUUsedPct, MemUsed: u.MemUsed, MemTotal: u.MemTotal,
		DiskUsed: u.DiskUsed, DiskTotal: u.DiskTotal, NetRxBytes: u.NetRxBytes, NetTxBytes: u.NetTxBytes,
	}
}

// usageRoutes serve GET /api/sandboxes/{id}/metrics.
type usageRoutes struct {
	usage Usages
}

// sandboxMetrics is GET /api/sandboxes/{id}/metrics?start=&end= (unix
// seconds, both optional): the samples of the last hour, oldest first.
func (s usageRoutes) sandboxMetrics(w http.ResponseWriter, r *http.Request, p store.Project) error {
	start, end, err := UsageWindow(r)
	if err != nil {
		return err
	}
	samples, err := s.usage.Usage(p.ID, r.PathValue("id"), start, end)
	if err != nil {
		return err
	}
	out := make([]usagePoint, len(samples))
	for i, u := range samples {
		out[i] = pointOf(u)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// UsageWindow reads the query parameters start and end (unix seconds, both
// optional) of a usage request: the window for usage.Sampler.Usage, end
// covering the whole second it names. internal/e2b reads E2B's the same way.
func UsageWindow(r *http.Request) (start, end time.Time, err error) {
	if start, err = unixParam(r, "start"); err != nil {
		return
	}
	if end, err = unixParam(r, "end"); err != nil {
		return
	}
	if !start.IsZero() && !end.IsZero() && end.Before(start) {
		return start, end, fmt.Errorf("end %d is before start %d: %w", end.Unix(), start.Unix(), errdefs.ErrInvalid)
	}
	if !end.IsZero() {
		end = end.Add(time.Second - 1)
	}
	return start, end, nil
}

// unixParam reads a query parameter of unix seconds; absent is zero time.
func unixParam(r *http.Request, name string) (time.Time, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return time.Time{}, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 || n > 1<<40 {
		return time.Time{}, fmt.Errorf("query parameter %s %q: must be unix seconds (a non-negative integer): %w", name, v, errdefs.ErrInvalid)
	}
	return time.Unix(n, 0), nil
}
