package network

import (
	"errors"
	"net/netip"
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
			if got.Restricted != tt.want.Restricted || len(got.Allowed) != len(tt.want.Allowed) {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
			for i := range got.Allowed {
				if got.Allowed[i] != tt.want.Allowed[i] {
					t.Fatalf("got %+v, want %+v", got, tt.want)
				}
			}
		})
	}
}

func TestAllowsName(t *testing.T) {
	e := Egress{Restricted: true, Allowed: []string{"pypi.org", "*.github.com", "10.0.0.0/8"}}
	for name, want := range map[string]bool{
		"pypi.org": true, "PYPI.ORG.": true, "files.pypi.org": false,
		"api.github.com": true, "a.b.github.com": true, "github.com": false,
		"evil.com": false, "10.0.0.1": false,
	} {
		if got := e.allowsName(name); got != want {
			t.Errorf("allowsName(%q) = %v, want %v", name, got, want)
		}
	}
	if !(Egress{}).allowsName("anything.example") {
		t.Error("an open policy refused a name")
	}
	if ps := e.prefixes(); len(ps) != 1 || ps[0] != netip.MustParsePrefix("10.0.0.0/8") {
		t.Errorf("prefixes %v", ps)
	}
}

func TestRangeOf(t *testing.T) {
	for in, want := range map[string][2]string{
		"10.0.0.0/8":     {"10.0.0.0", "10.255.255.255"},
		"192.168.1.7/32": {"192.168.1.7", "192.168.1.7"},
		"172.16.5.0/20":  {"172.16.0.0", "172.16.15.255"},
	} {
		first, last := rangeOf(netip.MustParsePrefix(in))
		if first.String() != want[0] || last.String() != want[1] {
			t.Errorf("rangeOf(%s) = %s-%s, want %s-%s", in, first, last, want[0], want[1])
		}
	}
}
