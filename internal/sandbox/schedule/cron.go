package schedule

import (
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"time"
)

// Cron is a parsed five-field cron expression (minute, hour, day of month,
// month, day of week) in a time zone.
//
// Fields take *, numbers, ranges (1-5), steps (*/15, 10-50/20), lists
// (1,15), month and weekday names (jan, mon-fri; 0 and 7 are Sunday); the
// macros @hourly, @daily (@midnight), @weekly, @monthly and @yearly
// (@annually) stand for their expressions. When both the day of month and
// the day of week are restricted, a day matching either runs (cron's rule).
//
// Across daylight-saving changes it runs as cron does: a wall-clock time
// that a change skips (spring forward) runs once, at the change, unless the
// expression runs every hour (the hour field is *), whose skipped hour just
// does not happen; a wall-clock time that occurs twice (fall back) runs at
// its first occurrence only, unless the hour field is *, which runs both
// hours.
type Cron struct {
	min, hour, dom, month, dow uint64 // bit i: value i matches
	domStar, dowStar           bool
	loc                        *time.Location
}

var cronMacros = map[string]string{
	"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *", "@weekly": "0 0 * * 0",
	"@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *",
}

var monthNames = []string{"jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"}
var dayNames = []string{"sun", "mon", "tue", "wed", "thu", "fri", "sat"}

// ParseCron parses expr in loc. Its errors say which field is wrong and
// why.
func ParseCron(expr string, loc *time.Location) (*Cron, error) {
	e := strings.TrimSpace(expr)
	if m, ok := cronMacros[strings.ToLower(e)]; ok {
		e = m
	}
	f := strings.Fields(e)
	if len(f) != 5 {
		return nil, fmt.Errorf("%q has %d fields, want 5 (minute hour day-of-month month day-of-week) or a macro such as @daily", expr, len(f))
	}
	c := &Cron{loc: loc}
	var err error
	if c.min, err = parseField(f[0], "minute", 0, 59, nil); err != nil {
		return nil, err
	}
	if c.hour, err = parseField(f[1], "hour", 0, 23, nil); err != nil {
		return nil, err
	}
	if c.dom, err = parseField(f[2], "day of month", 1, 31, nil); err != nil {
		return nil, err
	}
	if c.month, err = parseField(f[3], "month", 1, 12, monthNames); err != nil {
		return nil, err
	}
	if c.dow, err = parseField(f[4], "day of week", 0, 7, dayNames); err != nil {
		return nil, err
	}
	if c.dow&(1<<7) != 0 { // 7 is Sunday too
		c.dow = c.dow&^(1<<7) | 1
	}
	c.domStar, c.dowStar = strings.HasPrefix(f[2], "*"), strings.HasPrefix(f[4], "*")
	return c, nil
}

// parseField parses one field of values lo..hi; names, when given, name
// the values from lo on.
func parseField(s, name string, lo, hi int, names []string) (uint64, error) {
	var set uint64
	for _, part := range strings.Split(s, ",") {
		rng, step := part, 1
		if i := strings.IndexByte(part, '/'); i >= 0 {
			n, err := strconv.Atoi(part[i+1:])
			if err != nil || n < 1 || n > hi-lo+1 {
				return 0, fmt.Errorf("%s field %q: the step after / must be 1 to %d", name, s, hi-lo+1)
			}
			rng, step = part[:i], n
		}
		a, b := lo, hi
		switch {
		case rng == "*":
		case strings.Contains(rng, "-"):
			x, y, _ := strings.Cut(rng, "-")
			var err error
			if a, err = fieldValue(x, name, lo, hi, names); err != nil {
				return 0, err
			}
			if b, err = fieldValue(y, name, lo, hi, names); err != nil {
				return 0, err
			}
			if a > b {
				return 0, fmt.Errorf("%s field %q: range %s runs backwards", name, s, rng)
			}
		default:
			v, err := fieldValue(rng, name, lo, hi, names)
			if err != nil {
				return 0, err
			}
			a, b = v, v
			if step > 1 {
				b = hi // 5/15: from 5 on, every 15
			}
		}
		for v := a; v <= b; v += step {
			set |= 1 << v
		}
	}
	return set, nil
}

func fieldValue(s, name string, lo, hi int, names []string) (int, error) {
	for i, n := range names {
		if strings.EqualFold(s, n) {
			return lo + i, nil
		}
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < lo || v > hi {
		return 0, fmt.Errorf("%s %q: must be %d to %d", name, s, lo, hi)
	}
	return v, nil
}

// allHours: the hour field matches every hour.
func (c *Cron) allHours() bool { return bits.OnesCount64(c.hour) == 24 }

// matchDay reports whether the date of local time l matches.
func (c *Cron) matchDay(l time.Time) bool {
	if c.month&(1<<uint(l.Month())) == 0 {
		return false
	}
	dom, dow := c.dom&(1<<uint(l.Day())) != 0, c.dow&(1<<uint(l.Weekday())) != 0
	if c.domStar || c.dowStar {
		return dom && dow
	}
	return dom || dow
}

func (c *Cron) matchClock(l time.Time) bool {
	return c.hour&(1<<uint(l.Hour())) != 0 && c.min&(1<<uint(l.Minute())) != 0
}

// searchYears bounds Next's search: a valid expression that never matches
// in that long (February 30th) has no next time.
const searchYears = 9

// Next is the first time strictly after after that the expression runs,
// or the zero time if it never does.
func (c *Cron) Next(after time.Time) time.Time {
	t := after.Truncate(time.Minute).Add(time.Minute)
	limit := after.AddDate(searchYears, 0, 0)
	for t.Before(limit) {
		l := t.In(c.loc)
		start, end := l.ZoneBounds()
		// A change of clocks that skipped wall-clock times: the first
		// instant after it runs what was skipped.
		if t.Equal(start) && !c.allHours() {
			if skipped := c.skipped(start); skipped {
				return t
			}
		}
		var jump time.Time
		switch {
		case !c.matchDay(l):
			jump = time.Date(l.Year(), l.Month(), l.Day()+1, 0, 0, 0, 0, c.loc)
		case c.hour&(1<<uint(l.Hour())) == 0:
			jump = t.Add(time.Duration(60-l.Minute()) * time.Minute)
		case c.min&(1<<uint(l.Minute())) == 0:
			jump = t.Add(time.Minute)
		default:
			if c.repeated(t, l, start) && !c.allHours() {
				jump = t.Add(time.Minute)
				break
			}
			return t
		}
		// Never step over a change of clocks, nor back.
		if !end.IsZero() && end.After(t) && jump.After(end) {
			jump = end
		}
		if !jump.After(t) {
			jump = t.Add(time.Minute)
		}
		t = jump
	}
	return time.Time{}
}

// skipped reports whether a change of clocks at start skipped a
// wall-clock minute that the expression runs at.
func (c *Cron) skipped(start time.Time) bool {
	before := start.Add(-time.Second).In(c.loc)
	_, oldOff := before.Zone()
	_, newOff := start.In(c.loc).Zone()
	if newOff <= oldOff {
		return false
	}
	// The wall clock read before.Truncate(minute)+1 min … start's wall
	// clock - 1 min never showed.
	wall := time.Date(before.Year(), before.Month(), before.Day(), before.Hour(), before.Minute(), 0, 0, time.UTC).Add(time.Minute)
	for i := 0; i < (newOff-oldOff)/60; i++ {
		w := wall.Add(time.Duration(i) * time.Minute)
		if c.matchDay(w) && c.matchClock(w) {
			return true
		}
	}
	return false
}

// repeated reports whether local time l (instant t) is the second
// occurrence of its wall-clock time, after clocks went back at start.
func (c *Cron) repeated(t, l, start time.Time) bool {
	if start.IsZero() {
		return false
	}
	_, newOff := l.Zone()
	_, oldOff := start.Add(-time.Second).In(c.loc).Zone()
	return oldOff > newOff && t.Sub(start) < time.Duration(oldOff-newOff)*time.Second
}
