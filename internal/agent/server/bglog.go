package server

import (
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/lizard-build/lizard/internal/agent"
)

// bgLog keeps what background processes write after their exec's stream
// ended (a `server &` started by a command): the node shows it in the
// sandbox's log. It holds the last maxBackgroundLines lines.
type bgLog struct {
	mu    sync.Mutex
	lines []agent.LogLine
	next  int64
}

const maxBackgroundLines = 10000

func (b *bgLog) add(pid int, stream, line string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lines = append(b.lines, agent.LogLine{Seq: b.next, Time: time.Now().UTC().Format(time.RFC3339Nano), Pid: pid, Stream: stream, Line: line})
	b.next++
	if len(b.lines) > maxBackgroundLines {
		b.lines = b.lines[len(b.lines)-maxBackgroundLines:]
	}
}

// since returns the lines numbered after or later, and the next number.
func (b *bgLog) since(after int64) agent.LogsReply {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := agent.LogsReply{Next: b.next, Lines: []agent.LogLine{}}
	for _, l := range b.lines {
		if l.Seq >= after {
			out.Lines = append(out.Lines, l)
		}
	}
	return out
}

// backgroundLogs answers GET /logs?after=N.
func (s *Server) backgroundLogs(w http.ResponseWriter, r *http.Request) error {
	var after int64
	if a := r.URL.Query().Get("after"); a != "" {
		n, err := strconv.ParseInt(a, 10, 64)
		if err != nil || n < 0 {
			return errInvalid("after %q: must be a line number", a)
		}
		after = n
	}
	writeJSON(w, http.StatusOK, s.bg.since(after))
	return nil
}
