package tracing

import (
	"context"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

func TestSetup(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cfg     Config
		env     map[string]string
		on      bool
		wantErr string
	}{
		{name: "nothing set: off"},
		{name: "endpoint variable", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, on: true},
		{name: "traces endpoint, grpc", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, on: true},
		{name: "flag", cfg: Config{Endpoint: "http://127.0.0.1:4318"}, on: true},
		{name: "flag, grpc", cfg: Config{Endpoint: "https://collector:4317", Protocol: "grpc"}, on: true},
		{name: "exporter otlp alone", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, on: true},
		{name: "disabled wins", cfg: Config{Endpoint: "http://127.0.0.1:4318"}, env: map[string]string{"OTEL_SDK_DISABLED": "true"}},
		{name: "exporter none", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_TRACES_EXPORTER": "none"}},
		{name: "sampler with ratio", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
			"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25"}, on: true},

		{name: "unknown protocol", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
			wantErr: `OTEL_EXPORTER_OTLP_PROTOCOL="http/json": want grpc or http/protobuf`},
		{name: "unknown protocol, off", env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "thrift"}, wantErr: "OTEL_EXPORTER_OTLP_PROTOCOL"},
		{name: "unknown flag protocol", cfg: Config{Endpoint: "http://127.0.0.1:4318", Protocol: "udp"}, wantErr: "--otlp-protocol"},
		{name: "endpoint not a URL", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, wantErr: "OTEL_EXPORTER_OTLP_ENDPOINT"},
		{name: "flag not a URL", cfg: Config{Endpoint: "localhost"}, wantErr: "--otlp-endpoint"},
		{name: "unknown sampler", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_TRACES_SAMPLER": "sometimes"}, wantErr: "OTEL_TRACES_SAMPLER"},
		{name: "bad ratio", env: map[string]string{"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"}, wantErr: "OTEL_TRACES_SAMPLER_ARG"},
		{name: "unknown exporter", env: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, wantErr: "OTEL_TRACES_EXPORTER"},
		{name: "bad disabled", env: map[string]string{"OTEL_SDK_DISABLED": "maybe"}, wantErr: "OTEL_SDK_DISABLED"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Getenv = func(k string) string { return tc.env[k] }
			p, err := Setup(context.Background(), tc.cfg)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Setup: %v, want an error with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer p.Shutdown(context.Background())
			if p.Enabled() != tc.on || (p.TracerProvider() != nil) != tc.on {
				t.Fatalf("enabled %v, provider %v; want on=%v", p.Enabled(), p.TracerProvider(), tc.on)
			}
		})
	}
}

// TestOffCostsNothing: with nothing set there is no provider, no
// goroutine, and the helpers make no span.
func TestOffCostsNothing(t *testing.T) {
	before := runtime.NumGoroutine()
	p, err := Setup(context.Background(), Config{Getenv: func(string) string { return "" }})
	if err != nil || p != nil {
		t.Fatalf("Setup = %v, %v; want nil, nil", p, err)
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Fatalf("%d goroutines after Setup, %d before", n, before)
	}
	r := httptest.NewRequest("GET", "/api/sandboxes/x", nil)
	r.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	r2, span := StartServer(p.TracerProvider(), r)
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
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
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

// TestExport: spans reach an OTLP/HTTP receiver named by the flag, and
// Shutdown flushes them.
func TestExport(t *testing.T) {
	got := make(chan string, 10)
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Method + " " + r.URL.Path + " " + r.Header.Get("Content-Type")
	}))
	defer recv.Close()
	p, err := Setup(context.Background(), Config{Endpoint: recv.URL, Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	_, span := StartServer(p.TracerProvider(), httptest.NewRequest("GET", "/healthz", nil))
	EndServer(span, "GET", "GET /healthz", 200)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-got:
		if s != "POST /v1/traces application/x-protobuf" {
			t.Fatalf("receiver got %s", s)
		}
	default:
		t.Fatal("nothing exported by Shutdown")
	}
}
