package sandbox

import (
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// Caps on what a create keeps with a sandbox. Metadata is stored in the
// sandbox's record, answered in every listing and filtered on; envs go to
// every command the sandbox runs, where each NAME=value must fit one
// execve string (128 KiB on Linux) and all of them the argument space
// beside a command's own arguments.
const (
	MaxMetadataKeys       = 64
	MaxMetadataKeyBytes   = 256
	MaxMetadataValueBytes = 2048

	MaxEnvs          = 512
	MaxEnvNameBytes  = 256
	MaxEnvValueBytes = 64 << 10
	MaxEnvsBytes     = 512 << 10
)

// CheckMetadata refuses metadata over the caps, as ErrInvalid naming
// field (the API's name for it: metadata).
func CheckMetadata(field string, md map[string]string) error {
	if len(md) > MaxMetadataKeys {
		return invalidf("%s: %d keys, at most %d", field, len(md), MaxMetadataKeys)
	}
	for _, k := range sortedKeys(md) {
		if k == "" {
			return invalidf("%s: a key is empty", field)
		}
		if len(k) > MaxMetadataKeyBytes {
			return invalidf("%s: key %s is %d bytes, at most %d", field, shorten(k), len(k), MaxMetadataKeyBytes)
		}
		if v := md[k]; len(v) > MaxMetadataValueBytes {
			return invalidf("%s[%s]: the value is %d bytes, at most %d", field, shorten(k), len(v), MaxMetadataValueBytes)
		}
	}
	return nil
}

// CheckEnvs refuses environment variables that no command could be given
// (a name with '=' or NUL, a value with NUL) or over the caps, as
// ErrInvalid naming field (envs, or E2B's envVars).
func CheckEnvs(field string, envs map[string]string) error {
	if len(envs) > MaxEnvs {
		return invalidf("%s: %d variables, at most %d", field, len(envs), MaxEnvs)
	}
	total := 0
	for _, k := range sortedKeys(envs) {
		v := envs[k]
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return invalidf("%s: %s is not a valid variable name (no '=', no NUL, not empty)", field, shorten(k))
		}
		if len(k) > MaxEnvNameBytes {
			return invalidf("%s: variable name %s is %d bytes, at most %d", field, shorten(k), len(k), MaxEnvNameBytes)
		}
		if strings.ContainsRune(v, 0) {
			return invalidf("%s[%s]: the value holds a NUL byte", field, shorten(k))
		}
		if len(v) > MaxEnvValueBytes {
			return invalidf("%s[%s]: the value is %d bytes, at most %d", field, shorten(k), len(v), MaxEnvValueBytes)
		}
		total += len(k) + len(v)
	}
	if total > MaxEnvsBytes {
		return invalidf("%s: %d bytes of names and values, at most %d", field, total, MaxEnvsBytes)
	}
	return nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// shorten quotes s for an error message, cut to its first 40 bytes (on a
// rune boundary) when longer.
func shorten(s string) string {
	if len(s) <= 40 {
		return fmt.Sprintf("%q", s)
	}
	cut := 40
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%q…", s[:cut])
}

func invalidf(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, errdefs.ErrInvalid)...)
}
