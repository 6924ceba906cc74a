package store

import (
	"errors"
	"strings"
	"testing"

	"github.com/lizard-build/lizard/internal/errdefs"
)

func TestNewID(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		id := NewID("", 20)
		if len(id) != 20 || id[0] < 'a' || id[0] > 'z' || seen[id] {
			t.Fatalf("bad or repeated id %q", id)
		}
		seen[id] = true
	}
}

func TestMakeKey(t *testing.T) {
	for _, tc := range []struct {
		secret, prefix string
		ok             bool
	}{
		{"0123456789abcdef", "01234", true},
		{"0123456789abcdefghijklmnopqrstuvwxyz", "0123456789", true},
		{"short", "", false},
	} {
		k, err := MakeKey(tc.secret)
		if (err == nil) != tc.ok || tc.ok && (k.Prefix != tc.prefix || k.Secret != tc.secret || k.Hash != HashKey(tc.secret)) {
			t.Errorf("MakeKey(%q) = %+v, %v", tc.secret, k, err)
		}
	}
	if k, err := MakeKey(""); err != nil || len(k.Secret) != len("lz_")+40 || k.ID == "" {
		t.Errorf("MakeKey of a new secret: %+v %v", k, err)
	}
}

func TestExceeded(t *testing.T) {
	err := LimitVCPUs.Exceeded(8, 8, 2)
	if !errors.Is(err, errdefs.ErrQuota) || errdefs.Code(err) != "quota_exceeded" || !strings.Contains(err.Error(), "project quota: vcpus 8 of 8 in use, this needs 2") {
		t.Fatalf("exceeded: %v", err)
	}
}
