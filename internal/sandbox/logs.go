package sandbox

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// LogLine is one line of a sandbox's log: a lifecycle event, or a line of
// output of a command started through exec.
type LogLine struct {
	Timestamp time.Time `json:"timestamp"`
	Type      string    `json:"type"` // "lifecycle", "stdout" or "stderr"
	Message   string    `json:"message"`
	Pid       int       `json:"pid,omitempty"`
	// Background marks output a process wrote after its exec returned.
	Background bool `json:"background,omitempty"`
}

// MaxLogTail caps how many lines a log stream replays.
const MaxLogTail = 10000

// DefaultLogMaxBytes is the disk a sandbox's log may take unless
// configured.
const DefaultLogMaxBytes = 8 << 20

// logs appends sandbox logs to files under dir (so they survive a restart
// of the server) and fans new lines out to followers. Each sandbox's log
// is a ring of two segments, <id>.log and the older <id>.log.1, of at most
// half of maxBytes each: when the current one is full it becomes the older
// one, and the oldest lines go. The newest output is always kept, and no
// command's output flood takes more than maxBytes of disk.
type logs struct {
	dir      string
	maxBytes int64

	mu        sync.Mutex
	followers map[string]map[chan LogLine]struct{}
	sizes     map[string]int64 // the current segment's size, once known
}

func newLogs(dir string, maxBytes int64) *logs {
	if dir != "" {
		os.MkdirAll(dir, 0o700)
	}
	if maxBytes <= 0 {
		maxBytes = DefaultLogMaxBytes
	}
	return &logs{dir: dir, maxBytes: maxBytes, followers: map[string]map[chan LogLine]struct{}{}, sizes: map[string]int64{}}
}

func (l *logs) path(id string) string { return filepath.Join(l.dir, id+".log") }

// older is the segment before the current one.
func (l *logs) older(id string) string { return l.path(id) + ".1" }

// segment is the most a segment holds.
func (l *logs) segment() int64 { return l.maxBytes / 2 }

// write appends b to sandbox id's current segment, first rotating it when
// b would take it over a segment's size. Caller holds l.mu.
func (l *logs) write(id string, b []byte) {
	size, known := l.sizes[id]
	if !known {
		if fi, err := os.Stat(l.path(id)); err == nil {
			size = fi.Size()
		}
	}
	if size > 0 && size+int64(len(b)) > l.segment() {
		if err := os.Rename(l.path(id), l.older(id)); err == nil {
			size = 0
		}
	}
	f, err := os.OpenFile(l.path(id), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return
	}
	n, _ := f.Write(b)
	f.Close()
	l.sizes[id] = size + int64(n)
}

// add appends a line to sandbox id's log and hands it to its followers; a
// follower that does not keep up loses lines rather than slowing commands.
func (l *logs) add(id string, line LogLine) {
	if l.dir == "" {
		return
	}
	if line.Timestamp.IsZero() {
		line.Timestamp = time.Now().UTC()
	}
	stored := line
	// A line longer than a quarter of a segment is cut, so that a segment
	// always holds several.
	if limit := int(l.segment() / 4); len(stored.Message) > limit {
		stored.Message = stored.Message[:limit] + " [line cut: the log keeps at most " + strconv.Itoa(limit) + " bytes of one line]"
	}
	b, _ := json.Marshal(stored)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.write(id, append(b, '\n'))
	for c := range l.followers[id] {
		select {
		case c <- line:
		default:
		}
	}
}

func (l *logs) event(id, format string, args ...any) {
	l.add(id, LogLine{Type: "lifecycle", Message: fmt.Sprintf(format, args...)})
}

// tail returns the last n lines of sandbox id's log, from both segments.
func (l *logs) tail(id string, n int) []LogLine {
	var ring []LogLine
	l.mu.Lock()
	// The two opens go together, so that a rotation between them cannot
	// show a segment twice or skip one.
	older, _ := os.Open(l.older(id))
	cur, _ := os.Open(l.path(id))
	l.mu.Unlock()
	for _, f := range []*os.File{older, cur} {
		if f == nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			var line LogLine
			if json.Unmarshal(sc.Bytes(), &line) != nil {
				continue
			}
			ring = append(ring, line)
			if len(ring) > n {
				ring = ring[1:]
			}
		}
		f.Close()
	}
	return ring
}

func (l *logs) follow(id string) (chan LogLine, func()) {
	c := make(chan LogLine, 1024)
	l.mu.Lock()
	if l.followers[id] == nil {
		l.followers[id] = map[chan LogLine]struct{}{}
	}
	l.followers[id][c] = struct{}{}
	l.mu.Unlock()
	return c, func() {
		l.mu.Lock()
		delete(l.followers[id], c)
		l.mu.Unlock()
	}
}

// remove deletes sandbox id's log and ends its followers' streams.
func (l *logs) remove(id string) {
	if l.dir == "" {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for c := range l.followers[id] {
		close(c)
	}
	delete(l.followers, id)
	delete(l.sizes, id)
	os.Remove(l.path(id))
	os.Remove(l.older(id))
}

// Logs replays the last tail lines of the sandbox's log, then each new
// line as it comes, to fn, until ctx is done, fn fails or the sandbox goes.
// The log merges what the service recorded (lifecycle events, exec output)
// with what background processes wrote after their exec ended, which the
// agent keeps and the stream polls for.
func (s *Service) Logs(ctx context.Context, projectID, id string, tail int, fn func(LogLine) error) error {
	if tail < 0 || tail > MaxLogTail {
		return fmt.Errorf("tail %d: must be 0 to %d: %w", tail, MaxLogTail, errdefs.ErrInvalid)
	}
	if _, err := s.lookup(projectID, id); err != nil {
		return err
	}
	c, stop := s.logs.follow(id)
	defer stop()
	lines, next := s.lastLogs(ctx, projectID, id, tail)
	for _, line := range lines {
		if err := fn(line); err != nil {
			return err
		}
	}
	poll := time.NewTicker(500 * time.Millisecond)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case line, ok := <-c:
			if !ok {
				return nil
			}
			if err := fn(line); err != nil {
				return err
			}
		case <-poll.C:
			var lines []LogLine
			lines, next = s.background(ctx, projectID, id, next)
			for _, line := range lines {
				if err := fn(line); err != nil {
					return err
				}
			}
		}
	}
}

// LogTail returns the sandbox's last tail log lines (the ones Logs
// replays) without following.
func (s *Service) LogTail(ctx context.Context, projectID, id string, tail int) ([]LogLine, error) {
	if tail < 0 || tail > MaxLogTail {
		return nil, fmt.Errorf("tail %d: must be 0 to %d: %w", tail, MaxLogTail, errdefs.ErrInvalid)
	}
	if _, err := s.lookup(projectID, id); err != nil {
		return nil, err
	}
	lines, _ := s.lastLogs(ctx, projectID, id, tail)
	return lines, nil
}

// lastLogs merges the last tail lines of the service's log and the agent's
// background output by time, and returns the agent's next line number.
func (s *Service) lastLogs(ctx context.Context, projectID, id string, tail int) ([]LogLine, int64) {
	bg, next := s.background(ctx, projectID, id, 0)
	if tail == 0 {
		return nil, next
	}
	lines := append(s.logs.tail(id, tail), bg...)
	sort.SliceStable(lines, func(i, j int) bool { return lines[i].Timestamp.Before(lines[j].Timestamp) })
	if len(lines) > tail {
		lines = lines[len(lines)-tail:]
	}
	return lines, next
}

// background fetches the agent's background output from line after on; a
// sandbox that is paused (or whose agent does not answer) has none to give
// now, and after stays.
func (s *Service) background(ctx context.Context, projectID, id string, after int64) ([]LogLine, int64) {
	ag, _, err := s.Agent(projectID, id)
	if err != nil {
		return nil, after
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	rep, err := ag.BackgroundLogs(ctx, after)
	if err != nil {
		return nil, after
	}
	out := make([]LogLine, 0, len(rep.Lines))
	for _, l := range rep.Lines {
		t, _ := time.Parse(time.RFC3339Nano, l.Time)
		out = append(out, LogLine{Timestamp: t, Type: l.Stream, Message: l.Line, Pid: l.Pid, Background: true})
	}
	return out, rep.Next
}
