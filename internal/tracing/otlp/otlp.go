// Package otlp is the tracer provider that `lizard serve` builds from the
// standard OTEL_* variables and its --otlp-* flags (Setup; off unless an
// endpoint is given), exporting lizard's spans (package tracing) over
// OTLP. Only the server's wiring imports it: the exporters, the SDK and
// gRPC stay out of every other binary (the sandbox agent links package
// tracing for its client's spans, not this).
package otlp

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// Protocols of OTEL_EXPORTER_OTLP_PROTOCOL and --otlp-protocol.
const (
	ProtocolGRPC = "grpc"
	ProtocolHTTP = "http/protobuf"
)

// DefaultServiceName is the service.name of lizard's spans unless
// OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES says otherwise.
const DefaultServiceName = "lizard"

// Config is what the operator set besides the OTEL_* variables: the
// --otlp-endpoint and --otlp-protocol flags (config keys otlp-endpoint,
// otlp-protocol). They win over the variables.
type Config struct {
	// Endpoint is the OTLP receiver's base URL (http://host:4318 for
	// http/protobuf, http://host:4317 for grpc; https for TLS), as
	// OTEL_EXPORTER_OTLP_ENDPOINT: the HTTP exporter appends
	// /v1/traces. Empty: the variables decide.
	Endpoint string
	// Protocol is grpc or http/protobuf; empty: the variables decide,
	// else http/protobuf.
	Protocol string
	// Version is lizard's, the resource's service.version.
	Version string
	// Getenv reads a variable; nil is os.Getenv. The exporters read
	// their own variables (headers, TLS, timeout, compression) from the
	// process's environment as the SDK documents.
	Getenv func(string) string
}

// Provider is the tracer provider of one server. The zero of *Provider
// (nil, what Setup returns with tracing off) is valid: no spans, nothing
// to shut down.
type Provider struct {
	tp       *sdktrace.TracerProvider
	endpoint string
	protocol string
}

// Setup builds the tracer provider that Config and the OTEL_* variables
// ask for. Tracing is on when OTEL_SDK_DISABLED is not true and an
// endpoint is given (Config.Endpoint, OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) or OTEL_TRACES_EXPORTER is otlp;
// otherwise it returns nil and starts nothing. A setting it cannot honour
// (an unknown protocol, sampler or exporter, an endpoint that is not a URL)
// is an error, so that a server does not start with tracing silently off.
func Setup(ctx context.Context, cfg Config) (*Provider, error) {
	env := cfg.Getenv
	if env == nil {
		env = os.Getenv
	}
	if v := strings.TrimSpace(env("OTEL_SDK_DISABLED")); v != "" {
		off, err := strconv.ParseBool(v)
		if err != nil {
			return nil, fmt.Errorf("OTEL_SDK_DISABLED=%q: want true or false", v)
		}
		if off {
			return nil, nil
		}
	}
	exporter := strings.ToLower(strings.TrimSpace(env("OTEL_TRACES_EXPORTER")))
	switch exporter {
	case "", "otlp":
	case "none":
		return nil, nil
	default:
		return nil, fmt.Errorf("OTEL_TRACES_EXPORTER=%q: lizard exports traces with otlp only (or none)", exporter)
	}
	protocol, err := pickProtocol(cfg.Protocol, env)
	if err != nil {
		return nil, err
	}
	if err := checkSampler(env); err != nil {
		return nil, err
	}
	endpoint := cfg.Endpoint
	for _, name := range []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"} {
		if v := strings.TrimSpace(env(name)); v != "" {
			if err := checkURL(v); err != nil {
				return nil, fmt.Errorf("%s=%q: %w", name, v, err)
			}
			if endpoint == "" {
				endpoint = v
			}
		}
	}
	if cfg.Endpoint != "" {
		if err := checkURL(cfg.Endpoint); err != nil {
			return nil, fmt.Errorf("--otlp-endpoint %q: %w", cfg.Endpoint, err)
		}
	}
	if endpoint == "" && exporter == "" {
		return nil, nil // off by default
	}
	exp, err := newExporter(ctx, protocol, cfg.Endpoint)
	if err != nil {
		return nil, fmt.Errorf("tracing: %s exporter: %w", protocol, err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(DefaultServiceName), semconv.ServiceVersion(cfg.Version)),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES win
		resource.WithTelemetrySDK(),
		resource.WithHost(),
	)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		exp.Shutdown(ctx)
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	// No sampler option: the SDK reads OTEL_TRACES_SAMPLER and its
	// argument (default parentbased_always_on).
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	if endpoint == "" {
		endpoint = "(the exporter's default)"
	}
	return &Provider{tp: tp, endpoint: endpoint, protocol: protocol}, nil
}

// pickProtocol is the flag's protocol, else the variables', else
// http/protobuf (the specification's default).
func pickProtocol(flag string, env func(string) string) (string, error) {
	for _, src := range []struct{ name, v string }{
		{"--otlp-protocol", flag},
		{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")},
		{"OTEL_EXPORTER_OTLP_PROTOCOL", env("OTEL_EXPORTER_OTLP_PROTOCOL")},
	} {
		v := strings.TrimSpace(src.v)
		switch v {
		case "":
			continue
		case ProtocolGRPC, ProtocolHTTP:
			return v, nil
		}
		return "", fmt.Errorf("%s=%q: want %s or %s", src.name, v, ProtocolGRPC, ProtocolHTTP)
	}
	return ProtocolHTTP, nil
}

// checkSampler refuses what the SDK would only log and ignore.
func checkSampler(env func(string) string) error {
	s := strings.ToLower(strings.TrimSpace(env("OTEL_TRACES_SAMPLER")))
	arg := strings.TrimSpace(env("OTEL_TRACES_SAMPLER_ARG"))
	switch s {
	case "", "always_on", "always_off", "parentbased_always_on", "parentbased_always_off":
		return nil
	case "traceidratio", "parentbased_traceidratio":
		if arg == "" {
			return nil
		}
		if r, err := strconv.ParseFloat(arg, 64); err != nil || r < 0 || r > 1 {
			return fmt.Errorf("OTEL_TRACES_SAMPLER_ARG=%q: want a ratio from 0 to 1", arg)
		}
		return nil
	}
	return fmt.Errorf("OTEL_TRACES_SAMPLER=%q: want always_on, always_off, traceidratio or their parentbased_ forms", s)
}

// checkURL accepts an http or https URL with a host.
func checkURL(v string) error {
	u, err := url.Parse(v)
	if err != nil {
		return err
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errors.New("want an http:// or https:// URL with a host, e.g. http://localhost:4318")
	}
	return nil
}

// newExporter makes the exporter of protocol. The flag's endpoint, if any,
// is given as options, which win over the variables; everything else
// (headers, TLS, timeout, compression) the exporter reads from them.
func newExporter(ctx context.Context, protocol, endpoint string) (*otlptrace.Exporter, error) {
	var u *url.URL
	if endpoint != "" {
		u, _ = url.Parse(endpoint) // checked
	}
	if protocol == ProtocolGRPC {
		var opts []otlptracegrpc.Option
		if u != nil {
			opts = append(opts, otlptracegrpc.WithEndpoint(u.Host))
			if u.Scheme == "http" {
				opts = append(opts, otlptracegrpc.WithInsecure())
			}
		}
		return otlptracegrpc.New(ctx, opts...)
	}
	var opts []otlptracehttp.Option
	if u != nil {
		opts = append(opts, otlptracehttp.WithEndpoint(u.Host), otlptracehttp.WithURLPath(path.Join("/", u.Path, "v1/traces")))
		if u.Scheme == "http" {
			opts = append(opts, otlptracehttp.WithInsecure())
		}
	}
	return otlptracehttp.New(ctx, opts...)
}

// Enabled reports whether spans are exported.
func (p *Provider) Enabled() bool { return p != nil }

// TracerProvider is what the server's packages make their spans with;
// nil when tracing is off (the helpers of this package take nil as off).
func (p *Provider) TracerProvider() trace.TracerProvider {
	if p == nil {
		return nil
	}
	return p.tp
}

// String says where spans go, for the log.
func (p *Provider) String() string {
	if p == nil {
		return "off"
	}
	return p.protocol + " " + p.endpoint
}

// Shutdown exports the spans still buffered and stops the exporter; call
// it once the servers have stopped. A second call does nothing.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil {
		return nil
	}
	return p.tp.Shutdown(ctx)
}
