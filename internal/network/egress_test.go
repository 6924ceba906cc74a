package network

import (
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/lizard-build/lizard/internal/errdefs"
)

func TestParseEgress(t *testing.T) {
	f := false
	tests := []struct {
		name     string
		internet *bool
		hosts    []string
		want     Egress
		wantErr  bool
	}{
		{"default is open", nil, nil, Egress{}, false},
		{"internet off", &f, nil, Egress{Restricted: true}, false},
		{"hosts imply restricted", nil, []string{"PyPI.org.", "*.GitHub.com", "10.1.2.3/8", "192.168.1.7"},
			Egress{Restricted: true, Allowed: []string{"pypi.org", "*.github.com", "10.0.0.0/8", "192.168.1.7"}}, false},
		{"not a name", nil, []string{"not a host"}, Egress{}, true},
		{"ipv6 refused", nil, []string{"::1"}, Egress{}, true},
		{"bare label", nil, []string{"intranet"}, Egress{}, true},
		{"bad label", nil, []string{"-bad.example.com"}, Egress{}, true},
		{"bare star", nil, []string{"*"}, Egress{}, true},
		{"bad address", nil, []string{"10.1.2.300"}, Egress{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseEgress(tt.internet, tt.hosts)
			if tt.wantErr {
				if !errors.Is(err, errdefs.ErrInvalid) {
					t.Fatalf("err %v, want ErrInvalid", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestParseSettings(t *testing.T) {
	f := false
	headers := func(h map[string]string) []Rule { return []Rule{{Transform: &Transform{Headers: h}}} }
	tests := []struct {
		name     string
		s        Settings
		internet *bool
		want     Egress
		err      string // a part of the error; "" for none
	}{
		{name: "empty is open", want: Egress{}},
		{name: "allow_internet_access false is denyOut everything", internet: &f,
			want: Egress{Restricted: true, Denied: []string{"0.0.0.0/0"}}},
		{name: "deny and allow", s: Settings{AllowOut: []string{"API.example.com", "*.example.org", "1.1.1.1"}, DenyOut: []string{"0.0.0.0/0", "10.1.2.3/16"}},
			want: Egress{Restricted: true, Allowed: []string{"api.example.com", "*.example.org", "1.1.1.1"}, Denied: []string{"0.0.0.0/0", "10.1.0.0/16"}}},
		{name: "internet false adds everything once", internet: &f, s: Settings{DenyOut: []string{"0.0.0.0/0"}},
			want: Egress{Restricted: true, Denied: []string{"0.0.0.0/0"}}},
		{name: "deny without everything", s: Settings{DenyOut: []string{"8.8.8.8"}}, want: Egress{Denied: []string{"8.8.8.8"}}},
		{name: "rules normalized", s: Settings{Rules: map[string][]Rule{"API.Example.com": headers(map[string]string{"Authorization": "Bearer ${e2b.secrets.tok}"})}},
			want: Egress{Rules: map[string][]Rule{"api.example.com": headers(map[string]string{"Authorization": "Bearer ${e2b.secrets.tok}"})}}},
		{name: "proxy", s: Settings{EgressProxy: &SOCKSProxy{Address: "Proxy.Example.com:1080", Username: "u", Password: "p"}, HTTPSPorts: []int{8443, 8443, 3000}},
			want: Egress{Proxy: &SOCKSProxy{Address: "proxy.example.com:1080", Username: "u", Password: "p"}, HTTPSPorts: []int{8443, 3000}}},

		{name: "bare star allowed", s: Settings{AllowOut: []string{"*"}}, err: "network.allowOut[0]"},
		{name: "domain denied", s: Settings{DenyOut: []string{"example.com"}}, err: "network.denyOut[0] \"example.com\""},
		{name: "wildcard denied", s: Settings{DenyOut: []string{"*.example.com"}}, err: "network.denyOut[0]"},
		{name: "too many allowed", s: Settings{AllowOut: strings.Split(strings.Repeat("a.example.com,", 65), ",")[:65]}, err: "at most 64"},
		{name: "header name not a token", s: Settings{Rules: map[string][]Rule{"a.example.com": headers(map[string]string{"Bad Header": "x"})}},
			err: `network.rules["a.example.com"][0].transform.headers: header name "Bad Header" is not an HTTP token`},
		{name: "header value with newline", s: Settings{Rules: map[string][]Rule{"a.example.com": headers(map[string]string{"X": "a\r\nEvil: 1"})}},
			err: "control character"},
		{name: "framing header", s: Settings{Rules: map[string][]Rule{"a.example.com": headers(map[string]string{"Host": "b.example.com"})}},
			err: "cannot be set by a transform"},
		{name: "unclosed placeholder", s: Settings{Rules: map[string][]Rule{"a.example.com": headers(map[string]string{"X": "${e2b.secrets.tok"})}},
			err: "not closed"},
		{name: "empty placeholder", s: Settings{Rules: map[string][]Rule{"a.example.com": headers(map[string]string{"X": "${e2b.secrets.}"})}},
			err: "must not be empty"},
		{name: "rule key bare star", s: Settings{Rules: map[string][]Rule{"*": headers(map[string]string{"X": "1"})}}, err: `network.rules["*"]: a bare *`},
		{name: "rule key address", s: Settings{Rules: map[string][]Rule{"10.0.0.1": headers(map[string]string{"X": "1"})}}, err: "not a domain name"},
		{name: "too many rule hosts", s: Settings{Rules: manyRules(65)}, err: "network.rules: 65 hosts, at most 64"},
		{name: "duplicate keys by case", s: Settings{Rules: map[string][]Rule{"a.example.com": nil, "A.example.com": nil}}, err: "same host"},
		{name: "proxy without port", s: Settings{EgressProxy: &SOCKSProxy{Address: "proxy.example.com"}}, err: "network.egressProxy.address"},
		{name: "proxy password alone", s: Settings{EgressProxy: &SOCKSProxy{Address: "1.2.3.4:1080", Password: "p"}}, err: "network.egressProxy.password"},
		{name: "envd port", s: Settings{HTTPSPorts: []int{49983}}, err: "network.httpsPorts[0]"},
		{name: "bad port", s: Settings{HTTPSPorts: []int{0}}, err: "network.httpsPorts[0]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseSettings("network", tt.s, tt.internet)
			if tt.err != "" {
				if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err %v, want ErrInvalid with %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func manyRules(n int) map[string][]Rule {
	out := map[string][]Rule{}
	for i := range n {
		out[string(rune('a'+i%26))+strings.Repeat("x", i/26)+".example.com"] = nil
	}
	return out
}

func TestSettingsHidePassword(t *testing.T) {
	e := Egress{Restricted: true, Proxy: &SOCKSProxy{Address: "p.example.com:1080", Username: "u", Password: "secret"}}
	s := e.Settings()
	if s.EgressProxy.Password != "" || s.EgressProxy.Username != "u" {
		t.Fatalf("settings show %+v", s.EgressProxy)
	}
	if !reflect.DeepEqual(s.DenyOut, []string{"0.0.0.0/0"}) {
		t.Fatalf("an older record's Restricted shows denyOut %v", s.DenyOut)
	}
	if e.Proxy.Password != "secret" {
		t.Fatal("Settings changed the record")
	}
}

// TestAllows is E2B's precedence: allowed entries (names, ranges) win over
// denied ranges; without allowOut everything not denied is allowed.
func TestAllows(t *testing.T) {
	a := netip.MustParseAddr
	tests := []struct {
		name  string
		e     Egress
		addr  string
		host  string
		allow bool
	}{
		{"open", Egress{}, "1.2.3.4", "", true},
		{"deny an address", Egress{Denied: []string{"8.8.8.8"}}, "8.8.8.8", "", false},
		{"deny another", Egress{Denied: []string{"8.8.8.8"}}, "8.8.4.4", "", true},
		{"restricted", Egress{Restricted: true}, "1.2.3.4", "", false},
		{"allowed range wins over everything denied", Egress{Restricted: true, Allowed: []string{"10.0.0.0/8"}}, "10.1.2.3", "", true},
		{"allowed address wins over a denied range", Egress{Denied: []string{"10.0.0.0/8"}, Allowed: []string{"10.1.2.3"}}, "10.1.2.3", "", true},
		{"its neighbour is denied", Egress{Denied: []string{"10.0.0.0/8"}, Allowed: []string{"10.1.2.3"}}, "10.1.2.4", "", false},
		{"allowed name on a denied address", Egress{Restricted: true, Allowed: []string{"api.example.com"}}, "1.2.3.4", "API.example.com.", true},
		{"another name on the same address", Egress{Restricted: true, Allowed: []string{"api.example.com"}}, "1.2.3.4", "evil.example.com", false},
		{"wildcard: subdomain at any depth", Egress{Restricted: true, Allowed: []string{"*.example.com"}}, "1.2.3.4", "a.b.example.com", true},
		{"wildcard: not the apex", Egress{Restricted: true, Allowed: []string{"*.example.com"}}, "1.2.3.4", "example.com", false},
		{"wildcard: not a suffix of a label", Egress{Restricted: true, Allowed: []string{"*.example.com"}}, "1.2.3.4", "badexample.com", false},
		{"no name: a name allow does not open the address", Egress{Restricted: true, Allowed: []string{"api.example.com"}}, "1.2.3.4", "", false},
	}
	for _, tt := range tests {
		if got := tt.e.Allows(a(tt.addr), tt.host); got != tt.allow {
			t.Errorf("%s: Allows(%s, %q) = %v, want %v", tt.name, tt.addr, tt.host, got, tt.allow)
		}
	}
	e := Egress{Restricted: true, Allowed: []string{"api.example.com"}}
	if !e.AllowsAddr(a("1.2.3.4"), []netip.Prefix{netip.MustParsePrefix("1.2.3.4/32")}) {
		t.Error("an address the resolver answered for an allowed name is not allowed on the address path")
	}
}

func TestIntercepts(t *testing.T) {
	for _, tt := range []struct {
		e          Egress
		intercepts bool
	}{
		{Egress{}, false},
		{Egress{Restricted: true}, false},
		{Egress{Restricted: true, Allowed: []string{"10.0.0.0/8"}}, false},
		{Egress{Allowed: []string{"api.example.com"}}, false}, // nothing denied: names decide nothing
		{Egress{Restricted: true, Allowed: []string{"api.example.com"}}, true},
		{Egress{Denied: []string{"1.2.3.4"}, Allowed: []string{"api.example.com"}}, true},
		{Egress{Rules: map[string][]Rule{"api.example.com": nil}}, true},
		{Egress{Proxy: &SOCKSProxy{Address: "1.2.3.4:1080"}}, true},
	} {
		if got := tt.e.Intercepts(); got != tt.intercepts {
			t.Errorf("%+v: Intercepts = %v", tt.e, got)
		}
	}
}

func TestAllowsName(t *testing.T) {
	e := Egress{Restricted: true, Allowed: []string{"pypi.org", "*.github.com", "10.0.0.0/8"}}
	for name, want := range map[string]bool{
		"pypi.org": true, "PYPI.ORG.": true, "files.pypi.org": false,
		"api.github.com": true, "a.b.github.com": true, "github.com": false,
		"evil.com": false, "10.0.0.1": false,
	} {
		if got := e.resolves(name); got != want {
			t.Errorf("resolves(%q) = %v, want %v", name, got, want)
		}
	}
	if !(Egress{}).resolves("anything.example") {
		t.Error("an open policy refused a name")
	}
	if !(Egress{Denied: []string{"1.2.3.4"}}).resolves("anything.example") {
		t.Error("a policy denying one address refused a name")
	}
	if ps := e.prefixes(); len(ps) != 1 || ps[0] != netip.MustParsePrefix("10.0.0.0/8") {
		t.Errorf("prefixes %v", ps)
	}
}

// TestRulesFor: exact names first, then the longest wildcard suffix; rule
// sets are not merged.
func TestRulesFor(t *testing.T) {
	set := func(v string) []Rule { return []Rule{{Transform: &Transform{Headers: map[string]string{"X": v}}}} }
	e := Egress{Rules: map[string][]Rule{
		"api.example.com":    set("exact"),
		"*.example.com":      set("wild"),
		"*.eu.example.com":   set("longer wild"),
		"*.x.eu.example.com": set("longest wild"),
	}}
	for name, want := range map[string]string{
		"api.example.com":    "api.example.com",
		"API.EXAMPLE.COM.":   "api.example.com",
		"web.example.com":    "*.example.com",
		"a.eu.example.com":   "*.eu.example.com",
		"api.eu.example.com": "*.eu.example.com",
		"b.x.eu.example.com": "*.x.eu.example.com",
		"eu.example.com":     "*.example.com",
		"example.com":        "",
		"other.com":          "",
		"":                   "",
	} {
		key, rules, ok := e.RulesFor(name)
		if key != want || ok != (want != "") {
			t.Errorf("RulesFor(%q) = %q %v, want %q", name, key, ok, want)
		}
		if ok && len(rules) != 1 {
			t.Errorf("RulesFor(%q): rule sets merged: %v", name, rules)
		}
	}
}

func TestPlaceholders(t *testing.T) {
	e := Egress{Rules: map[string][]Rule{
		"a.example.com": {{Transform: &Transform{Headers: map[string]string{
			"Authorization": "Bearer ${e2b.secrets.tok}",
			"X-Both":        "${e2b.secrets.tok}:${e2b.identity.tokens.aws}",
			"X-Literal":     "${HOME} and ${e2b.other} stay",
		}}}},
	}}
	got := e.Placeholders()
	want := []Placeholder{{SecretPlaceholder, "tok"}, {TokenPlaceholder, "aws"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Placeholders = %v, want %v", got, want)
	}
	values := map[Placeholder]string{{SecretPlaceholder, "tok"}: "s3cr3t", {TokenPlaceholder, "aws"}: "jwt"}
	resolve := func(p Placeholder) (string, error) {
		if v, ok := values[p]; ok {
			return v, nil
		}
		return "", errdefs.ErrNotFound
	}
	for in, want := range map[string]string{
		"Bearer ${e2b.secrets.tok}":                     "Bearer s3cr3t",
		"${e2b.secrets.tok}:${e2b.identity.tokens.aws}": "s3cr3t:jwt",
		"${HOME} and ${e2b.other} stay":                 "${HOME} and ${e2b.other} stay",
		"plain":                                         "plain",
	} {
		got, err := Expand(in, resolve)
		if err != nil || got != want {
			t.Errorf("Expand(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	got2, err := Expand("Bearer ${e2b.secrets.gone}", resolve)
	if !errors.Is(err, errdefs.ErrNotFound) || got2 != "" || !strings.Contains(err.Error(), "${e2b.secrets.gone}") {
		t.Fatalf("unresolvable: %q, %v", got2, err)
	}
	values[Placeholder{SecretPlaceholder, "tok"}] = "a\nb"
	if _, err := Expand("${e2b.secrets.tok}", resolve); err == nil {
		t.Fatal("a value with a newline went into a header")
	}
}

func TestRangeOf(t *testing.T) {
	for in, want := range map[string][2]string{
		"10.0.0.0/8":     {"10.0.0.0", "10.255.255.255"},
		"192.168.1.7/32": {"192.168.1.7", "192.168.1.7"},
		"172.16.5.0/20":  {"172.16.0.0", "172.16.15.255"},
		"0.0.0.0/0":      {"0.0.0.0", "255.255.255.255"},
	} {
		first, last := rangeOf(netip.MustParsePrefix(in))
		if first.String() != want[0] || last.String() != want[1] {
			t.Errorf("rangeOf(%s) = %s-%s, want %s-%s", in, first, last, want[0], want[1])
		}
	}
}
