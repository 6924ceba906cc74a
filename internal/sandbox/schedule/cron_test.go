package schedule

import (
	"strings"
	"testing"
	"time"
)

func mustLoc(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

// TestCronNext: next times in UTC and in time zones, across both
// daylight-saving changes of Europe/Berlin (2026-03-29 02:00 CET → 03:00
// CEST, 2026-10-25 03:00 CEST → 02:00 CET) and America/New_York
// (2026-03-08, 2026-11-01).
func TestCronNext(t *testing.T) {
	for _, tc := range []struct {
		expr, tz, after string
		want            []string // the next times, one after the other
	}{
		{"*/15 * * * *", "UTC", "2026-05-01T10:07:30Z", []string{"2026-05-01T10:15:00Z", "2026-05-01T10:30:00Z", "2026-05-01T10:45:00Z", "2026-05-01T11:00:00Z"}},
		{"0 9 * * mon-fri", "UTC", "2026-05-01T09:00:00Z", []string{"2026-05-04T09:00:00Z", "2026-05-05T09:00:00Z"}}, // Friday → Monday
		{"0 0 29 2 *", "UTC", "2026-01-01T00:00:00Z", []string{"2028-02-29T00:00:00Z", "2032-02-29T00:00:00Z"}},
		{"0 12 1 * 0", "UTC", "2026-05-01T12:00:00Z", []string{"2026-05-03T12:00:00Z", "2026-05-10T12:00:00Z"}}, // day of month or Sunday
		{"@daily", "UTC", "2026-05-01T00:00:00Z", []string{"2026-05-02T00:00:00Z"}},
		{"5/20 * * * *", "UTC", "2026-05-01T10:00:00Z", []string{"2026-05-01T10:05:00Z", "2026-05-01T10:25:00Z", "2026-05-01T10:45:00Z", "2026-05-01T11:05:00Z"}},
		{"0 0 * jan,jul 7", "UTC", "2026-05-01T00:00:00Z", []string{"2026-07-05T00:00:00Z"}},
		// A daily job at 09:30 Berlin time: 08:30 UTC in winter, 07:30 UTC
		// once summer time began.
		{"30 9 * * *", "Europe/Berlin", "2026-03-27T12:00:00Z", []string{"2026-03-28T08:30:00Z", "2026-03-29T07:30:00Z", "2026-03-30T07:30:00Z"}},
		// 02:30 does not exist on 2026-03-29 in Berlin: it runs once, at
		// the change (03:00 CEST = 01:00 UTC), then at 02:30 CEST.
		{"30 2 * * *", "Europe/Berlin", "2026-03-28T12:00:00Z", []string{"2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"}},
		// Hourly: the skipped hour does not happen; the others do.
		{"30 * * * *", "Europe/Berlin", "2026-03-29T00:00:00Z", []string{"2026-03-29T00:30:00Z", "2026-03-29T01:30:00Z", "2026-03-29T02:30:00Z"}},
		// 02:30 happens twice on 2026-10-25 in Berlin: it runs at the
		// first (CEST, 00:30 UTC) only.
		{"30 2 * * *", "Europe/Berlin", "2026-10-24T12:00:00Z", []string{"2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"}},
		// Every half hour runs through both 02:00-02:59 hours.
		{"*/30 * * * *", "Europe/Berlin", "2026-10-24T23:59:00Z", []string{"2026-10-25T00:00:00Z", "2026-10-25T00:30:00Z", "2026-10-25T01:00:00Z", "2026-10-25T01:30:00Z", "2026-10-25T02:00:00Z"}},
		// New York: 02:15 is skipped on 2026-03-08 (→ 03:00 EDT, 07:00 UTC).
		{"15 2 * * *", "America/New_York", "2026-03-07T12:00:00Z", []string{"2026-03-08T07:00:00Z", "2026-03-09T06:15:00Z"}},
		// 01:15 twice on 2026-11-01: the first, EDT (05:15 UTC).
		{"15 1 * * *", "America/New_York", "2026-10-31T12:00:00Z", []string{"2026-11-01T05:15:00Z", "2026-11-02T06:15:00Z"}},
		{"0 9 * * 1-5", "Asia/Kolkata", "2026-05-01T00:00:00Z", []string{"2026-05-01T03:30:00Z", "2026-05-04T03:30:00Z"}},
	} {
		c, err := ParseCron(tc.expr, mustLoc(t, tc.tz))
		if err != nil {
			t.Fatalf("%s: %v", tc.expr, err)
		}
		at := utc(tc.after)
		for i, w := range tc.want {
			got := c.Next(at)
			if !got.Equal(utc(w)) {
				t.Fatalf("%q in %s: next #%d after %s = %s, want %s", tc.expr, tc.tz, i+1, at.Format(time.RFC3339), got.UTC().Format(time.RFC3339), w)
			}
			at = got
		}
	}
}

func TestCronNever(t *testing.T) {
	c, err := ParseCron("0 0 30 2 *", time.UTC)
	if err != nil {
		t.Fatal(err)
	}
	if n := c.Next(utc("2026-01-01T00:00:00Z")); !n.IsZero() {
		t.Fatalf("February 30th: next %s, want none", n)
	}
}

func TestParseCronErrors(t *testing.T) {
	for _, tc := range []struct{ expr, want string }{
		{"* * * *", "has 4 fields"},
		{"60 * * * *", "minute \"60\""},
		{"* 24 * * *", "hour \"24\""},
		{"* * 0 * *", "day of month \"0\""},
		{"* * * 13 *", "month \"13\""},
		{"* * * * 8", "day of week \"8\""},
		{"*/0 * * * *", "step"},
		{"5-1 * * * *", "backwards"},
		{"a * * * *", "minute \"a\""},
		{"@sometimes", "has 1 fields"},
		{"", "has 0 fields"},
	} {
		_, err := ParseCron(tc.expr, time.UTC)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseCron(%q) = %v, want an error with %q", tc.expr, err, tc.want)
		}
	}
}
