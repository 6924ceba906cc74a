package apiclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
)

// InProcess is a transport that serves each request with h, the API's own
// handler in this process, instead of sending it over a connection: the
// request goes through everything a request from the network goes through
// (authentication with its key, rate limits, the request log, routing in a
// cluster). The answer streams: the response is returned once h has
// written its header, and its body is what h writes, as h writes it (a
// flush is a no-op: every write reaches the reader). The request's context
// is h's; its end, or closing the body, makes h's further writes fail.
func InProcess(h http.Handler) http.RoundTripper { return inProcess{h: h} }

type inProcess struct{ h http.Handler }

func (t inProcess) RoundTrip(req *http.Request) (*http.Response, error) {
	// The request as a server sees it.
	sreq := req.Clone(req.Context())
	sreq.RequestURI = req.URL.RequestURI()
	if sreq.Host == "" {
		sreq.Host = req.URL.Host
	}
	if sreq.Body == nil {
		sreq.Body = http.NoBody
	}
	pr, pw := io.Pipe()
	w := &pipeWriter{header: http.Header{}, pw: pw, sent: make(chan struct{})}
	go func() {
		defer func() {
			if v := recover(); v != nil {
				// What net/http does for a handler's panic: the answer is
				// cut short. http.ErrAbortHandler is how a handler asks
				// for that.
				w.WriteHeader(http.StatusInternalServerError)
				pw.CloseWithError(fmt.Errorf("the API handler panicked: %v", v))
				return
			}
			w.WriteHeader(http.StatusOK)
			pw.Close()
		}()
		t.h.ServeHTTP(w, sreq)
	}()
	// When the request's context ends the handler sees it and returns, and
	// a write it is blocked in fails: net/http's transport cuts a body
	// short the same way.
	ctx := req.Context()
	stop := context.AfterFunc(ctx, func() { pr.CloseWithError(ctx.Err()) })
	select {
	case <-w.sent:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return &http.Response{
		Status:        fmt.Sprintf("%d %s", w.status, http.StatusText(w.status)),
		StatusCode:    w.status,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        w.sentHeader,
		Body:          pipeBody{pr: pr, stop: stop},
		ContentLength: -1,
		Request:       req,
	}, nil
}

// pipeBody is the reading end of an answer; closing it ends the handler's
// writes with an error, as a client that hangs up does.
type pipeBody struct {
	pr   *io.PipeReader
	stop func() bool
}

func (b pipeBody) Read(p []byte) (int, error) { return b.pr.Read(p) }

func (b pipeBody) Close() error {
	b.stop()
	b.pr.CloseWithError(errBodyClosed)
	return nil
}

var errBodyClosed = errors.New("the client closed the answer's body")

// pipeWriter is the http.ResponseWriter the handler writes to.
type pipeWriter struct {
	header http.Header
	pw     *io.PipeWriter

	once       sync.Once
	sent       chan struct{} // closed once the status and header are set
	status     int
	sentHeader http.Header
}

func (w *pipeWriter) Header() http.Header { return w.header }

func (w *pipeWriter) WriteHeader(status int) {
	if status >= 100 && status < 200 {
		return // informational answers are not the answer
	}
	w.once.Do(func() {
		w.status, w.sentHeader = status, w.header.Clone()
		close(w.sent)
	})
}

func (w *pipeWriter) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.pw.Write(b)
}

// Flush does nothing: a pipe hands every write to the reader at once.
func (w *pipeWriter) Flush() {}
