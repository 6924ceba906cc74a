package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
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
)

// AllLimits lists every limit.
var AllLimits = []Limit{LimitSandboxes, LimitVCPUs, LimitMemoryGB, LimitVolumeGB, LimitSnapshots}

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
	}
	return "", fmt.Errorf("limit %q: must be one of sandboxes, vcpus, memory-gb, volume-gb, snapshots: %w", string(l), errdefs.ErrInvalid)
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
	}
	return nil
}

// Overrides are a project's own limits; a limit absent from the map is
// the server's default.
type Overrides map[Limit]int

// SetProjectLimit sets one of a project's limits (value >= 0, 0 = no
// limit); nil goes back to the server's default.
func (s *Store) SetProjectLimit(ctx context.Context, projectID string, l Limit, value *int) error {
	col, err := l.column()
	if err != nil {
		return err
	}
	if value != nil && *value < 0 {
		return fmt.Errorf("%s %d: must be 0 (no limit) or more: %w", l, *value, errdefs.ErrInvalid)
	}
	var v any
	if value != nil {
		v = *value
	}
	// col comes from the fixed set above, never from the caller.
	_, err = s.db.ExecContext(ctx, `INSERT INTO project_limits(project_id, `+col+`) VALUES(?, ?)
		ON CONFLICT(project_id) DO UPDATE SET `+col+` = excluded.`+col, projectID, v)
	return err
}

// ProjectOverrides returns the limits a project has of its own.
func (s *Store) ProjectOverrides(ctx context.Context, projectID string) (Overrides, error) {
	var v [5]sql.NullInt64
	err := s.db.QueryRowContext(ctx, `SELECT max_sandboxes, max_vcpus, max_memory_gb, max_volume_gb, max_snapshots
		FROM project_limits WHERE project_id = ?`, projectID).Scan(&v[0], &v[1], &v[2], &v[3], &v[4])
	out := Overrides{}
	if errors.Is(err, sql.ErrNoRows) {
		return out, nil
	}
	if err != nil {
		return nil, err
	}
	for i, l := range AllLimits {
		if v[i].Valid {
			out[l] = int(v[i].Int64)
		}
	}
	return out, nil
}

// ProjectLimits returns a project's limits: its overrides laid over
// defaults.
func (s *Store) ProjectLimits(ctx context.Context, projectID string, defaults Limits) (Limits, error) {
	o, err := s.ProjectOverrides(ctx, projectID)
	if err != nil {
		return Limits{}, err
	}
	out := defaults
	for l, v := range o {
		*out.Field(l) = v
	}
	return out, nil
}

const defaultLimitsKey = "default_limits"

// SetDefaultLimits records the server's default limits, so that the CLI
// shows the limits in force.
func (s *Store) SetDefaultLimits(ctx context.Context, ls Limits) error {
	b, err := json.Marshal(ls)
	if err != nil {
		return err
	}
	_, err = s.db.ExecContext(ctx, `INSERT INTO settings(key, value) VALUES(?, ?)
		ON CONFLICT(key) DO UPDATE SET value = excluded.value`, defaultLimitsKey, string(b))
	return err
}

// DefaultLimits returns what SetDefaultLimits recorded; ok is false when
// no server has run on this database since limits existed.
func (s *Store) DefaultLimits(ctx context.Context) (ls Limits, ok bool, err error) {
	var v string
	err = s.db.QueryRowContext(ctx, `SELECT value FROM settings WHERE key = ?`, defaultLimitsKey).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return Limits{}, false, nil
	}
	if err != nil {
		return Limits{}, false, err
	}
	return ls, true, json.Unmarshal([]byte(v), &ls)
}

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
