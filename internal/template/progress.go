package template

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// Build steps as shown to the user.
const (
	stepResolve = iota + 1
	stepDownload
	stepUnpack
	stepConfigure
	stepFinish
	numSteps = stepFinish
)

var stepNames = [...]string{
	stepResolve:   "resolving packages",
	stepDownload:  "downloading packages",
	stepUnpack:    "unpacking packages",
	stepConfigure: "configuring packages",
	stepFinish:    "configuring template",
}

// reporter writes the human progress display of one build. It is safe for
// concurrent use.
type reporter struct {
	mu    sync.Mutex
	w     io.Writer
	name  string
	start time.Time
	now   func() time.Time

	step     int
	counts   [numSteps + 1]int // per-package lines seen in each step
	detail   string            // shown after the step's name when set
	lastLine time.Time         // when the last step line was written

	tail []string // last lines of tool output, for error messages
}

const tailLines = 25

func newReporter(w io.Writer, name string) *reporter {
	if w == nil {
		w = io.Discard
	}
	r := &reporter{w: w, name: name, now: time.Now}
	r.start = r.now()
	return r
}

func (r *reporter) elapsed() time.Duration { return r.now().Sub(r.start) }

// printf writes one "[name] ..." line.
func (r *reporter) printf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.printfLocked(format, args...)
}

func (r *reporter) printfLocked(format string, args ...any) {
	fmt.Fprintf(r.w, "[%s] %s\n", r.name, fmt.Sprintf(format, args...))
}

func (r *reporter) stepLineLocked() {
	msg := fmt.Sprintf("step %d/%d %s", r.step, numSteps, stepNames[r.step])
	switch total := r.counts[stepDownload]; {
	case r.step == stepDownload && total > 0:
		msg += fmt.Sprintf(": %d", total)
	case (r.step == stepUnpack || r.step == stepConfigure) && total > 0:
		msg += fmt.Sprintf(": %d/%d", min(r.counts[r.step], total), total)
	case r.detail != "":
		msg += ": " + r.detail
	}
	r.printfLocked("%s (%s)", msg, fmtSeconds(r.elapsed()))
	r.lastLine = r.now()
}

// setStep moves the display to step s; steps only move forward.
func (r *reporter) setStep(s int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.setStepLocked(s)
}

func (r *reporter) setStepLocked(s int) {
	if s <= r.step {
		return
	}
	r.step = s
	r.stepLineLocked()
}

// heartbeats shows the step line again while a tool is quiet for 15 s,
// until the returned stop is called.
func (r *reporter) heartbeats() (stop func()) {
	quit := make(chan struct{})
	var beats sync.WaitGroup
	beats.Add(1)
	go func() {
		defer beats.Done()
		tick := time.NewTicker(5 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-quit:
				return
			case <-tick.C:
				r.heartbeat(15 * time.Second)
			}
		}
	}()
	return func() {
		close(quit)
		beats.Wait()
	}
}

// heartbeat repeats the current step line when nothing was printed for
// every; call it periodically.
func (r *reporter) heartbeat(every time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.step > 0 && r.now().Sub(r.lastLine) >= every {
		r.stepLineLocked()
	}
}

// setDetail sets what the step line says after the step's name (when it
// has no package counts of its own); "" says nothing.
func (r *reporter) setDetail(d string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.detail = d
}

// keepLocked adds line to the tail of tool output, trimmed; false if it is
// blank.
func (r *reporter) keepLocked(line *string) bool {
	*line = strings.TrimRight(*line, "\r\n")
	if strings.TrimSpace(*line) == "" {
		return false
	}
	r.tail = append(r.tail, *line)
	if len(r.tail) > tailLines {
		r.tail = r.tail[len(r.tail)-tailLines:]
	}
	return true
}

// toolLine takes one line of output of a tool run after debootstrap
// (apt-get, checks): it is kept for error messages, and apt's warnings are
// shown (its errors are shown with the rest of the output when it fails).
func (r *reporter) toolLine(line string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.keepLocked(&line) && strings.HasPrefix(line, "W: ") {
		r.printfLocked("%s", line)
	}
}

// debootstrapLine takes one line of debootstrap output.
func (r *reporter) debootstrapLine(line string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.keepLocked(&line) {
		return
	}
	switch {
	case strings.HasPrefix(line, "I: "):
		step, perPackage := classifyDebootstrap(strings.TrimPrefix(line, "I: "))
		if step == 0 {
			return
		}
		if step > r.step {
			r.setStepLocked(step)
		}
		if perPackage {
			// Count against the step shown, which may be later than the
			// line's own (debootstrap unpacks base packages after it began
			// configuring the required ones).
			r.counts[r.step]++
		}
	case strings.HasPrefix(line, "W: "), strings.HasPrefix(line, "E: "):
		r.printfLocked("debootstrap: %s", line)
	}
}

// classifyDebootstrap maps an "I: " message of debootstrap to a step and
// whether it is about one package.
func classifyDebootstrap(msg string) (step int, perPackage bool) {
	word, rest, _ := strings.Cut(msg, " ")
	switch word {
	case "Retrieving", "Validating":
		switch first, _, _ := strings.Cut(rest, " "); first {
		case "InRelease", "Release", "Release.gpg", "Packages":
			return stepResolve, false
		}
		return stepDownload, word == "Retrieving"
	case "Checking", "Valid", "Resolving", "Found", "Target", "Keyring", "Using":
		return stepResolve, false
	case "Chosen", "Installing":
		return stepUnpack, false
	case "Extracting":
		return stepUnpack, true
	case "Unpacking":
		// Not counted: every package was already counted when extracted.
		return stepUnpack, false
	case "Configuring":
		return stepConfigure, !strings.HasSuffix(rest, "packages...") && !strings.HasPrefix(rest, "the base system")
	case "Base":
		return stepConfigure, false
	}
	return 0, false
}

// clearTail forgets the tool output seen so far: a failure then shows only
// the output of the tool that failed.
func (r *reporter) clearTail() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tail = nil
}

// outputTail returns the last lines of tool output seen.
func (r *reporter) outputTail() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.tail...)
}

// lineWriter is an io.Writer that calls fn for each complete line.
type lineWriter struct {
	mu  sync.Mutex
	buf []byte
	fn  func(string)
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		w.fn(string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
	if len(w.buf) > 64<<10 { // a "line" that never ends
		w.fn(string(w.buf))
		w.buf = w.buf[:0]
	}
	return len(p), nil
}

// Flush passes on a last unterminated line.
func (w *lineWriter) Flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) > 0 {
		w.fn(string(w.buf))
		w.buf = nil
	}
}

func fmtSeconds(d time.Duration) string {
	return fmt.Sprintf("%d s", int(d.Round(time.Second)/time.Second))
}

func fmtBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}
