// Package otlptest is an OTLP/HTTP trace receiver for the tests and the
// bench: it decodes every export with the official OTLP protobufs (gzip
// or not) and keeps the spans and the raw bodies, so that a caller can
// look at what lizard exported, or only count it.
package otlptest

import (
	"compress/gzip"
	"io"
	"net"
	"net/http"
	"sync"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// Receiver is an OTLP/HTTP trace receiver's handler.
type Receiver struct {
	mu    sync.Mutex
	raw   [][]byte
	spans []*tracepb.Span
}

// Start serves a new Receiver on addr (host:port; port 0 picks one) until
// stop is called; url is what --otlp-endpoint takes.
func Start(addr string) (r *Receiver, url string, stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", nil, err
	}
	r = &Receiver{}
	srv := &http.Server{Handler: r}
	go srv.Serve(ln)
	return r, "http://" + ln.Addr().String(), func() { srv.Close() }, nil
}

// ServeHTTP takes one export: a POST of /v1/traces in protobuf; anything
// else is a 400.
func (r *Receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != "POST" || req.URL.Path != "/v1/traces" || req.Header.Get("Content-Type") != "application/x-protobuf" {
		http.Error(w, "not an OTLP/HTTP protobuf trace export", http.StatusBadRequest)
		return
	}
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	b, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var export coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &export); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	r.raw = append(r.raw, b)
	for _, rs := range export.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			r.spans = append(r.spans, ss.Spans...)
		}
	}
	r.mu.Unlock()
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(out)
}

// Snapshot is what the receiver holds now: the spans, and each export's
// body as it came (uncompressed).
func (r *Receiver) Snapshot() ([]*tracepb.Span, [][]byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*tracepb.Span(nil), r.spans...), append([][]byte(nil), r.raw...)
}
