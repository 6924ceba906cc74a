package otlp

import (
	"context"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/lizard-build/lizard/internal/tracing"
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

// TestOffNothingStarted: with nothing set there is no provider and no
// goroutine.
func TestOffNothingStarted(t *testing.T) {
	before := runtime.NumGoroutine()
	p, err := Setup(context.Background(), Config{Getenv: func(string) string { return "" }})
	if err != nil || p != nil {
		t.Fatalf("Setup = %v, %v; want nil, nil", p, err)
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Fatalf("%d goroutines after Setup, %d before", n, before)
	}
	if p.TracerProvider() != nil || p.Enabled() {
		t.Fatal("a provider with tracing off")
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
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
	_, span := tracing.StartServer(p.TracerProvider(), httptest.NewRequest("GET", "/healthz", nil))
	tracing.EndServer(span, "GET", "GET /healthz", 200)
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
