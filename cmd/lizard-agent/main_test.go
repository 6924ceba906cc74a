package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestLean: the agent is PID 1 of every sandbox, so what it links is
// started (package inits, pages touched) before a create answers and is
// resident in every sandbox. The server's tracing exporters, the OTel SDK
// and gRPC (package tracing/otlp) must stay out of it: linked through
// package tracing, they made the binary half again as large (21 MiB
// against 14) and its inits twice as long.
func TestLean(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 50 {
		t.Fatalf("go list -deps listed %d packages: %q", len(deps), deps)
	}
	for _, d := range deps {
		for _, banned := range []string{
			"google.golang.org/grpc",
			"go.opentelemetry.io/otel/sdk",
			"go.opentelemetry.io/otel/exporters/",
			"github.com/lizard-build/lizard/internal/tracing/otlp",
		} {
			if d == banned || strings.HasPrefix(d, strings.TrimSuffix(banned, "/")+"/") {
				t.Errorf("the agent links %s", d)
			}
		}
	}
}
