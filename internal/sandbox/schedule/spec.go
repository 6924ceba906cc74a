package schedule

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	_ "time/tzdata" // the IANA time zones, for hosts and images without them

	"github.com/lizard-build/lizard/internal/errdefs"
)

// Limits of a schedule's settings.
const (
	MinEvery              = time.Minute
	MaxEvery              = 366 * 24 * time.Hour
	DefaultTimeoutSeconds = 600
	MaxTimeoutSeconds     = 600 // what one exec may take (sandbox.MaxExecTimeoutMs)
	maxText               = 64 << 10
	maxName               = 200
)

// Efforts are the reasoning efforts an agent may be asked for.
var Efforts = []string{"minimal", "low", "medium", "high", "xhigh"}

// Spec is a schedule's settings as the store keeps them (store.Schedule.Spec).
type Spec struct {
	Name string `json:"name,omitempty"`
	// Every (canonical, "5m") and EverySeconds, or Cron in Timezone.
	Every        string `json:"every,omitempty"`
	EverySeconds int64  `json:"everySeconds,omitempty"`
	Cron         string `json:"cron,omitempty"`
	Timezone     string `json:"timezone"`
	// Anchor: an interval's due times are Anchor + k × Every.
	Anchor time.Time `json:"anchor,omitzero"`
	// Command, or Prompt for Agent with Model and ReasoningEffort.
	Command         string `json:"command,omitempty"`
	Prompt          string `json:"prompt,omitempty"`
	Agent           string `json:"agent,omitempty"`
	Model           string `json:"model,omitempty"`
	ReasoningEffort string `json:"reasoningEffort,omitempty"`
	TimeoutSeconds  int    `json:"timeoutSeconds"`
}

// Kind is "prompt" or "command".
func (s Spec) Kind() string {
	if s.Prompt != "" {
		return "prompt"
	}
	return "command"
}

// Next is the first due time strictly after after; the zero time for
// none (a cron expression that never matches again).
func (s Spec) Next(after time.Time) time.Time {
	if s.EverySeconds > 0 {
		every := time.Duration(s.EverySeconds) * time.Second
		if after.Before(s.Anchor) {
			return s.Anchor
		}
		k := after.Sub(s.Anchor)/every + 1
		return s.Anchor.Add(k * every)
	}
	c, err := s.cron()
	if err != nil {
		return time.Time{}
	}
	return c.Next(after)
}

// maxCounted bounds Missed's count of a cron schedule's due times.
const maxCounted = 100_000

// Missed is how many due times after due and up to now (included) there
// are: those a run at now stands for but does not run.
func (s Spec) Missed(due, now time.Time) int {
	if !now.After(due) {
		return 0
	}
	if s.EverySeconds > 0 {
		return int(now.Sub(due) / (time.Duration(s.EverySeconds) * time.Second))
	}
	c, err := s.cron()
	if err != nil {
		return 0
	}
	n := 0
	for t := c.Next(due); !t.IsZero() && !t.After(now) && n < maxCounted; t = c.Next(t) {
		n++
	}
	return n
}

func (s Spec) cron() (*Cron, error) {
	loc, err := time.LoadLocation(s.Timezone)
	if err != nil {
		return nil, err
	}
	return ParseCron(s.Cron, loc)
}

// invalid is a 400 naming the field.
func invalid(field, format string, args ...any) error {
	return fmt.Errorf("%s: %s: %w", field, fmt.Sprintf(format, args...), errdefs.ErrInvalid)
}

// Patch is a create's or an update's body (the SDK's ScheduleOpts): each
// field is raw JSON, nil when absent, so that an update tells an absent
// field from a null one.
type Patch map[string]json.RawMessage

func (p Patch) has(f string) bool { _, ok := p[f]; return ok }

func (p Patch) null(f string) bool { return string(p[f]) == "null" }

// str reads a string field (null: ""); another type is a 400 naming it.
func (p Patch) str(f string) (string, error) {
	if !p.has(f) || p.null(f) {
		return "", nil
	}
	var v string
	if err := json.Unmarshal(p[f], &v); err != nil {
		return "", invalid(f, "must be a string")
	}
	return v, nil
}

// Apply lays p over spec (a zero Spec for a create) and checks the
// result; enabled is the schedule's switch, changed when p says. now
// anchors a new interval. keepMemory is accepted and ignored: a run puts
// its sandbox back to sleep the way it slept.
func (p Patch) Apply(spec Spec, enabled bool, now time.Time) (Spec, bool, error) {
	s := spec
	every, cron := p.has("every") && !p.null("every"), p.has("cron") && !p.null("cron")
	if every && cron {
		return Spec{}, false, invalid("every", "give every or cron, not both")
	}
	switch {
	case every:
		secs, err := parseEvery(p["every"])
		if err != nil {
			return Spec{}, false, err
		}
		if secs != s.EverySeconds || s.Anchor.IsZero() {
			s.Anchor = now.Truncate(time.Second)
		}
		s.EverySeconds, s.Every, s.Cron = secs, FormatEvery(secs), ""
	case cron:
		v, err := p.str("cron")
		if err != nil {
			return Spec{}, false, err
		}
		s.Cron, s.Every, s.EverySeconds, s.Anchor = strings.TrimSpace(v), "", 0, time.Time{}
	}
	if p.has("timezone") {
		tz, err := p.str("timezone")
		if err != nil {
			return Spec{}, false, err
		}
		s.Timezone = tz
	}
	if s.Timezone == "" {
		s.Timezone = "UTC"
	}
	if s.Timezone == "Local" {
		return Spec{}, false, invalid("timezone", "%q: give an IANA time zone such as Europe/Berlin", s.Timezone)
	}
	loc, err := time.LoadLocation(s.Timezone)
	if err != nil {
		return Spec{}, false, invalid("timezone", "%q is not an IANA time zone (such as UTC or Europe/Berlin)", s.Timezone)
	}
	if s.Cron != "" {
		c, err := ParseCron(s.Cron, loc)
		if err != nil {
			return Spec{}, false, invalid("cron", "%v", err)
		}
		if c.Next(now).IsZero() {
			return Spec{}, false, invalid("cron", "%q never runs", s.Cron)
		}
	}
	if s.Cron == "" && s.EverySeconds == 0 {
		return Spec{}, false, invalid("every", "give every (\"5m\", \"1h\", or seconds) or cron (5 fields)")
	}

	command, prompt := p.has("command") && !p.null("command"), p.has("prompt") && !p.null("prompt")
	if command && prompt {
		return Spec{}, false, invalid("command", "give command or prompt, not both")
	}
	switch {
	case command:
		v, err := p.str("command")
		if err != nil {
			return Spec{}, false, err
		}
		if strings.TrimSpace(v) == "" {
			return Spec{}, false, invalid("command", "must not be empty")
		}
		s.Command, s.Prompt, s.Agent, s.Model, s.ReasoningEffort = v, "", "", "", ""
	case prompt:
		v, err := p.str("prompt")
		if err != nil {
			return Spec{}, false, err
		}
		if strings.TrimSpace(v) == "" {
			return Spec{}, false, invalid("prompt", "must not be empty")
		}
		s.Prompt, s.Command = v, ""
	}
	if s.Command == "" && s.Prompt == "" {
		return Spec{}, false, invalid("command", "give command (a shell command) or prompt (for the sandbox's coding agent)")
	}
	if strings.ContainsRune(s.Command+s.Prompt, 0) {
		return Spec{}, false, invalid(s.Kind(), "holds a NUL byte")
	}
	if len(s.Command) > maxText || len(s.Prompt) > maxText {
		return Spec{}, false, invalid(s.Kind(), "must be at most %d bytes", maxText)
	}
	for _, f := range []struct {
		name string
		dst  *string
	}{{"agent", &s.Agent}, {"model", &s.Model}, {"reasoningEffort", &s.ReasoningEffort}, {"name", &s.Name}} {
		if p.has(f.name) {
			v, err := p.str(f.name)
			if err != nil {
				return Spec{}, false, err
			}
			*f.dst = strings.TrimSpace(v)
		}
	}
	if s.Command != "" && (s.Agent != "" || s.Model != "" || s.ReasoningEffort != "") && (p.has("agent") || p.has("model") || p.has("reasoningEffort")) {
		return Spec{}, false, invalid("agent", "agent, model and reasoningEffort go with prompt, not command")
	}
	if s.Agent != "" {
		if _, ok := agents[s.Agent]; !ok {
			return Spec{}, false, invalid("agent", "%q: must be one of %s", s.Agent, strings.Join(AgentNames(), ", "))
		}
	}
	if s.ReasoningEffort != "" && !slices.Contains(Efforts, s.ReasoningEffort) {
		return Spec{}, false, invalid("reasoningEffort", "%q: must be one of %s", s.ReasoningEffort, strings.Join(Efforts, ", "))
	}
	if len(s.Model) > maxName || strings.ContainsAny(s.Model, "\x00\n") {
		return Spec{}, false, invalid("model", "must be a model name of at most %d characters", maxName)
	}
	if len(s.Name) > maxName {
		return Spec{}, false, invalid("name", "must be at most %d characters", maxName)
	}
	if p.has("timeoutSeconds") && !p.null("timeoutSeconds") {
		var v float64
		if err := json.Unmarshal(p["timeoutSeconds"], &v); err != nil || v != math.Trunc(v) || v < 1 || v > MaxTimeoutSeconds {
			return Spec{}, false, invalid("timeoutSeconds", "must be a whole number of seconds from 1 to %d", MaxTimeoutSeconds)
		}
		s.TimeoutSeconds = int(v)
	}
	if s.TimeoutSeconds == 0 {
		s.TimeoutSeconds = DefaultTimeoutSeconds
	}
	if p.has("keepMemory") && !p.null("keepMemory") {
		var v bool
		if err := json.Unmarshal(p["keepMemory"], &v); err != nil {
			return Spec{}, false, invalid("keepMemory", "must be true or false")
		}
	}
	if p.has("enabled") && !p.null("enabled") {
		if err := json.Unmarshal(p["enabled"], &enabled); err != nil {
			return Spec{}, false, invalid("enabled", "must be true or false")
		}
	}
	return s, enabled, nil
}

// parseEvery reads every: "90s", "5m", "1h", "1h30m", "2d", or a number
// of seconds (a JSON number or a string of digits).
func parseEvery(raw json.RawMessage) (int64, error) {
	var secs float64
	var s string
	switch {
	case json.Unmarshal(raw, &secs) == nil:
	case json.Unmarshal(raw, &s) == nil:
		s = strings.TrimSpace(strings.ToLower(s))
		if n, err := strconv.ParseFloat(s, 64); err == nil {
			secs = n
			break
		}
		d, err := parseDuration(s)
		if err != nil {
			return 0, invalid("every", "%q: must be like \"5m\", \"1h\", \"1h30m\", \"2d\" or a number of seconds", s)
		}
		secs = d.Seconds()
	default:
		return 0, invalid("every", "must be a string such as \"5m\" or a number of seconds")
	}
	if secs != math.Trunc(secs) || secs < MinEvery.Seconds() || secs > MaxEvery.Seconds() {
		return 0, invalid("every", "%v s: must be whole seconds from %d (one minute) to %d (366 days)", secs, int(MinEvery.Seconds()), int64(MaxEvery.Seconds()))
	}
	return int64(secs), nil
}

// parseDuration is time.ParseDuration with days ("2d", "1d12h").
func parseDuration(s string) (time.Duration, error) {
	var days int64
	if i := strings.IndexByte(s, 'd'); i > 0 {
		n, err := strconv.ParseInt(s[:i], 10, 64)
		if err != nil || n > 366 {
			return 0, fmt.Errorf("bad days")
		}
		days, s = n, s[i+1:]
		if s == "" {
			return time.Duration(days) * 24 * time.Hour, nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, err
	}
	return d + time.Duration(days)*24*time.Hour, nil
}

// FormatEvery writes an interval the way it is given: "90s", "5m", "1h",
// "1h30m", "2d".
func FormatEvery(secs int64) string {
	var b strings.Builder
	for _, u := range []struct {
		n    int64
		unit string
	}{{86400, "d"}, {3600, "h"}, {60, "m"}, {1, "s"}} {
		if secs >= u.n {
			fmt.Fprintf(&b, "%d%s", secs/u.n, u.unit)
			secs %= u.n
		}
	}
	return b.String()
}
