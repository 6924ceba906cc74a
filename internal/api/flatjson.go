package api

import (
	"bytes"
	"unicode/utf8"
)

// flatStrings parses b when it is a JSON object whose values are all strings
// without escapes other than "\/" (what file writes look like: base64 or
// plain text content). It makes one pass and, for a large content string,
// is several times faster than encoding/json. ok is false for anything else,
// and the caller falls back to encoding/json, which handles every JSON
// document and names errors.
func flatStrings(b []byte) (m map[string][]byte, ok bool) {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return nil, false
	}
	m = make(map[string][]byte, 4)
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return m, skipSpace(b, i+1) == len(b)
	}
	for {
		key, next, ok := plainString(b, i)
		if !ok {
			return nil, false
		}
		i = skipSpace(b, next)
		if i >= len(b) || b[i] != ':' {
			return nil, false
		}
		val, next, ok := plainString(b, skipSpace(b, i+1))
		if !ok {
			return nil, false
		}
		m[string(key)] = val
		i = skipSpace(b, next)
		if i >= len(b) {
			return nil, false
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case '}':
			return m, skipSpace(b, i+1) == len(b)
		default:
			return nil, false
		}
	}
}

// plainString reads the JSON string at b[i:]. Only "\/" is accepted as an
// escape (JSON encoders may write it in base64); any other escape or a
// control character makes it give up.
func plainString(b []byte, i int) (s []byte, next int, ok bool) {
	if i >= len(b) || b[i] != '"' {
		return nil, 0, false
	}
	end := bytes.IndexByte(b[i+1:], '"')
	if end < 0 {
		return nil, 0, false
	}
	s = b[i+1 : i+1+end]
	if bytes.IndexByte(s, '\\') >= 0 {
		if !bytes.Contains(s, []byte(`\/`)) || bytes.Count(s, []byte(`\`)) != bytes.Count(s, []byte(`\/`)) {
			return nil, 0, false
		}
		// The closing quote found may have been escaped ("\/" never is).
		s = bytes.ReplaceAll(s, []byte(`\/`), []byte(`/`))
	}
	for _, c := range s {
		if c < 0x20 {
			return nil, 0, false
		}
	}
	// encoding/json would replace invalid UTF-8; let it.
	if !utf8.Valid(s) {
		return nil, 0, false
	}
	return s, i + 2 + end, true
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}
