package gvisor

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/lizard-build/lizard/internal/errdefs"
)

func TestCompatible(t *testing.T) {
	r := &Runtime{}
	cur := Manifest{RunscVersion: "runsc version release-20250101.0", RunscDigest: "sha256:aa", CPUFeatures: []string{"avx", "avx2", "sse4_2"}}
	r.build.once.Do(func() { r.build.m = cur })
	ctx := context.Background()
	tests := []struct {
		name string
		img  *Manifest // nil: no manifest (an older server's image)
		want string    // "" compatible, else a word the refusal names
	}{
		{"no manifest", nil, ""},
		{"same build", &cur, ""},
		{"subset of the CPU", &Manifest{RunscVersion: cur.RunscVersion, RunscDigest: cur.RunscDigest, CPUFeatures: []string{"sse4_2"}}, ""},
		{"other version", &Manifest{RunscVersion: "runsc version release-20240101.0", RunscDigest: "sha256:bb"}, "release-20240101.0"},
		{"same version, other build", &Manifest{RunscVersion: cur.RunscVersion, RunscDigest: "sha256:bb"}, "sha256:bb"},
		{"CPU feature missing", &Manifest{RunscVersion: cur.RunscVersion, RunscDigest: cur.RunscDigest, CPUFeatures: []string{"avx", "avx512f"}}, "avx512f"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if tt.img != nil {
				if err := writeJSON(dir+"/"+manifestFile, tt.img); err != nil {
					t.Fatal(err)
				}
			}
			err := r.compatible(ctx, dir)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if !errors.Is(err, errdefs.ErrConflict) || errdefs.Code(err) != "incompatible_checkpoint" || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want a 409 incompatible_checkpoint naming %q", err, tt.want)
			}
		})
	}
}

func TestCurrentManifestCPU(t *testing.T) {
	flags, err := cpuFeatures()
	if err != nil || len(flags) == 0 {
		t.Fatalf("cpu features: %v, %v", flags, err)
	}
}
