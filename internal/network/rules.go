package network

import (
	"fmt"

	"github.com/lizard-build/lizard/internal/errdefs"
	"maps"
	"slices"
	"strings"
)

// Rule is one of E2B's network rules: a transform of the outbound HTTP and
// HTTPS requests to the hosts its key matches. A rule grants no access: the
// host must be allowed as well.
type Rule struct {
	Transform *Transform `json:"transform,omitempty"`
}

// Transform sets request headers: each replaces a header of the same name
// (any case). A value may hold placeholders (Placeholder), resolved by the
// egress proxy for each request.
type Transform struct {
	Headers map[string]string `json:"headers,omitempty"`
}

// Caps of a configuration's rules.
const (
	// MaxRuleHosts caps the hosts (keys) of rules.
	MaxRuleHosts = 64
	// MaxRulesPerHost caps the rules of one host.
	MaxRulesPerHost = 8
	// MaxRuleHeaders caps the headers of one transform.
	MaxRuleHeaders = 32
	// MaxRuleHeaderBytes caps the names and values of all headers of all
	// rules together.
	MaxRuleHeaderBytes = 64 << 10
)

// Headers a transform may not set: they frame the request or choose where
// it goes, which the egress proxy decides.
var framingHeaders = []string{"host", "content-length", "transfer-encoding", "connection", "upgrade", "te", "trailer", "keep-alive",
	"proxy-connection", "http2-settings"}

func parseRules(field string, rules map[string][]Rule) (map[string][]Rule, error) {
	if len(rules) == 0 {
		return nil, nil
	}
	if len(rules) > MaxRuleHosts {
		return nil, invalidf("%s: %d hosts, at most %d", field, len(rules), MaxRuleHosts)
	}
	out := make(map[string][]Rule, len(rules))
	total := 0
	// Sorted, so that the first error named is the same every time.
	for _, host := range slices.Sorted(maps.Keys(rules)) {
		hf := fmt.Sprintf("%s[%q]", field, host)
		key, err := ruleKey(host)
		if err != nil {
			return nil, invalidf("%s: %s (keys are DNS names like api.example.com or wildcards like *.example.com)", hf, err)
		}
		if _, dup := out[key]; dup {
			return nil, invalidf("%s: the same host as another key once lower-cased", hf)
		}
		list := rules[host]
		if len(list) > MaxRulesPerHost {
			return nil, invalidf("%s: %d rules, at most %d", hf, len(list), MaxRulesPerHost)
		}
		var parsed []Rule
		for i, r := range list {
			rf := fmt.Sprintf("%s[%d].transform.headers", hf, i)
			if r.Transform == nil || len(r.Transform.Headers) == 0 {
				parsed = append(parsed, Rule{})
				continue
			}
			if len(r.Transform.Headers) > MaxRuleHeaders {
				return nil, invalidf("%s: %d headers, at most %d", rf, len(r.Transform.Headers), MaxRuleHeaders)
			}
			headers := make(map[string]string, len(r.Transform.Headers))
			for _, name := range slices.Sorted(maps.Keys(r.Transform.Headers)) {
				value := r.Transform.Headers[name]
				if !isToken(name) {
					return nil, invalidf("%s: header name %q is not an HTTP token (letters, digits and !#$%%&'*+-.^_`|~)", rf, name)
				}
				if slices.Contains(framingHeaders, strings.ToLower(name)) {
					return nil, invalidf("%s: header %q cannot be set by a transform (it frames the request or picks where it goes)", rf, name)
				}
				if err := checkHeaderValue(value); err != nil {
					return nil, invalidf("%s[%q]: %s", rf, name, err)
				}
				total += len(name) + len(value)
				headers[name] = value
			}
			parsed = append(parsed, Rule{Transform: &Transform{Headers: headers}})
		}
		out[key] = parsed
	}
	if total > MaxRuleHeaderBytes {
		return nil, invalidf("%s: %d bytes of header names and values, at most %d", field, total, MaxRuleHeaderBytes)
	}
	return out, nil
}

// ruleKey normalizes a rules key: a domain name or "*." and one.
func ruleKey(host string) (string, error) {
	h := strings.TrimSpace(strings.ToLower(host))
	if h == "*" {
		return "", fmt.Errorf("a bare * is not allowed")
	}
	if strings.ContainsAny(h, ":/") || isAddrLike(h) {
		return "", fmt.Errorf("not a domain name")
	}
	name, wild := strings.CutPrefix(h, "*.")
	if err := checkDomain(name, wild); err != nil {
		return "", err
	}
	if wild {
		return "*." + strings.TrimSuffix(name, "."), nil
	}
	return strings.TrimSuffix(name, "."), nil
}

// RulesFor returns the rule set for a host name and its key: the key equal
// to the name if there is one, else the longest wildcard whose domain the
// name is under. Rule sets are not merged.
func (e Egress) RulesFor(name string) (key string, rules []Rule, ok bool) {
	name = canonicalName(name)
	if name == "" {
		return "", nil, false
	}
	if r, ok := e.Rules[name]; ok {
		return name, r, true
	}
	for k, r := range e.Rules {
		if strings.HasPrefix(k, "*.") && matchDomain(k, name) && len(k) > len(key) {
			key, rules, ok = k, r, true
		}
	}
	return key, rules, ok
}

// isToken reports whether s is an HTTP token (RFC 9110 tchar).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// checkHeaderValue refuses control characters (a header value cannot
// carry them; CR and LF would end the header) and malformed placeholders.
func checkHeaderValue(v string) error {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 && c != '\t' || c == 0x7f {
			return fmt.Errorf("the value holds a control character (byte %d)", i)
		}
	}
	_, err := parseTemplate(v)
	return err
}

// Placeholder kinds: ${e2b.secrets.NAME} is a secret's current value,
// ${e2b.identity.tokens.NAME} a workload token minted for the request.
const (
	SecretPlaceholder = "e2b.secrets."
	TokenPlaceholder  = "e2b.identity.tokens."
)

// Placeholder is one ${…} of a header value the egress proxy resolves.
type Placeholder struct {
	Kind string // SecretPlaceholder or TokenPlaceholder
	Name string // as written
}

func (p Placeholder) String() string { return "${" + p.Kind + p.Name + "}" }

// segment is a literal (Kind "") or a placeholder of a header value.
type segment struct {
	Placeholder
	literal string
}

// parseTemplate splits a header value into literals and placeholders. A
// placeholder's name is everything up to the next "}" (as E2B's proxy reads
// it); it may not be empty or hold "{". "${" not followed by a kind is
// literal text.
func parseTemplate(v string) ([]segment, error) {
	var out []segment
	rest := v
	for {
		i := strings.Index(rest, "${")
		if i < 0 {
			break
		}
		var kind string
		for _, k := range []string{SecretPlaceholder, TokenPlaceholder} {
			if strings.HasPrefix(rest[i+2:], k) {
				kind = k
			}
		}
		if kind == "" {
			out = append(out, segment{literal: rest[:i+2]})
			rest = rest[i+2:]
			continue
		}
		after := rest[i+2+len(kind):]
		end := strings.IndexByte(after, '}')
		if end < 0 {
			return nil, fmt.Errorf("placeholder ${%s… is not closed with }", kind)
		}
		name := after[:end]
		if name == "" || strings.Contains(name, "{") {
			return nil, fmt.Errorf("placeholder ${%s%s}: the name must not be empty or hold {", kind, name)
		}
		if rest[:i] != "" {
			out = append(out, segment{literal: rest[:i]})
		}
		out = append(out, segment{Placeholder: Placeholder{Kind: kind, Name: name}})
		rest = after[end+1:]
	}
	if rest != "" {
		out = append(out, segment{literal: rest})
	}
	return out, nil
}

// Placeholders are the placeholders of e's rules, each once, in a stable
// order.
func (e Egress) Placeholders() []Placeholder {
	seen := map[Placeholder]bool{}
	var out []Placeholder
	for _, key := range slices.Sorted(maps.Keys(e.Rules)) {
		for _, r := range e.Rules[key] {
			if r.Transform == nil {
				continue
			}
			for _, name := range slices.Sorted(maps.Keys(r.Transform.Headers)) {
				segs, _ := parseTemplate(r.Transform.Headers[name])
				for _, s := range segs {
					if s.Kind != "" && !seen[s.Placeholder] {
						seen[s.Placeholder] = true
						out = append(out, s.Placeholder)
					}
				}
			}
		}
	}
	return out
}

// Expand resolves the placeholders of a header value with resolve. The
// first failure is an *UnresolvedError naming the placeholder, and nothing
// of the value is returned: a request must never leave with a placeholder
// unresolved.
func Expand(value string, resolve func(Placeholder) (string, error)) (string, error) {
	segs, err := parseTemplate(value)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, s := range segs {
		if s.Kind == "" {
			b.WriteString(s.literal)
			continue
		}
		v, err := resolve(s.Placeholder)
		if err == nil {
			err = checkResolved(v)
		}
		if err != nil {
			return "", &UnresolvedError{Placeholder: s.Placeholder, Err: err}
		}
		b.WriteString(v)
	}
	return b.String(), nil
}

// UnresolvedError is a placeholder Expand could not resolve.
type UnresolvedError struct {
	Placeholder
	Err error
}

func (e *UnresolvedError) Error() string { return e.Placeholder.String() + ": " + e.Err.Error() }
func (e *UnresolvedError) Unwrap() error { return e.Err }

// checkResolved refuses a resolved value that cannot go in a header.
func checkResolved(v string) error {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 && c != '\t' || c == 0x7f {
			return fmt.Errorf("its value holds a control character, which a header cannot carry: %w", errdefs.ErrInvalid)
		}
	}
	return nil
}
