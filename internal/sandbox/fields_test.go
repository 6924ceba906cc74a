package sandbox

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/lizard-build/lizard/internal/errdefs"
)

func keys(n int) map[string]string {
	m := map[string]string{}
	for i := range n {
		m[fmt.Sprintf("k%05d", i)] = "v"
	}
	return m
}

// TestCheckMetadata: metadata within the caps passes; over them it is
// ErrInvalid naming the field, the key and the cap.
func TestCheckMetadata(t *testing.T) {
	tests := []struct {
		md   map[string]string
		want string // "" passes
	}{
		{nil, ""},
		{map[string]string{"run": "x", "": "y"}, "metadata: a key is empty"},
		{keys(MaxMetadataKeys), ""},
		{keys(10000), "metadata: 10000 keys, at most 64"},
		{map[string]string{strings.Repeat("k", 256): strings.Repeat("v", 2048)}, ""},
		{map[string]string{strings.Repeat("k", 257): "v"}, "is 257 bytes, at most 256"},
		{map[string]string{"big": strings.Repeat("v", 2049)}, `metadata["big"]: the value is 2049 bytes, at most 2048`},
	}
	for _, tt := range tests {
		err := CheckMetadata("metadata", tt.md)
		if tt.want == "" {
			if err != nil {
				t.Errorf("%d keys: %v", len(tt.md), err)
			}
			continue
		}
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%d keys: %v, want ErrInvalid with %q", len(tt.md), err, tt.want)
		}
	}
}

// TestCheckEnvs: names and values a command can take, within the caps;
// the error names the field it was given (envs, E2B's envVars).
func TestCheckEnvs(t *testing.T) {
	tests := []struct {
		field string
		envs  map[string]string
		want  string
	}{
		{"envs", map[string]string{"A": "1", "PATH": "/bin"}, ""},
		{"envs", map[string]string{"A=B": "x"}, `envs: "A=B" is not a valid variable name`},
		{"envVars", map[string]string{"": "x"}, `envVars: "" is not a valid variable name`},
		{"envs", map[string]string{"A": "x\x00y"}, `envs["A"]: the value holds a NUL byte`},
		{"envs", keys(MaxEnvs + 1), "envs: 513 variables, at most 512"},
		{"envs", map[string]string{strings.Repeat("N", 257): "x"}, "is 257 bytes, at most 256"},
		{"envVars", map[string]string{"CERT": strings.Repeat("x", 64<<10+1)}, `envVars["CERT"]: the value is 65537 bytes, at most 65536`},
		{"envs", map[string]string{"A": strings.Repeat("x", 64<<10), "B": strings.Repeat("x", 64<<10)}, ""},
	}
	big := map[string]string{}
	for i := range 9 {
		big[fmt.Sprintf("V%d", i)] = strings.Repeat("x", 64<<10)
	}
	tests = append(tests, struct {
		field string
		envs  map[string]string
		want  string
	}{"envs", big, "bytes of names and values, at most 524288"})
	for _, tt := range tests {
		err := CheckEnvs(tt.field, tt.envs)
		if tt.want == "" {
			if err != nil {
				t.Errorf("%d envs: %v", len(tt.envs), err)
			}
			continue
		}
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%d envs: %v, want ErrInvalid with %q", len(tt.envs), err, tt.want)
		}
	}
}

// TestShorten: long keys are cut in error messages, on a rune boundary.
func TestShorten(t *testing.T) {
	if got := shorten(strings.Repeat("é", 30)); !strings.HasSuffix(got, "…") || !strings.HasPrefix(got, `"é`) || len(got) > 48 {
		t.Errorf("shorten: %q", got)
	}
	if got := shorten("short"); got != `"short"` {
		t.Errorf("shorten: %q", got)
	}
}

func TestCheckMaskHost(t *testing.T) {
	for _, ok := range []string{"", "localhost", "localhost:${PORT}", "${PORT}-sbx.e2b.app", "example.com:8080", "10.0.0.1", "[::1]:80"} {
		if err := CheckMaskHost("network.maskRequestHost", ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"a b", "host/path", "host:0", "host:x", ":80", "http://x", strings.Repeat("a", 256)} {
		err := CheckMaskHost("network.maskRequestHost", bad)
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "network.maskRequestHost") {
			t.Errorf("%q: %v, want ErrInvalid naming the field", bad, err)
		}
	}
}
