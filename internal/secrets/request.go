package secrets

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"
)

// NewSecret is a create's body, checked: {name, value, metadata}, as E2B's
// API and the Lizard API's secrets route take it.
type NewSecret struct {
	Name     string // normalized (NormalizeName)
	Value    string
	Metadata map[string]string
}

// SecretUpdate is an update's body, checked: {value, metadata}; Metadata nil
// keeps the secret's (an empty object clears it).
type SecretUpdate struct {
	Value    string
	Metadata map[string]string
}

// body is what both bodies may hold; nil pointers were not sent.
type body struct {
	Name     *string            `json:"name"`
	Value    *string            `json:"value"`
	Metadata *map[string]string `json:"metadata"`
}

// ParseNew reads a create's JSON body. Every refusal is a 400 naming the
// field, and none repeats a byte of the body (it holds a secret value).
func ParseNew(b []byte) (NewSecret, error) {
	var req body
	if err := decode(b, &req); err != nil {
		return NewSecret{}, err
	}
	if req.Name == nil {
		return NewSecret{}, errInvalid("name", "required")
	}
	name, err := NormalizeName(*req.Name)
	if err != nil {
		return NewSecret{}, err
	}
	value, err := checkValue(req.Value)
	if err != nil {
		return NewSecret{}, err
	}
	var meta map[string]string
	if req.Metadata != nil {
		meta = *req.Metadata
	}
	if err := checkMetadata(meta); err != nil {
		return NewSecret{}, err
	}
	return NewSecret{Name: name, Value: value, Metadata: meta}, nil
}

// ParseUpdate reads an update's JSON body, as ParseNew does.
func ParseUpdate(b []byte) (SecretUpdate, error) {
	var req body
	if err := decode(b, &req); err != nil {
		return SecretUpdate{}, err
	}
	if req.Name != nil {
		return SecretUpdate{}, errInvalid("name", "a secret's name cannot change (create another, and delete this one)")
	}
	value, err := checkValue(req.Value)
	if err != nil {
		return SecretUpdate{}, err
	}
	var meta map[string]string
	if req.Metadata != nil {
		meta = *req.Metadata
		if meta == nil {
			meta = map[string]string{}
		}
	}
	if err := checkMetadata(meta); err != nil {
		return SecretUpdate{}, err
	}
	return SecretUpdate{Value: value, Metadata: meta}, nil
}

// decode unmarshals a body whose text must never reach an error: the
// decoder's own messages can quote the bytes around a syntax error.
func decode(b []byte, v *body) error {
	if len(bytes.TrimSpace(b)) == 0 {
		return errInvalid("body", "a JSON object is required")
	}
	err := json.Unmarshal(b, v)
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &te) && te.Field != "":
		return errInvalid(te.Field, "expected %s", te.Type)
	case errors.As(err, &te):
		return errInvalid("body", "a JSON object is required")
	case errors.As(err, &se):
		return errInvalid("body", "malformed JSON at byte %d", se.Offset)
	default:
		return errInvalid("body", "malformed JSON")
	}
}

// NormalizeName is the canonical spelling of a secret's name, as E2B has
// it: surrounding spaces trimmed, lower case, 1 to 128 of letters, digits,
// '_' and '-', not starting with sec_ (ids do). Anything else is a 400
// naming the field "name".
func NormalizeName(name string) (string, error) {
	n := strings.TrimSpace(name)
	if n == "" || len(n) > MaxNameBytes {
		return "", errInvalid("name", "must be 1 to %d characters", MaxNameBytes)
	}
	for _, c := range []byte(n) {
		if (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '_' && c != '-' {
			return "", errInvalid("name", "only letters, digits, '_' and '-' (the name goes into ${e2b.secrets.NAME} placeholders)")
		}
	}
	n = strings.ToLower(n)
	if strings.HasPrefix(n, IDPrefix) {
		return "", errInvalid("name", "must not start with %q (secret ids do)", IDPrefix)
	}
	return n, nil
}

// checkValue takes a value as a header may carry it; errors never show it.
func checkValue(v *string) (string, error) {
	switch {
	case v == nil:
		return "", errInvalid("value", "required")
	case *v == "":
		return "", errInvalid("value", "must not be empty")
	case len(*v) > MaxValueBytes:
		return "", errInvalid("value", "%d bytes, at most %d", len(*v), MaxValueBytes)
	case !utf8.ValidString(*v):
		return "", errInvalid("value", "must be UTF-8 text")
	}
	for _, c := range []byte(*v) {
		if (c < 0x20 && c != '\t') || c == 0x7f {
			return "", errInvalid("value", "must not hold control characters such as line breaks (it is sent as an HTTP header value)")
		}
	}
	return *v, nil
}

func checkMetadata(m map[string]string) error {
	if len(m) > MaxMetadata {
		return errInvalid("metadata", "%d entries, at most %d", len(m), MaxMetadata)
	}
	total := 0
	for k, v := range m {
		if k == "" || len(k) > MaxMetaKeyBytes {
			return errInvalid("metadata", "keys must be 1 to %d bytes", MaxMetaKeyBytes)
		}
		if len(v) > MaxMetaValueBytes {
			return errInvalid("metadata."+k, "%d bytes, at most %d", len(v), MaxMetaValueBytes)
		}
		total += len(k) + len(v)
	}
	if total > MaxMetadataBytes {
		return errInvalid("metadata", "%d bytes in all, at most %d", total, MaxMetadataBytes)
	}
	return nil
}

// Page is where a list starts and how long it is.
type Page struct {
	after string
	limit int
}

// ParsePage reads a list's query: limit (1 to 100, default 100) and
// nextToken (as the previous page's X-Next-Token gave it).
func ParsePage(q url.Values) (Page, error) {
	p := Page{limit: DefaultPageSize}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxPageSize {
			return Page{}, errInvalid("limit", "%q: want 1 to %d", v, MaxPageSize)
		}
		p.limit = n
	}
	if tok := q.Get("nextToken"); tok != "" {
		b, err := base64.RawURLEncoding.DecodeString(tok)
		if err == nil {
			p.after, err = NormalizeName(string(b))
		}
		if err != nil || p.after != string(b) {
			return Page{}, errInvalid("nextToken", "%q is not a token this server gave", tok)
		}
	}
	return p, nil
}
