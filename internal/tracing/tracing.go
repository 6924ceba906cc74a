// Package tracing is the small set of helpers lizard's packages make
// OpenTelemetry spans with (Start, StartServer, Inject) and the attribute
// keys they carry. The tracer provider is built by the server's wiring
// alone (package tracing/otlp, from the OTEL_* variables and the --otlp-*
// flags; off unless an endpoint is given); every other package makes child
// spans from the span already in its context, so with tracing off (no span
// anywhere) a span costs a context look-up and nothing more. Spans carry
// ids (sandbox, project, image) and route names, never secrets, tokens,
// environment values or file contents.
package tracing
