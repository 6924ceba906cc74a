package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/lizard-build/lizard/internal/tracing"
)

// RequestIDHeader carries a request's id: the client's when it sends a
// sane one, else one made here; the answer always carries it.
const RequestIDHeader = "X-Request-Id"

// maxRequestID bounds a client's request id.
const maxRequestID = 128

// requestID returns the client's id if it is 1–128 characters of letters,
// digits and -_.:, else a new random one. Anything else could forge log
// lines or carry a secret into the logs.
func requestID(r *http.Request) string {
	id := r.Header.Get(RequestIDHeader)
	if len(id) > 0 && len(id) <= maxRequestID && !containsOther(id) {
		return id
	}
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func containsOther(s string) bool {
	for _, c := range []byte(s) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_', c == '.', c == ':':
		default:
			return true
		}
	}
	return false
}

// requestInfo is what handlers tell the request log: the project the key
// resolved to.
type requestInfo struct{ project string }

type requestInfoKey struct{}

// noteProject records the request's project for its log line.
func noteProject(ctx context.Context, projectID string) {
	if ri, ok := ctx.Value(requestInfoKey{}).(*requestInfo); ok {
		ri.project = projectID
	}
}

// recorder remembers the status and counts the bytes of an answer. Unwrap
// lets http.ResponseController reach the connection's Flush, Hijack and
// deadlines.
type recorder struct {
	http.ResponseWriter
	status int
	bytes  int64
}

func (w *recorder) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *recorder) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += int64(n)
	return n, err
}

func (w *recorder) Flush() { http.NewResponseController(w.ResponseWriter).Flush() }

func (w *recorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// spanAttrs are the ids a request's span carries: its project and the
// sandbox its route names.
func spanAttrs(r *http.Request, ri *requestInfo) []attribute.KeyValue {
	var attrs []attribute.KeyValue
	if ri.project != "" {
		attrs = append(attrs, tracing.ProjectID.String(ri.project))
	}
	if _, path, _ := strings.Cut(r.Pattern, " "); strings.HasPrefix(path, "/api/sandboxes/{id}") {
		attrs = append(attrs, tracing.SandboxID.String(r.PathValue("id")))
	}
	return attrs
}

// logged gives each request its id, starts its span, turns a panic into a 500 JSON answer,
// logs one line per request and counts it in the metrics. Only the route
// pattern is logged and counted, never the query (a preview token may be
// in one) or headers (API keys).
func (s *server) logged(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		r, span := tracing.StartServer(s.tracing, r)
		id := requestID(r)
		w.Header().Set(RequestIDHeader, id)
		ri := &requestInfo{}
		r = r.WithContext(context.WithValue(r.Context(), requestInfoKey{}, ri))
		rec := &recorder{ResponseWriter: w}
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				s.log.Error("panic in handler", "method", r.Method, "path", r.URL.Path, "request_id", id, "panic", v)
				writeError(rec, r, s.log, fmt.Errorf("panic: %v", v))
			}
			status := rec.status
			if status == 0 {
				status = http.StatusOK // nothing written: net/http answers 200
			}
			took := time.Since(start)
			// The mux sets the pattern on the request it was handed.
			s.metrics.APIRequest(r.Pattern, status, took)
			s.log.LogAttrs(r.Context(), slog.LevelInfo, "request",
				slog.String("method", r.Method), slog.String("route", r.Pattern), slog.Int("status", status),
				slog.Int64("bytes", rec.bytes), slog.Float64("duration_ms", float64(took.Microseconds())/1000),
				slog.String("project", ri.project), slog.String("request_id", id))
			tracing.EndServer(span, r.Method, r.Pattern, status, spanAttrs(r, ri)...)
		}()
		next.ServeHTTP(rec, r)
	})
}
