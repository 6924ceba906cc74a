package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAPIURL: the first start's banner names where the API listens; a
// wildcard listen address is reached on the loopback address.
func TestAPIURL(t *testing.T) {
	tests := []struct{ listen, want string }{
		{"127.0.0.1:8080", "http://127.0.0.1:8080"},
		{":9000", "http://127.0.0.1:9000"},
		{"0.0.0.0:9000", "http://127.0.0.1:9000"},
		{"[::]:9000", "http://127.0.0.1:9000"},
		{"[::1]:9000", "http://[::1]:9000"},
		{"[fd00::5]:80", "http://[fd00::5]:80"},
		{"10.1.2.3:8443", "http://10.1.2.3:8443"},
		{"localhost:7000", "http://localhost:7000"},
	}
	for _, tt := range tests {
		if got := apiURL(tt.listen); got != tt.want {
			t.Errorf("apiURL(%q) = %q, want %q", tt.listen, got, tt.want)
		}
	}
	var out bytes.Buffer
	(&firstKey{slug: "default", key: "lz_k"}).print(&out, apiURL(":9000"))
	if !strings.Contains(out.String(), "export LIZARD_API_URL=http://127.0.0.1:9000 LIZARD_API_KEY=lz_k") {
		t.Errorf("banner %q", out.String())
	}
}

// TestValidRegion: --region takes names such as us-east-1 and refuses the
// rest naming the flag.
func TestValidRegion(t *testing.T) {
	for _, r := range []string{"local", "us-east-1", "eu-west-lim-a", "r1", strings.Repeat("a", 64)} {
		if err := validRegion(r); err != nil {
			t.Errorf("validRegion(%q): %v", r, err)
		}
	}
	for _, r := range []string{"", "US-East", "-east", "east-", "a b", "eu_west", strings.Repeat("a", 65)} {
		if err := validRegion(r); err == nil || !strings.Contains(err.Error(), "--region") {
			t.Errorf("validRegion(%q) = %v, want an error naming --region", r, err)
		}
	}
}

// TestListenPort: the API's port, which sandboxes reach on their gateway,
// is --listen's; none when the kernel picks it.
func TestListenPort(t *testing.T) {
	tests := []struct {
		listen   string
		host     string
		port     uint16
		wildcard bool
	}{
		{"127.0.0.1:8080", "127.0.0.1", 8080, false},
		{":9000", "", 9000, true},
		{"0.0.0.0:9000", "0.0.0.0", 9000, true},
		{"[::]:9000", "::", 9000, true},
		{"10.1.2.3:0", "10.1.2.3", 0, false},
		{"localhost:http", "localhost", 0, false},
		{"nonsense", "", 0, true},
	}
	for _, tt := range tests {
		host, port := listenPort(tt.listen)
		if host != tt.host || port != tt.port || isWildcard(host) != tt.wildcard {
			t.Errorf("listenPort(%q) = %q, %d (wildcard %v), want %q, %d (%v)", tt.listen, host, port, isWildcard(host), tt.host, tt.port, tt.wildcard)
		}
	}
}

// TestEventFlags: the event and webhook flags are checked before anything
// starts, each refusal naming its flag.
func TestEventFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		bad  string
	}{
		{nil, ""},
		{[]string{"--events-retention", "2h", "--webhook-retry-base", "200ms", "--webhook-allow", "127.0.0.1:9000"}, ""},
		{[]string{"--events-retention", "30m"}, "--events-retention"},
		{[]string{"--webhook-retry-base", "1ms"}, "--webhook-retry-base"},
		{[]string{"--webhook-retry-base", "2h"}, "--webhook-retry-base"},
		{[]string{"--webhook-allow", "user@host"}, "--webhook-allow"},
	} {
		var c serveConfig
		fs := serveFlags(&c)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		err := c.validate()
		if tc.bad == "" && err != nil || tc.bad != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.bad)) {
			t.Errorf("%v: %v, want an error naming %q", tc.args, err, tc.bad)
		}
	}
}

// TestServeTracingConfig: a tracing setting lizard cannot honour stops
// serve at start, naming it.
func TestServeTracingConfig(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "lizard.toml")
	if err := os.WriteFile(cfg, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		env, val, want string
		args           []string
	}{
		{env: "OTEL_EXPORTER_OTLP_PROTOCOL", val: "http/json", want: `OTEL_EXPORTER_OTLP_PROTOCOL="http/json": want grpc or http/protobuf`},
		{env: "OTEL_TRACES_SAMPLER", val: "sometimes", want: "OTEL_TRACES_SAMPLER"},
		{args: []string{"--otlp-endpoint", "collector:4318"}, want: "--otlp-endpoint"},
		{args: []string{"--otlp-endpoint", "http://127.0.0.1:4318", "--otlp-protocol", "thrift"}, want: "--otlp-protocol"},
	} {
		if tc.env != "" {
			t.Setenv(tc.env, tc.val)
		}
		err := serve(context.Background(), append([]string{"--config", cfg, "--data-dir", t.TempDir()}, tc.args...))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s=%s %v: serve: %v, want an error naming %s", tc.env, tc.val, tc.args, err, tc.want)
		}
		if tc.env != "" {
			os.Unsetenv(tc.env)
		}
	}
}
