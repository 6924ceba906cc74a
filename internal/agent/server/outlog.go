package server

import "sync"

// outChunk is one read of a process's output, at byte offset off of its
// whole output.
type outChunk struct {
	off    int64
	stream string
	data   []byte
}

// outputLog is a process's output as its readers see it: the latest bytes
// (at most limit), addressed by offset in the whole output, and the exit
// status once the output is complete. Appending never waits for readers:
// each reader keeps its own offset and, when it falls behind what is kept,
// skips ahead and learns how much it missed. So one slow reader holds
// neither the process nor the others, and memory stays bounded.
type outputLog struct {
	limit int

	mu     sync.Mutex
	chunks []outChunk // oldest first
	kept   int        // bytes in chunks
	end    int64      // offset after the last byte appended
	exit   *int
	errMsg string
	wake   chan struct{} // closed and replaced at every change
}

func newOutputLog(limit int) *outputLog {
	return &outputLog{limit: limit, wake: make(chan struct{})}
}

// append adds data (which it keeps: the caller must not reuse it).
func (l *outputLog) append(stream string, data []byte) {
	if len(data) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.chunks = append(l.chunks, outChunk{off: l.end, stream: stream, data: data})
	l.end += int64(len(data))
	l.kept += len(data)
	for l.kept > l.limit && len(l.chunks) > 1 {
		l.kept -= len(l.chunks[0].data)
		l.chunks[0] = outChunk{}
		l.chunks = l.chunks[1:]
	}
	l.notify()
}

// finish records the exit status; the output is complete.
func (l *outputLog) finish(code int, errMsg string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.exit, l.errMsg = &code, errMsg
	l.notify()
}

func (l *outputLog) notify() {
	close(l.wake)
	l.wake = make(chan struct{})
}

// logView is what a reader at some offset has to read next.
type logView struct {
	chunks  []outChunk // from the reader's offset on (the first may start before it)
	next    int64      // the reader's next offset
	dropped int64      // bytes between the reader's offset and the first kept byte
	exit    *int       // set when chunks hold the rest of the output
	errMsg  string
	wake    <-chan struct{} // closed at the next change
}

// from returns what follows offset off.
func (l *outputLog) from(off int64) logView {
	l.mu.Lock()
	defer l.mu.Unlock()
	v := logView{next: l.end, exit: l.exit, errMsg: l.errMsg, wake: l.wake}
	if len(l.chunks) > 0 && off < l.chunks[0].off {
		v.dropped = l.chunks[0].off - off
		off = l.chunks[0].off
	}
	// Chunks are sorted by offset; readers are mostly near the end.
	i := len(l.chunks)
	for i > 0 && l.chunks[i-1].off+int64(len(l.chunks[i-1].data)) > off {
		i--
	}
	v.chunks = append([]outChunk(nil), l.chunks[i:]...)
	if len(v.chunks) > 0 && v.chunks[0].off < off {
		c := v.chunks[0]
		v.chunks[0] = outChunk{off: off, stream: c.stream, data: c.data[off-c.off:]}
	}
	return v
}
