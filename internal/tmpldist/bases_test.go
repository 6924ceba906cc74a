package tmpldist

import (
	"slices"
	"testing"
)

func TestFromTemplates(t *testing.T) {
	df := `# syntax=docker/dockerfile:1
ARG BASE=web
FROM base AS builder
RUN make
FROM --platform=linux/amd64 web AS app
FROM builder
FROM registry.example/lizard/img:1
FROM $BASE
from api
FROM web
COPY --from=builder /out /out
`
	if got := fromTemplates([]byte(df)); !slices.Equal(got, []string{"web", "api"}) {
		t.Fatalf("fromTemplates: %q, want web, api (not built-ins, stages, images or variables)", got)
	}
}
