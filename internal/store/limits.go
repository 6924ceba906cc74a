package store

import (
	"context"
	"fmt"
	"math"
	"strconv"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// Limits are what a project may hold at once. 0 means no limit.
type Limits struct {
	Sandboxes int `json:"maxSandboxes"` // live sandboxes: running, paused, warm pool copies
	VCPUs     int `json:"maxVcpus"`     // vCPUs of sandboxes that are not paused
	MemoryGB  int `json:"maxMemoryGb"`  // memory of sandboxes that are not paused
	VolumeGB  int `json:"maxVolumeGb"`  // sum of the project's volume sizes
	Snapshots int `json:"maxSnapshots"` // snapshot records
	// Schedules of the project's sandboxes, and of any one sandbox.
	Schedules           int `json:"maxSchedules"`
	SchedulesPerSandbox int `json:"maxSchedulesPerSandbox"`
}

// Limit names one field of Limits, as the CLI and the database call it.
type Limit string

// The limits, in the order they are shown.
const (
	LimitSandboxes Limit = "sandboxes"
	LimitVCPUs     Limit = "vcpus"
	LimitMemoryGB  Limit = "memory-gb"
	LimitVolumeGB  Limit = "volume-gb"
	LimitSnapshots Limit = "snapshots"
	LimitSchedules Limit = "schedules"
	// LimitSchedulesPerSandbox is the only limit of one sandbox rather
	// than of the project as a whole.
	LimitSchedulesPerSandbox Limit = "schedules-per-sandbox"
)

// AllLimits lists every limit.
var AllLimits = []Limit{LimitSandboxes, LimitVCPUs, LimitMemoryGB, LimitVolumeGB, LimitSnapshots, LimitSchedules, LimitSchedulesPerSandbox}

// LimitColumns are the columns of project_limits, in the order of
// AllLimits.
const LimitColumns = "max_sandboxes, max_vcpus, max_memory_gb, max_volume_gb, max_snapshots, max_schedules, max_schedules_per_sandbox"

// column is the limit's column of project_limits.
func (l Limit) column() (string, error) {
	switch l {
	case LimitSandboxes:
		return "max_sandboxes", nil
	case LimitVCPUs:
		return "max_vcpus", nil
	case LimitMemoryGB:
		return "max_memory_gb", nil
	case LimitVolumeGB:
		return "max_volume_gb", nil
	case LimitSnapshots:
		return "max_snapshots", nil
	case LimitSchedules:
		return "max_schedules", nil
	case LimitSchedulesPerSandbox:
		return "max_schedules_per_sandbox", nil
	}
	return "", fmt.Errorf("limit %q: must be one of sandboxes, vcpus, memory-gb, volume-gb, snapshots, schedules, schedules-per-sandbox: %w", string(l), errdefs.ErrInvalid)
}

// Field returns a pointer to the limit's field in ls.
func (ls *Limits) Field(l Limit) *int {
	switch l {
	case LimitSandboxes:
		return &ls.Sandboxes
	case LimitVCPUs:
		return &ls.VCPUs
	case LimitMemoryGB:
		return &ls.MemoryGB
	case LimitVolumeGB:
		return &ls.VolumeGB
	case LimitSnapshots:
		return &ls.Snapshots
	case LimitSchedules:
		return &ls.Schedules
	case LimitSchedulesPerSandbox:
		return &ls.SchedulesPerSandbox
	}
	return nil
}

// Overrides are a project's own limits; a limit absent from the map is
// the server's default.
type Overrides map[Limit]int

// LimitColumn checks a change of one of a project's limits (value >= 0,
// 0 = no limit, nil = back to the server's default) and returns its column
// of project_limits.
func LimitColumn(l Limit, value *int) (string, error) {
	col, err := l.column()
	if err != nil {
		return "", err
	}
	if value != nil && *value < 0 {
		return "", fmt.Errorf("%s %d: must be 0 (no limit) or more: %w", l, *value, errdefs.ErrInvalid)
	}
	return col, nil
}

// ProjectLimits returns a project's limits: its overrides in st laid over
// defaults.
func ProjectLimits(ctx context.Context, st Store, projectID string, defaults Limits) (Limits, error) {
	o, err := st.ProjectOverrides(ctx, projectID)
	if err != nil {
		return Limits{}, err
	}
	return o.Over(defaults), nil
}

// Over is a project's limits: o laid over defaults.
func (o Overrides) Over(defaults Limits) Limits {
	out := defaults
	for l, v := range o {
		*out.Field(l) = v
	}
	return out
}

// DefaultLimitsKey is the row of the settings table that holds the
// server's default limits (JSON of Limits).
const DefaultLimitsKey = "default_limits"

// Exceeded is the refusal (errdefs.ErrQuota, code quota_exceeded) of
// needed more of l to a project that uses used of its limit:
// "project quota: vcpus 8 of 8 in use, this needs 2".
func (l Limit) Exceeded(used, limit, needed float64) error {
	unit := string(l)
	if l == LimitVCPUs {
		unit = "vcpu" // the SDKs' word
	}
	return errdefs.WithCode("quota_exceeded", &errdefs.Exceeded{Unit: unit, Limit: limit, InUse: used, Needed: needed,
		Err: fmt.Errorf("project quota: %s %s of %s in use, this needs %s: %w", l, FormatAmount(used), FormatAmount(limit), FormatAmount(needed), errdefs.ErrQuota)})
}

// FormatAmount shows a count or an amount of vCPUs or GiB: whole numbers
// as they are, others with one decimal.
func FormatAmount(v float64) string {
	if v == math.Trunc(v) {
		return strconv.FormatInt(int64(v), 10)
	}
	return strconv.FormatFloat(v, 'f', 1, 64)
}
