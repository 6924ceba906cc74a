package tracing

import (
	"context"
	"net/http"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// scope is the instrumentation scope of lizard's spans.
const scope = "github.com/lizard-build/lizard"

// propagator carries a trace between nodes: W3C traceparent and
// tracestate only (no baggage, which could carry anything).
var propagator = propagation.TraceContext{}

// Start starts a span named name as a child of the span in ctx, on that
// span's provider (whose sampler decides). Without a span in ctx
// (tracing off) it starts nothing and returns ctx with a span whose
// methods do nothing, so callers always End what they Start.
func Start(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	return start(ctx, name, trace.SpanKindInternal, attrs)
}

// StartClient is Start for a call to another process (a peer node, an
// agent, the object store).
func StartClient(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	return start(ctx, name, trace.SpanKindClient, attrs)
}

func start(ctx context.Context, name string, kind trace.SpanKind, attrs []attribute.KeyValue) (context.Context, trace.Span) {
	parent := trace.SpanFromContext(ctx)
	if !parent.SpanContext().IsValid() {
		return ctx, noSpan
	}
	return parent.TracerProvider().Tracer(scope).Start(ctx, name, trace.WithSpanKind(kind), trace.WithAttributes(attrs...))
}

// noSpan is the span of a context without one: all its methods do
// nothing.
var noSpan = trace.SpanFromContext(context.Background())

// End ends span, marking it failed when err is not nil. Only err's class
// is recorded (error.type: not_found, unavailable, …, else "error"),
// never its message, which may name paths, hosts or commands.
func End(span trace.Span, err error) {
	if err != nil && span.IsRecording() {
		class := errdefs.ClassName(err)
		if class == "" {
			class = "error"
		}
		span.SetAttributes(semconv.ErrorTypeKey.String(class))
		span.SetStatus(codes.Error, class)
	}
	span.End()
}

// Inject writes the trace of ctx's span into h (traceparent), so that the
// server that receives the request continues it (StartServer).
func Inject(ctx context.Context, h http.Header) {
	if trace.SpanContextFromContext(ctx).IsValid() {
		propagator.Inject(ctx, propagation.HeaderCarrier(h))
	}
}

// StartServer starts the server span of an incoming request, a child of
// the span its traceparent names if it has one (the node that forwarded
// it, or the client's own trace). tp nil (tracing off) starts nothing and
// returns r as it is. The span is named by EndServer, once the route is
// known.
func StartServer(tp trace.TracerProvider, r *http.Request) (*http.Request, trace.Span) {
	if tp == nil {
		return r, noSpan
	}
	ctx := propagator.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	ctx, span := tp.Tracer(scope).Start(ctx, r.Method, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(semconv.HTTPRequestMethodKey.String(r.Method)))
	return r.WithContext(ctx), span
}

// EndServer names a server span by its route pattern (the mux's, e.g.
// "POST /api/sandboxes/{id}/exec", never the path with its ids), records
// the answer's status and attrs, and ends it.
func EndServer(span trace.Span, method, route string, status int, attrs ...attribute.KeyValue) {
	if !span.IsRecording() {
		span.End()
		return
	}
	name := method
	if route != "" {
		name = route
		if !strings.HasPrefix(route, method+" ") {
			name = method + " " + route
		}
		if _, path, ok := strings.Cut(route, " "); ok {
			route = path // http.route is the path's template alone
		}
		span.SetAttributes(semconv.HTTPRoute(route))
	}
	span.SetName(name)
	span.SetAttributes(semconv.HTTPResponseStatusCode(status))
	span.SetAttributes(attrs...)
	if status >= 500 {
		span.SetStatus(codes.Error, "")
	}
	span.End()
}

// Attribute keys lizard's spans carry besides the HTTP semantic
// conventions'.
const (
	SandboxID = attribute.Key("lizard.sandbox.id")
	ProjectID = attribute.Key("lizard.project.id")
	Node      = attribute.Key("lizard.node")
	Image     = attribute.Key("lizard.image")
	Template  = attribute.Key("lizard.template")
	Bytes     = attribute.Key("lizard.bytes")
)
