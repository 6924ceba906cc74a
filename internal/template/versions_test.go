package template

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

const dpkgStatus = `Package: python3
Status: install ok installed
Priority: optional
Version: 3.11.2-1+b1
Depends: python3.11 (>= 3.11.2-1~)
Description: interactive high-level object-oriented language (default version)
 Python, the high-level, interactive object oriented language,
 Version: 9.9.9 in a description is not a field

Package: nodejs
Status: install ok installed
Version: 18.19.0+dfsg-6~deb12u2

Package: npm
Status: deinstall ok config-files
Version: 9.2.0~ds1-1

Package: python3-numpy
Status: install ok installed
Version: 1:1.24.2-1+deb12u1

Package: python3-pandas
Status: install ok half-installed
Version: 1.5.3+dfsg-2

Package: coreutils
Status: install ok installed
Version: 9.1-1`

func TestParseDpkgStatus(t *testing.T) {
	got, err := parseDpkgStatus(strings.NewReader(dpkgStatus))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"python3": "3.11.2-1+b1", "nodejs": "18.19.0+dfsg-6~deb12u2",
		"python3-numpy": "1:1.24.2-1+deb12u1", "coreutils": "9.1-1",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v\nwant %v", got, want)
	}
}

func TestUpstreamVersion(t *testing.T) {
	for in, want := range map[string]string{
		"3.11.2-1+b1":            "3.11.2",
		"18.19.0+dfsg-6~deb12u2": "18.19.0",
		"9.2.0~ds1-1":            "9.2.0",
		"1:1.24.2-1+deb12u1":     "1.24.2",
		"1.5.3+dfsg-2":           "1.5.3",
		"23.0.1+dfsg-1":          "23.0.1",
		"6.17.0-1":               "6.17.0",
		"1.0":                    "1.0",
		"2:1.0-rc1-3":            "1.0-rc1",
	} {
		if got := upstreamVersion(in); got != want {
			t.Errorf("upstreamVersion(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestReadVersions(t *testing.T) {
	rootfs := t.TempDir()
	if err := os.MkdirAll(filepath.Join(rootfs, "var", "lib", "dpkg"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(rootfs, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "var", "lib", "dpkg", "status"), []byte(dpkgStatus), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "etc", "debian_version"), []byte("12.12\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := readVersions(rootfs)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"python": "3.11.2", "node": "18.19.0", "numpy": "1.24.2", "debian": "12.12"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if s := FormatVersions(got); s != "debian 12.12, node 18.19.0, numpy 1.24.2, python 3.11.2" {
		t.Errorf("FormatVersions = %q", s)
	}
	if _, err := readVersions(t.TempDir()); err == nil {
		t.Error("a rootfs without a package database has versions")
	}
}
