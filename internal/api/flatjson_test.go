package api

import (
	"encoding/json"
	"testing"
)

func TestFlatStrings(t *testing.T) {
	tests := []struct {
		in   string
		ok   bool
		want map[string]string
	}{
		{`{}`, true, map[string]string{}},
		{` {"path":"/a","content":"aGk="} `, true, map[string]string{"path": "/a", "content": "aGk="}},
		{`{"content":"a\/b+c="}`, true, map[string]string{"content": "a/b+c="}},
		{`{"content":"héllo"}`, true, map[string]string{"content": "héllo"}},
		{`{"content":"a\"b"}`, false, nil},
		{`{"content":"a\\/b"}`, false, nil},
		{`{"content":"line\n"}`, false, nil},
		{`{"content":5}`, false, nil},
		{`{"content":null}`, false, nil},
		{`{"content":"x"} trailing`, false, nil},
		{`{"content":"x",}`, false, nil},
		{`{"content" "x"}`, false, nil},
		{`["x"]`, false, nil},
		{`{"content":"x"`, false, nil},
		{"{\"content\":\"\x01\"}", false, nil},
		{"{\"content\":\"\xff\"}", false, nil},
	}
	for _, tt := range tests {
		m, ok := flatStrings([]byte(tt.in))
		if ok != tt.ok {
			t.Errorf("%q: ok = %v, want %v", tt.in, ok, tt.ok)
			continue
		}
		if !ok {
			continue
		}
		if len(m) != len(tt.want) {
			t.Errorf("%q: got %d keys, want %d", tt.in, len(m), len(tt.want))
		}
		for k, v := range tt.want {
			if string(m[k]) != v {
				t.Errorf("%q: %s = %q, want %q", tt.in, k, m[k], v)
			}
		}
		// Whatever the fast path accepts, encoding/json reads the same.
		var ref map[string]string
		if err := json.Unmarshal([]byte(tt.in), &ref); err != nil {
			t.Errorf("%q: fast path accepted what encoding/json refuses: %v", tt.in, err)
		}
		for k, v := range ref {
			if string(m[k]) != v {
				t.Errorf("%q: fast path %s = %q, encoding/json %q", tt.in, k, m[k], v)
			}
		}
	}
}

func FuzzFlatStrings(f *testing.F) {
	f.Add(`{"path":"/a","content":"aGk=","encoding":"base64"}`)
	f.Add(`{"content":"a\/b"}`)
	f.Fuzz(func(t *testing.T, in string) {
		m, ok := flatStrings([]byte(in))
		if !ok {
			return
		}
		var ref map[string]string
		if err := json.Unmarshal([]byte(in), &ref); err != nil {
			t.Fatalf("%q: fast path accepted what encoding/json refuses: %v", in, err)
		}
		if len(ref) != len(m) {
			t.Fatalf("%q: %d keys, encoding/json %d", in, len(m), len(ref))
		}
		for k, v := range ref {
			if string(m[k]) != v {
				t.Fatalf("%q: %s = %q, encoding/json %q", in, k, m[k], v)
			}
		}
	})
}
