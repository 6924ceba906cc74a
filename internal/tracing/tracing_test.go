package tracing

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// TestOffCostsNothing: without a provider (tracing off) the helpers make
// no span.
func TestOffCostsNothing(t *testing.T) {
	r := httptest.NewRequest("GET", "/api/sandboxes/x", nil)
	r.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	r2, span := StartServer(nil, r)
	if r2 != r || span.IsRecording() {
		t.Fatal("StartServer made a span with tracing off")
	}
	ctx, child := Start(r2.Context(), "step")
	if child.IsRecording() || ctx != r2.Context() {
		t.Fatal("Start made a span with tracing off")
	}
	h := http.Header{}
	Inject(ctx, h)
	if len(h) != 0 {
		t.Fatalf("Inject wrote %v with tracing off", h)
	}
	EndServer(span, "GET", "GET /api/sandboxes/{id}", 200)
	End(child, nil)
}

// server is a test API: the route names spans, and a handler that
// calls next (if any) forwards, as cluster.Router does.
func server(tp trace.TracerProvider, next string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/sandboxes/{id}/exec", func(w http.ResponseWriter, r *http.Request) {
		_, step := Start(r.Context(), "runtime exec", SandboxID.String(r.PathValue("id")))
		End(step, nil)
		if next == "" {
			w.WriteHeader(http.StatusAccepted)
			return
		}
		ctx, span := StartClient(r.Context(), "forward api")
		req, _ := http.NewRequestWithContext(ctx, r.Method, next+r.URL.Path, nil)
		Inject(ctx, req.Header)
		resp, err := http.DefaultClient.Do(req)
		End(span, err)
		if err != nil {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		resp.Body.Close()
		w.WriteHeader(resp.StatusCode)
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r, span := StartServer(tp, r)
		rec := &statusRecorder{ResponseWriter: w, status: 200}
		mux.ServeHTTP(rec, r)
		EndServer(span, r.Method, r.Pattern, rec.status, ProjectID.String("p1"))
	})
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (w *statusRecorder) WriteHeader(s int) { w.status = s; w.ResponseWriter.WriteHeader(s) }

func recorder() (*tracetest.SpanRecorder, *sdktrace.TracerProvider) {
	rec := tracetest.NewSpanRecorder()
	return rec, sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

func TestServerSpan(t *testing.T) {
	rec, tp := recorder()
	srv := httptest.NewServer(server(tp, ""))
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/api/sandboxes/sb-123/exec", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	spans := rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want the step and the request", len(spans))
	}
	step, req := spans[0], spans[1]
	if req.Name() != "POST /api/sandboxes/{id}/exec" || req.SpanKind() != trace.SpanKindServer {
		t.Fatalf("request span %q (%v), want the route's name, a server span", req.Name(), req.SpanKind())
	}
	a := attrs(req)
	for k, want := range map[attribute.Key]string{"http.request.method": "POST", "http.route": "/api/sandboxes/{id}/exec", "lizard.project.id": "p1"} {
		if got := a[k].AsString(); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	if got := a["http.response.status_code"].AsInt64(); got != http.StatusAccepted {
		t.Errorf("status %d", got)
	}
	if step.Parent().SpanID() != req.SpanContext().SpanID() || attrs(step)[SandboxID].AsString() != "sb-123" {
		t.Errorf("step span %q: parent %v, attrs %v", step.Name(), step.Parent().SpanID(), step.Attributes())
	}
}

// TestPropagation: a request forwarded from one server to another is one
// trace, the owner's server span a child of the forwarder's client span.
func TestPropagation(t *testing.T) {
	recB, tpB := recorder()
	owner := httptest.NewServer(server(tpB, ""))
	defer owner.Close()
	recA, tpA := recorder()
	front := httptest.NewServer(server(tpA, owner.URL))
	defer front.Close()

	resp, err := http.Post(front.URL+"/api/sandboxes/sb-1/exec", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var fwd, frontSrv, ownerSrv sdktrace.ReadOnlySpan
	for _, s := range recA.Ended() {
		switch s.SpanKind() {
		case trace.SpanKindClient:
			fwd = s
		case trace.SpanKindServer:
			frontSrv = s
		}
	}
	for _, s := range recB.Ended() {
		if s.SpanKind() == trace.SpanKindServer {
			ownerSrv = s
		}
	}
	if fwd == nil || frontSrv == nil || ownerSrv == nil {
		t.Fatalf("spans missing: forward %v, front %v, owner %v", fwd, frontSrv, ownerSrv)
	}
	tid := frontSrv.SpanContext().TraceID()
	if fwd.SpanContext().TraceID() != tid || ownerSrv.SpanContext().TraceID() != tid {
		t.Fatalf("trace ids: front %s, forward %s, owner %s; want one", tid, fwd.SpanContext().TraceID(), ownerSrv.SpanContext().TraceID())
	}
	if fwd.Parent().SpanID() != frontSrv.SpanContext().SpanID() {
		t.Error("the forward span is not a child of the front's server span")
	}
	if ownerSrv.Parent().SpanID() != fwd.SpanContext().SpanID() || !ownerSrv.Parent().IsRemote() {
		t.Error("the owner's server span is not a (remote) child of the forward span")
	}
}
