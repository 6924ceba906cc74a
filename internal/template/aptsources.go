package template

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/lizard-build/lizard/internal/errdefs"
)

// Built-in templates are bootstrapped from the Debian mirror the host
// itself uses (its apt sources), so that lizard works wherever the host's
// apt does: behind a proxy, on an internal mirror, offline with a local one.
// The operator may name another (--debian-mirror). No mirror host is
// written into lizard.

// aptSource is one "deb" entry of the host's apt sources.
type aptSource struct {
	URI    string
	Suites []string
}

// HostMirror returns the Debian mirror of the host's apt sources
// (/etc/apt/sources.list, /etc/apt/sources.list.d/*.list and *.sources).
func HostMirror() (string, error) {
	return hostMirror("/etc/apt")
}

func hostMirror(aptDir string) (string, error) {
	var all []aptSource
	files := []string{filepath.Join(aptDir, "sources.list")}
	for _, pat := range []string{"*.list", "*.sources"} {
		m, _ := filepath.Glob(filepath.Join(aptDir, "sources.list.d", pat))
		sort.Strings(m)
		files = append(files, m...)
	}
	for _, f := range files {
		b, err := os.Open(f)
		if err != nil {
			continue // a missing sources.list is common with deb822 sources
		}
		var srcs []aptSource
		if strings.HasSuffix(f, ".sources") {
			srcs, err = parseDeb822Sources(b)
		} else {
			srcs, err = parseOneLineSources(b)
		}
		b.Close()
		if err != nil {
			return "", fmt.Errorf("read %s: %w", f, err)
		}
		all = append(all, srcs...)
	}
	if m := debianMirror(all, recipeSuite); m != "" {
		return m, nil
	}
	return "", fmt.Errorf("no Debian mirror in the host's apt sources (%s): pass --debian-mirror URL: %w", aptDir, errdefs.ErrUnavailable)
}

// debianMirror picks the mirror among the host's sources: the first whose
// suites include suite (the templates' Debian release), else the first
// Debian archive (a URI ending in /debian) with a release suite (not
// "-security", "-updates" or "-backports").
func debianMirror(srcs []aptSource, suite string) string {
	for _, s := range srcs {
		for _, su := range s.Suites {
			if su == suite {
				return strings.TrimSuffix(s.URI, "/")
			}
		}
	}
	for _, s := range srcs {
		if !strings.HasSuffix(strings.TrimSuffix(s.URI, "/"), "/debian") {
			continue
		}
		for _, su := range s.Suites {
			if !strings.Contains(su, "-") {
				return strings.TrimSuffix(s.URI, "/")
			}
		}
	}
	return ""
}

// parseOneLineSources reads sources.list lines: "deb [options] URI suite
// [component...]"; comments, deb-src and other types are skipped.
func parseOneLineSources(r io.Reader) ([]aptSource, error) {
	var out []aptSource
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "deb" {
			continue
		}
		f = f[1:]
		if len(f) > 0 && strings.HasPrefix(f[0], "[") {
			// Options: "[arch=amd64 signed-by=...]", possibly spread over
			// several fields.
			for len(f) > 0 {
				end := strings.HasSuffix(f[0], "]")
				f = f[1:]
				if end {
					break
				}
			}
		}
		if len(f) < 2 || !isMirrorURI(f[0]) {
			continue
		}
		out = append(out, aptSource{URI: f[0], Suites: []string{f[1]}})
	}
	return out, sc.Err()
}

// parseDeb822Sources reads a deb822 .sources file: stanzas of "Field:
// value" lines (Types, URIs, Suites, Enabled, ...) separated by blank
// lines; continuation lines start with white space.
func parseDeb822Sources(r io.Reader) ([]aptSource, error) {
	var out []aptSource
	fields := map[string]string{}
	last := ""
	flush := func() {
		defer func() { fields, last = map[string]string{}, "" }()
		if e := strings.ToLower(strings.TrimSpace(fields["enabled"])); e != "" && e != "yes" {
			return
		}
		isDeb := false
		for _, t := range strings.Fields(fields["types"]) {
			isDeb = isDeb || t == "deb"
		}
		suites := strings.Fields(fields["suites"])
		if !isDeb || len(suites) == 0 {
			return
		}
		for _, u := range strings.Fields(fields["uris"]) {
			if isMirrorURI(u) {
				out = append(out, aptSource{URI: u, Suites: suites})
			}
		}
	}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		if strings.TrimSpace(line) == "" {
			flush()
			continue
		}
		if line[0] == ' ' || line[0] == '\t' {
			if last != "" {
				fields[last] += " " + strings.TrimSpace(line)
			}
			continue
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		last = strings.ToLower(strings.TrimSpace(k))
		fields[last] = strings.TrimSpace(v)
	}
	flush()
	return out, sc.Err()
}

// isMirrorURI reports whether u is a mirror debootstrap can fetch from.
func isMirrorURI(u string) bool {
	return strings.HasPrefix(u, "http://") || strings.HasPrefix(u, "https://") || strings.HasPrefix(u, "file:/")
}
