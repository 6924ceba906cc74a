package sandbox

import (
	"fmt"
	"net"
	"slices"
	"strconv"
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

// CheckMaskHost refuses an E2B maskRequestHost that is no Host header: it
// must be a host name or address, with an optional port, where "${PORT}"
// may stand for the port or part of a name (E2B's default is
// "${PORT}-<sandbox>.e2b.app"). "" is none.
func CheckMaskHost(field, mask string) error {
	if mask == "" {
		return nil
	}
	if len(mask) > 255 {
		return invalidf("%s: %d bytes, at most 255", field, len(mask))
	}
	host := strings.ReplaceAll(mask, "${PORT}", "1")
	if h, port, err := net.SplitHostPort(host); err == nil {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return invalidf("%s: %q: the port is not a number from 1 to 65535", field, shorten(mask))
		}
		host = h
	}
	if host == "" || strings.ContainsFunc(host, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' || r == ':' || r == '_')
	}) {
		return invalidf("%s: %q is not a host[:port] (letters, digits, '.', '-', and ${PORT})", field, shorten(mask))
	}
	return nil
}
