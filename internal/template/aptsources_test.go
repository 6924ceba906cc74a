package template

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestParseOneLineSources(t *testing.T) {
	in := `# a comment
deb http://mirror.example/debian bookworm main contrib
deb-src http://mirror.example/debian bookworm main
deb [arch=amd64 signed-by=/usr/share/keyrings/x.gpg] https://mirror.example/debian-security bookworm-security main
deb [ arch=amd64 ] http://other.example/debian bookworm-updates main # trailing comment
deb cdrom:[Debian 12]/ bookworm main

deb http://mirror.example/broken
`
	got, err := parseOneLineSources(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []aptSource{
		{URI: "http://mirror.example/debian", Suites: []string{"bookworm"}},
		{URI: "https://mirror.example/debian-security", Suites: []string{"bookworm-security"}},
		{URI: "http://other.example/debian", Suites: []string{"bookworm-updates"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
}

func TestParseDeb822Sources(t *testing.T) {
	in := `Types: deb deb-src
# http://snapshot.example/archive/debian/20250520T000000Z
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://src.example/debian
Suites: bookworm

Types: deb
URIs: http://off.example/debian
Suites: bookworm
Enabled: no

types: deb
uris: http://a.example/debian
  http://b.example/debian/
suites: trixie
`
	got, err := parseDeb822Sources(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []aptSource{
		{URI: "http://mirror.example/debian", Suites: []string{"bookworm", "bookworm-updates"}},
		{URI: "http://a.example/debian", Suites: []string{"trixie"}},
		{URI: "http://b.example/debian/", Suites: []string{"trixie"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", got, want)
	}
}

func TestHostMirror(t *testing.T) {
	write := func(dir, name, content string) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name  string
		files map[string]string
		want  string // "" → an error
	}{
		{"deb822 with security and a third-party repo first", map[string]string{
			"sources.list.d/a-vendor.sources": "Types: deb\nURIs: https://vendor.example/apt\nSuites: nodistro\nComponents: main\n",
			"sources.list.d/debian.sources": "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n\n" +
				"Types: deb\nURIs: http://mirror.example/debian/\nSuites: bookworm bookworm-updates\n",
		}, "http://mirror.example/debian"},
		{"one-line sources.list", map[string]string{
			"sources.list": "deb http://mirror.example/debian bookworm main\n",
		}, "http://mirror.example/debian"},
		{"another release: the Debian archive", map[string]string{
			"sources.list": "deb http://vendor.example/apt stable main\ndeb http://mirror.example/debian trixie main\n",
		}, "http://mirror.example/debian"},
		{"disabled files are not sources", map[string]string{
			"sources.list.d/debian.sources.disabled": "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\n",
		}, ""},
		{"none", map[string]string{}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			for n, content := range c.files {
				write(dir, n, content)
			}
			got, err := hostMirror(dir)
			if c.want == "" {
				if err == nil {
					t.Fatalf("got %q, want an error", got)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("got %q, %v; want %q", got, err, c.want)
			}
		})
	}
}
