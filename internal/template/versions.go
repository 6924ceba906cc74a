package template

import (
	"bufio"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// versionOf maps the Debian packages whose versions a template records to
// the names the versions are listed under.
var versionOf = map[string]string{
	"python3":            "python",
	"python3-pip":        "pip",
	"nodejs":             "node",
	"npm":                "npm",
	"python3-ipykernel":  "ipykernel",
	"python3-numpy":      "numpy",
	"python3-pandas":     "pandas",
	"python3-matplotlib": "matplotlib",
}

// readVersions reads, from the package database of rootfs, the upstream
// versions of the packages in versionOf that are installed, and the Debian
// release ("debian", from /etc/debian_version). Reading the database needs
// no program run in the rootfs.
func readVersions(rootfs string) (map[string]string, error) {
	f, err := os.Open(filepath.Join(rootfs, "var", "lib", "dpkg", "status"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	installed, err := parseDpkgStatus(f)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for pkg, key := range versionOf {
		if v, ok := installed[pkg]; ok {
			out[key] = upstreamVersion(v)
		}
	}
	if b, err := os.ReadFile(filepath.Join(rootfs, "etc", "debian_version")); err == nil {
		if v := strings.TrimSpace(string(b)); v != "" {
			out["debian"] = v
		}
	}
	return out, nil
}

// parseDpkgStatus returns package → version of the installed packages in a
// dpkg status file (stanzas of "Field: value" lines separated by blank
// lines; continuation lines start with a space).
func parseDpkgStatus(r io.Reader) (map[string]string, error) {
	out := map[string]string{}
	var pkg, version, status string
	flush := func() {
		if pkg != "" && version != "" && strings.HasSuffix(status, " installed") {
			out[pkg] = version
		}
		pkg, version, status = "", "", ""
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.TrimSpace(line) == "" {
			flush()
			continue
		}
		if line[0] == ' ' || line[0] == '\t' {
			continue
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		switch k {
		case "Package":
			pkg = v
		case "Version":
			version = v
		case "Status":
			status = v
		}
	}
	flush()
	return out, sc.Err()
}

// upstreamVersion turns a Debian version into the upstream one people know:
// "1:3.11.2-1+b1" → "3.11.2", "18.19.0+dfsg-6~deb12u2" → "18.19.0",
// "9.2.0~ds1-1" → "9.2.0". It drops the epoch, the Debian revision and a
// repack suffix (+dfsg, ~ds1).
func upstreamVersion(v string) string {
	if _, rest, ok := strings.Cut(v, ":"); ok {
		v = rest
	}
	if i := strings.LastIndexByte(v, '-'); i > 0 {
		v = v[:i]
	}
	if i := strings.IndexAny(v, "+~"); i > 0 {
		v = v[:i]
	}
	return v
}

// FormatVersions renders versions as "debian 12.12, node 18.19.0, ...",
// sorted by name; "" when there are none.
func FormatVersions(versions map[string]string) string {
	keys := make([]string, 0, len(versions))
	for k := range versions {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + " " + versions[k]
	}
	return strings.Join(parts, ", ")
}
